"""A log checkpoint of a table on object storage, written by delta-rs from a copy of the log.

delta-rs's ``create_checkpoint`` reads the log from the store once more whatever table it
is given: the entries since the last checkpoint twice, and the last checkpoint in a dozen
ranged ``GET``s, one after the other; the table it is given was itself moved on by reading
those entries. On object storage that is ~3 ``GET``s a commit of the table's upkeep, in a
burst every checkpoint interval, served by the same store as the commits. Here each of
those files is read once, at once: the last checkpoint (where ``_last_checkpoint`` names a
single-file one) and the entries after it, into a folder on the local disk, where delta-rs
writes the checkpoint; the checkpoint file, then ``_last_checkpoint``, are stored as
delta-rs stores them. The checkpoint is delta-rs's own, removals kept and all.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from spark_queue.storage.delta_log import LOG_FOLDER, ObjectEntries, entry_name, entry_store
from spark_queue.storage.location import Location

LAST_CHECKPOINT = f"{LOG_FOLDER}/_last_checkpoint"


def checkpoint_name(version: int) -> str:
    return f"{LOG_FOLDER}/{version:020d}.checkpoint.parquet"


def checkpoint_from_copy(location: Location, version: int) -> dict[str, str] | None:
    """Write the checkpoint of ``version`` from a local copy of the log it is built on;
    returns the table's configuration at ``version``. None, with nothing written, where
    the table is not on an object store spark-queue reads itself, where the last
    checkpoint is not one file of a version at or below ``version`` (delta-spark's
    multi-part and V2 checkpoints), or where an entry after it is missing: the caller
    lets delta-rs read the store then."""
    entries = entry_store(location)
    if not isinstance(entries, ObjectEntries):
        return None
    import obstore
    from deltalake import DeltaTable

    store: Any = entries.store
    try:
        last = json.loads(bytes(obstore.get(store, LAST_CHECKPOINT).bytes()))
    except FileNotFoundError:
        last = None
    if last is not None and (
        not isinstance(last.get("version"), int)
        or last["version"] > version
        or last.get("parts")
        or "v2Checkpoint" in last
    ):
        return None
    start = -1 if last is None else last["version"]
    found = entries.read_run(start + 1, version - start)
    if len(found) != version - start or any(data is None for data in found):
        return None
    with tempfile.TemporaryDirectory(prefix="spark-queue-checkpoint-") as folder:
        log = Path(folder, LOG_FOLDER)
        log.mkdir()
        if last is not None:
            base = checkpoint_name(start)
            Path(folder, base).write_bytes(bytes(obstore.get(store, base).bytes()))
            Path(folder, LAST_CHECKPOINT).write_text(json.dumps(last))
        for number, data in enumerate(found, start + 1):
            Path(folder, entry_name(number)).write_bytes(data or b"")
        table = DeltaTable(folder, version=version)
        table.create_checkpoint()
        written = checkpoint_name(version)
        obstore.put(store, written, Path(folder, written).read_bytes())
        obstore.put(store, LAST_CHECKPOINT, Path(folder, LAST_CHECKPOINT).read_bytes())
        return dict(table.metadata().configuration)
