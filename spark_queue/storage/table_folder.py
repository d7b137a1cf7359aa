"""Which folder may become a queue table: an empty or new one, never one inside another
Delta table. spark-queue deletes what it wrote in its table's folder (``vacuum``), so the
folder it takes for a new table must hold nothing of anyone else's.

- **Empty** means: nothing but hidden files (names beginning with ``.``, as ``.DS_Store``
  or ``.gitkeep``: desktop and version-control litter, which ``vacuum`` never deletes),
  spark-queue's own folders (``_spark_queue``: a broker's record; ``_spark_queue_probe``:
  ``check-storage``'s scratch table) and a ``_delta_log`` without a table in it (a table
  another writer is creating this moment). A hidden folder (``.git``) is someone's content.
- **Inside a Delta table** means: a folder above it, up to the filesystem's root or the
  bucket's, holds a ``_delta_log``: a queue table in ``record=queue/`` of another, or in any
  folder of any Delta table, would be that table's files to its own vacuum. A queue table's
  own partition tables (:func:`~spark_queue.model.partitions.partition_path`) are the
  exception: they are in its hidden folder ``_partitions``, which Delta's vacuums skip.

On an object store a folder is a prefix: it is empty where no object's key starts with it.
A look costs one listing of the folder and one existence check per folder above it, made
only where no table exists yet.
"""

from __future__ import annotations

import pyarrow.fs as pafs

from spark_queue.errors import StorageError
from spark_queue.model.partitions import is_partition_path
from spark_queue.storage.location import Location

LOG_FOLDER = "_delta_log"
# What an empty folder may hold (see the module's docstring).
OWN_FOLDERS = frozenset({LOG_FOLDER, "_spark_queue", "_spark_queue_probe"})
SHOWN_ENTRIES = 5  # entries a refusal names


def new_table_refusal(location: Location) -> str | None:
    """Why no queue table may be created at ``location`` (one line naming the folder and
    what it holds, or the table it is inside), or None where one may: the folder is new
    or empty and inside no Delta table.

    Raises:
        StorageError: the store cannot be listed.
    """
    try:
        return _refusal(location)
    except OSError as error:
        raise StorageError(location.unreachable(error)) from None


def _refusal(location: Location) -> str | None:
    fs, base = location.filesystem()
    for path, uri in location.parents():
        if _exists(fs, f"{path}/{LOG_FOLDER}" if path else LOG_FOLDER):
            if is_partition_path(location.uri[len(uri) :]):
                break  # a partition table of the queue table at ``uri``
            return (
                f"path {location.uri} is inside the Delta table at {uri}: give a folder "
                f"outside every Delta table"
            )
    if isinstance(fs, pafs.LocalFileSystem):  # an object store's prefix is listed as it is
        kind = fs.get_file_info(base).type
        if kind == pafs.FileType.File:
            return f"path {location.uri} is a file, not a folder: give an empty or new folder"
        if kind == pafs.FileType.NotFound:
            return None
    held = sorted(
        f"{entry.base_name}/" if entry.type == pafs.FileType.Directory else entry.base_name
        for entry in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        if not _allowed(entry)
    )
    if not held:
        return None
    shown = ", ".join(held[:SHOWN_ENTRIES])
    more = f" and {len(held) - SHOWN_ENTRIES} more" if len(held) > SHOWN_ENTRIES else ""
    return (
        f"path {location.uri} is not empty and is not a queue table (it holds {shown}{more}): "
        f"give an empty or new folder"
    )


def _allowed(entry: pafs.FileInfo) -> bool:
    """Whether an empty folder may hold ``entry`` (see the module's docstring)."""
    name: str = entry.base_name
    if entry.type == pafs.FileType.Directory:
        return name in OWN_FOLDERS
    return name.startswith(".")


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    """Whether a file or folder is at ``path``. On an object store, a folder is a prefix
    some key starts with, which a listing finds and a lookup of the key may not."""
    if isinstance(fs, pafs.LocalFileSystem):
        return bool(fs.get_file_info(path).type != pafs.FileType.NotFound)
    return bool(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))
