"""A queue table's Delta log entries, written and read by spark-queue itself.

A commit of version N is the creation of ``_delta_log/N.json`` if it is absent, through
``obstore`` (the Python binding of the ``object_store`` crate that delta-rs commits with) on
object storage: on S3 and Azure a ``PUT`` with ``If-None-Match: *``, on GCS one with
``x-goog-if-generation-match: 0``; on a local disk a hard link of a fully written temporary
file to the entry's name, which fails where the name exists (what delta-rs does there
too). Of two writers of one version, one creates the entry and the other is refused,
whichever library each uses. The entry holds the actions delta-rs writes for the same commit
(``commitInfo``, ``add`` with statistics and partition values, ``remove``, ``txn``), so
delta-rs and delta-spark read the table as before; delta-rs still creates tables, writes
checkpoints and vacuums.

Where the storage options hold keys only delta-rs understands (its retry settings, an AWS
profile; :func:`~spark_queue.storage.location.obstore_arguments`), entries are read through
the table's file system and commits go through delta-rs
(:meth:`spark_queue.storage.store.QueueStore.commit`).
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from spark_queue.model.schema import PARTITION
from spark_queue.storage.files import StagedFile
from spark_queue.storage.location import Location

LOG_FOLDER = "_delta_log"
ENGINE = "spark-queue"
READ_AHEAD = 16
"""The most log entries one catch-up reads at once (:meth:`EntryStore.read_run`)."""

# Runs of entries read at once, on a store where each read is a round trip.
_RUNS = ThreadPoolExecutor(max_workers=READ_AHEAD, thread_name_prefix="spark-queue-entries")


@dataclass
class EntryActions:
    """What one log entry does to the table's files and application transactions.
    ``rebuilds``: it changes what only delta-rs reads (metadata, protocol, an action this
    module does not know), so a reader loads the table afresh through delta-rs."""

    adds: list[StagedFile] = field(default_factory=list)
    modified: list[int] = field(default_factory=list)  # of each add, milliseconds
    removes: set[str] = field(default_factory=set)
    transactions: dict[str, int] = field(default_factory=dict)
    rebuilds: bool = False


def encode_entry(
    adds: Iterable[StagedFile],
    removes: Iterable[tuple[str, int, str]],
    transactions: Mapping[str, int],
    summary: str,
    summary_key: str,
    stamp: int,
) -> bytes:
    """A log entry (newline-delimited JSON actions) as delta-rs writes an append of
    ``adds`` that removes ``removes`` (path, size, record) with the application
    transactions ``transactions`` (id -> version), at ``stamp`` (epoch milliseconds).
    ``summary`` is recorded in the commitInfo under ``summary_key``."""
    lines = [
        {
            "commitInfo": {
                "timestamp": stamp,
                "operation": "WRITE",
                "operationParameters": {"mode": "Append", "partitionBy": f'["{PARTITION}"]'},
                "engineInfo": ENGINE,
                "clientVersion": ENGINE,
                "txnId": uuid.uuid4().hex,  # makes every entry unique (see QueueStore.commit)
                summary_key: summary,
            }
        }
    ]
    lines += [
        {
            "add": {
                "path": _encoded(f.path),
                "partitionValues": {PARTITION: f.record},
                "size": f.size,
                "modificationTime": stamp,
                "dataChange": True,
                "stats": f.stats,
            }
        }
        for f in adds
    ]
    lines += [
        {
            "remove": {
                "path": _encoded(path),
                "dataChange": True,
                "deletionTimestamp": stamp,
                "extendedFileMetadata": True,
                "partitionValues": {PARTITION: record},
                "size": size,
            }
        }
        for path, size, record in removes
    ]
    lines += [
        {"txn": {"appId": app_id, "version": version, "lastUpdated": stamp}}
        for app_id, version in sorted(transactions.items())
    ]
    return "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()


def _encoded(path: str) -> str:
    """A file's path as the log records it: a relative URI (delta-rs encodes the same)."""
    return urllib.parse.quote(path, safe="/=")


def parse_actions(text: str) -> EntryActions:
    """The actions of a log entry (:class:`EntryActions`)."""
    found = EntryActions()
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "add" in action:
            add = action["add"]
            if add.get("deletionVector"):
                found.rebuilds = True
                continue
            stats = add.get("stats") or "{}"
            found.adds.append(
                StagedFile(
                    urllib.parse.unquote(add["path"]),
                    int(add["size"]),
                    (add.get("partitionValues") or {}).get(PARTITION) or "",
                    stats,
                    int(json.loads(stats).get("numRecords", 0)),
                )
            )
            found.modified.append(int(add.get("modificationTime") or 0))
        elif "remove" in action:
            found.removes.add(urllib.parse.unquote(action["remove"]["path"]))
        elif "txn" in action:
            txn = action["txn"]
            found.transactions[txn["appId"]] = int(txn["version"])
        elif "commitInfo" not in action:
            found.rebuilds = True  # metaData, protocol, cdc, domainMetadata, ...
    return found


class EntryStore:
    """The log folder of one table: creates entries if absent (where :attr:`creates`),
    reads and deletes them."""

    creates = True
    # Whether each request is a round trip (an object store), where a caller that can go on
    # meanwhile sends it from another thread; a local disk answers a small write in
    # microseconds, less than handing it to a thread and back.
    remote = True

    def create(self, version: int, data: bytes) -> bool:
        """Create ``version``'s entry with ``data``; False where it exists (nothing
        written). Raises ``OSError`` where the store fails."""
        raise NotImplementedError

    def read(self, version: int) -> bytes | None:
        """``version``'s entry, or None where it is not there (one request)."""
        raise NotImplementedError

    def exists(self, version: int) -> bool:
        """Whether ``version``'s entry is there (one request). Raises ``OSError`` where
        the store cannot say."""
        raise NotImplementedError

    def read_run(self, first: int, count: int) -> list[bytes | None]:
        """The entries from ``first`` on, ``count`` of them, each None where it is not
        there: read at once where each read is a round trip (a view far behind catches up
        in a few requests in a row rather than one an entry), else one after the other,
        up to the first missing one."""
        versions = range(first, first + count)
        if self.remote and count > 1:
            return [read.result() for read in [_RUNS.submit(self.read, v) for v in versions]]
        found: list[bytes | None] = []
        for version in versions:
            found.append(self.read(version))
            if found[-1] is None:
                break
        return found

    def delete(self, version: int) -> None:
        raise NotImplementedError


def entry_name(version: int) -> str:
    return f"{LOG_FOLDER}/{version:020d}.json"


class LocalEntries(EntryStore):
    """Entries on a local (or shared) disk."""

    remote = False

    def __init__(self, root: str) -> None:
        self.folder = os.path.join(root, LOG_FOLDER)

    def _path(self, version: int) -> str:
        return os.path.join(self.folder, f"{version:020d}.json")

    def create(self, version: int, data: bytes) -> bool:
        # Written whole under a name no reader takes for an entry (delta-rs's own
        # temporary commits are named alike), then linked: a reader sees all or nothing.
        staged = os.path.join(self.folder, f"_commit_{uuid.uuid4().hex}.json.tmp")
        with open(staged, "xb") as file:
            file.write(data)
        try:
            os.link(staged, self._path(version))
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)
        return True

    def read(self, version: int) -> bytes | None:
        try:
            with open(self._path(version), "rb") as file:
                return file.read()
        except FileNotFoundError:
            return None

    def exists(self, version: int) -> bool:
        try:
            os.stat(self._path(version))
        except FileNotFoundError:
            return False
        return True

    def delete(self, version: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(version))


class ObjectEntries(EntryStore):
    """Entries on an object store, through obstore."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def create(self, version: int, data: bytes) -> bool:
        import obstore
        from obstore.exceptions import AlreadyExistsError, BaseError

        try:
            obstore.put(self.store, entry_name(version), data, mode="create")
        except AlreadyExistsError:
            return False
        except BaseError as error:  # as other storage failures: an OSError
            raise OSError(str(error)) from None
        return True

    def read(self, version: int) -> bytes | None:
        import obstore
        from obstore.exceptions import BaseError

        try:
            return bytes(obstore.get(self.store, entry_name(version)).bytes())
        except FileNotFoundError:
            return None
        except BaseError as error:
            raise OSError(str(error)) from None

    def exists(self, version: int) -> bool:
        import obstore
        from obstore.exceptions import BaseError

        try:
            obstore.head(self.store, entry_name(version))
        except FileNotFoundError:
            return False
        except BaseError as error:
            raise OSError(str(error)) from None
        return True

    def delete(self, version: int) -> None:
        import obstore

        with contextlib.suppress(FileNotFoundError):
            obstore.delete(self.store, entry_name(version))


class FileEntries(EntryStore):
    """Entries read through the table's file system (pyarrow's, or delta-rs's store);
    commits go through delta-rs."""

    creates = False

    def __init__(self, location: Location) -> None:
        self.location = location

    def _path(self, version: int) -> str:
        return f"{self.location.filesystem()[1].rstrip('/')}/{entry_name(version)}"

    def read(self, version: int) -> bytes | None:
        try:
            with self.location.filesystem()[0].open_input_stream(self._path(version)) as stream:
                data: bytes = stream.read()
        except FileNotFoundError:
            return None
        return data

    def exists(self, version: int) -> bool:
        try:
            self.location.filesystem()[0].open_input_stream(self._path(version)).close()
        except FileNotFoundError:
            return False
        return True

    def delete(self, version: int) -> None:
        self.location.delete([entry_name(version)])


def entry_store(location: Location) -> EntryStore:
    """The log folder of the table at ``location`` (see the module)."""
    if not location.scheme or location.scheme == "file":
        root = location.uri.removeprefix("file://") if location.scheme else location.uri
        return LocalEntries(root)
    store = location.object_store()
    return FileEntries(location) if store is None else ObjectEntries(store)
