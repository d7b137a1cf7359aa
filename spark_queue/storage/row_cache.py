"""Footers and decoded row groups of a queue table's data files, kept for the next read.

A data file of a queue table never changes once written: every file gets a name of its own
(:func:`spark_queue.storage.files.new_file`), and compaction or a rewrite writes new files. So what
was read of a file stays true for as long as any snapshot lists it, and a process that
reads the same file again (a lease after a lease, a broker serving many consumers, the
consumer's idle checks) can keep it instead of reading and decoding it again: on a local
disk that is decoding time, on an object store a request or two per read.

A fourth holds the rows of the message files this process wrote, for compaction. A third
cache holds the bytes of small files whole: those this process wrote (a publish's
message file, so that a lease of it reads nothing) and those read whole in one request
(:meth:`spark_queue.storage.store.QueueStore.read_rows`), from which a footer and row groups
are decoded without another request.

The caches are per process, shared by every :class:`~spark_queue.storage.store.QueueStore`
and thread, bounded (footers by count, row groups and files by bytes), and least recently
used first out. A file that is deleted (vacuum, a discarded attempt) is no longer listed by any
snapshot, so its entries are never asked for again and simply age out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from spark_queue.model.schema import file_columns

FOOTERS = 4096  # footers kept, at most (a few KB each)
ROW_GROUP_BYTES = 128 * 1024 * 1024  # decoded row groups kept, at most (Arrow buffers)
WHOLE_FILE_BYTES = 64 * 1024 * 1024  # bytes of whole files kept, at most
WRITTEN_ROWS_BYTES = 32 * 1024 * 1024  # rows of message files written, kept, at most
V = TypeVar("V")
T = TypeVar("T")


class LeastRecentlyUsed(Generic[V]):
    """A thread-safe map that drops its least recently used entries once their weights
    (given with each, 1 by default) add up to more than ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: V, weight: int = 1) -> None:
        if weight > self.capacity:
            return  # would push out everything else and still not fit
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._held -= old[1]
            self._entries[key] = (value, weight)
            self._held += weight
            while self._held > self.capacity:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._held -= dropped

    @property
    def held(self) -> int:
        """The total weight held."""
        with self._lock:
            return self._held

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0


_FOOTERS: LeastRecentlyUsed[pq.FileMetaData] = LeastRecentlyUsed(FOOTERS)
_ROW_GROUPS: LeastRecentlyUsed[Any] = LeastRecentlyUsed(ROW_GROUP_BYTES)
_WHOLE_FILES: LeastRecentlyUsed[pa.Buffer] = LeastRecentlyUsed(WHOLE_FILE_BYTES)
_WRITTEN_ROWS: LeastRecentlyUsed[pa.Table] = LeastRecentlyUsed(WRITTEN_ROWS_BYTES)


def hold_file(uri: str, data: pa.Buffer) -> None:
    """Keep the bytes of the whole file at ``uri`` (written or read by this process)."""
    _WHOLE_FILES.put(uri, data, data.size)


def held_file(uri: str) -> pa.Buffer | None:
    """The bytes of the file at ``uri`` where they are kept."""
    return _WHOLE_FILES.get(uri)


def hold_rows(relative: str, rows: pa.Table) -> None:
    """Keep the rows of the message file this process encoded at ``relative`` (a name no
    other file has), as the file stores them: compaction takes them as they are, where
    decoding a small file and filling in its schema costs ~1.5 ms."""
    _WRITTEN_ROWS.put(relative, rows, rows.nbytes)


def held_rows(relative: str) -> pa.Table | None:
    """The rows of the message file at ``relative`` where they are kept, as the file
    stores them (without the columns it leaves out)."""
    return _WRITTEN_ROWS.get(relative)


class DataFile:
    """One data file of a table, read through the caches. ``uri`` is its full path on
    ``fs``; nothing is read until asked for. ``whole``: reads the whole file in one
    request, for a file small enough that this costs less than reading its footer and
    then its row groups."""

    def __init__(
        self, fs: pafs.FileSystem, uri: str, whole: Callable[[], pa.Buffer] | None = None
    ) -> None:
        self.fs = fs
        self.uri = uri
        self.whole = whole
        self._opened: dict[tuple[str, ...], pq.ParquetFile] = {}

    @property
    def metadata(self) -> pq.FileMetaData:
        """The file's footer (its schema, row groups and their statistics)."""
        footer = _FOOTERS.get(self.uri)
        if footer is None:
            footer = self._open().metadata
            _FOOTERS.put(self.uri, footer)
        return footer

    def row_group(self, index: int, columns: Sequence[str]) -> pa.Table:
        """Row group ``index``'s ``columns``, decoded (as :meth:`read`); kept."""
        return self.derived(index, tuple(columns), lambda: self._decoded(index, columns))

    def derived(self, index: int, name: Hashable, make: Callable[[], tuple[T, int]]) -> T:
        """What ``make`` derives from row group ``index`` (kept under ``name``): it returns
        the value and the bytes it holds."""
        key = (self.uri, index, name)
        value = _ROW_GROUPS.get(key)
        if value is None:
            value, weight = make()
            _ROW_GROUPS.put(key, value, weight)
        return value

    def read(
        self, index: int, columns: Sequence[str], read_dictionary: Sequence[str] = ()
    ) -> pa.Table:
        """Row group ``index``'s ``columns``, decoded (those the file leaves out as nulls:
        :func:`~spark_queue.model.schema.file_columns`); not kept."""
        opened = self._open(read_dictionary)
        held = set(opened.schema_arrow.names)
        rows = opened.read_row_group(index, columns=[name for name in columns if name in held])
        return rows if rows.num_columns == len(columns) else file_columns(rows, columns)

    def _decoded(self, index: int, columns: Sequence[str]) -> tuple[pa.Table, int]:
        rows = self.read(index, columns)
        return rows, rows.nbytes

    def _open(self, read_dictionary: Sequence[str] = ()) -> pq.ParquetFile:
        key = tuple(read_dictionary)
        opened = self._opened.get(key)
        if opened is None:
            data = _WHOLE_FILES.get(self.uri)
            if data is None and self.whole is not None:
                data = self.whole()
                hold_file(self.uri, data)
            opened = self._opened[key] = pq.ParquetFile(
                self.uri if data is None else pa.BufferReader(data),
                filesystem=self.fs if data is None else None,
                metadata=_FOOTERS.get(self.uri),  # a known footer is not read again
                read_dictionary=list(read_dictionary) or None,
                pre_buffer=True,  # a row group's column chunks in one coalesced read (S3)
            )
        return opened


def clear() -> None:
    """Forget every footer, row group and file (tests; a process that wants its memory back)."""
    _FOOTERS.clear()
    _ROW_GROUPS.clear()
    _WHOLE_FILES.clear()
