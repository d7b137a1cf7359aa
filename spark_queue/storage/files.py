"""Files of a queue table: where they go, how they are written (one set of Parquet writer
settings for every writer, task or driver), their Delta statistics, and their deletion.

Runs anywhere: executor tasks stage message files with these functions. They reach the
table through its :class:`~spark_queue.storage.location.Location` (pyarrow on local disk,
obstore on S3, Azure and GCS, delta-rs's object store where the options need it), never
through a Delta log.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from spark_queue.model.schema import FILE_SCHEMA, PARTITION, STATS_COLUMNS
from spark_queue.storage.location import Location
from spark_queue.storage.row_cache import hold_file, hold_rows

# Records: the partition values of the table's files (``record=<name>``).
MESSAGE, REMOVAL, QUEUE = "message", "removal", "queue"
SCHEDULED, LEASE, EXTRA, REDELIVERED = "scheduled", "lease", "extra", "redelivered"
STATE_RECORDS = (QUEUE, SCHEDULED, LEASE, EXTRA, REDELIVERED)
# Ids recorded for de-duplication: appended per commit, removed once out of the window.
SEEN = "seen"
RECORDS = (MESSAGE, REMOVAL, *STATE_RECORDS, SEEN)
COMPACTED = "compacted-"  # the tag of a file a compaction wrote (a name's part, no meaning)
ROW_GROUP_ROWS = 64 * 1024  # small enough that a head read skips most of a large file
ROW_GROUP_BYTES = 32 * 1024 * 1024  # of bodies: a reader holds one row group at a time
DICTIONARY_COLUMNS = ("queue", "outcome", "death_reason", "original_queue")
UPLOAD_SLICE_BYTES = 1024 * 1024  # see upload_file


@dataclass(frozen=True)
class StagedFile:
    """A Parquet file written under the table root, not yet in the Delta log."""

    path: str  # relative to the table root, as the log records it
    size: int
    record: str
    stats: str  # Delta statistics JSON
    rows: int


def file_stats(table: pa.Table) -> str:
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in STATS_COLUMNS:
        if name not in table.column_names:  # left out of the file: null in every row
            nulls[name] = table.num_rows
            continue
        column = table.column(name)
        nulls[name] = column.null_count
        if column.null_count < len(column):
            bounds = pc.min_max(column)
            mins[name] = bounds["min"].as_py()
            maxs[name] = bounds["max"].as_py()
    return json.dumps(
        {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    )


def row_group_rows(rows: pa.Table) -> int:
    """Rows per row group: ``ROW_GROUP_ROWS``, fewer where bodies are large."""
    if not rows.num_rows or "body" not in rows.column_names:
        return ROW_GROUP_ROWS
    per_row: int = max(1, rows.column("body").nbytes // rows.num_rows)
    return max(1, min(ROW_GROUP_ROWS, ROW_GROUP_BYTES // per_row))


def new_file(record: str, tag: str = "") -> str:
    """A new file's path relative to the table root, in partition ``record``: the only
    names spark-queue gives the files it writes, which :func:`is_own_file` recognises."""
    return f"{PARTITION}={record}/part-{tag}{uuid.uuid4().hex}.parquet"


_OWN_FILE = re.compile(
    rf"{PARTITION}=(?:{'|'.join(RECORDS)})/part-(?:{COMPACTED})?[0-9a-f]{{32}}\.parquet"
)


def is_own_file(relative: str) -> bool:
    """Whether ``relative`` (a path relative to the table root) is named as :func:`new_file`
    names a file spark-queue writes: in a folder of one of its records, ``part-``, a tag of
    its own, 32 hexadecimal digits. No other writer names files so (delta-rs and Spark write
    ``part-00000-<uuid>-c000...``), and whatever else spark-queue writes under the table
    root lies in its folders whose names begin with ``_`` (``_delta_log``, ``_spark_queue``),
    which a vacuum never lists."""
    return _OWN_FILE.fullmatch(relative) is not None


def prepare_target(fs: pafs.FileSystem, base: str, relative: str) -> str:
    """The full path of ``relative`` under ``base``, its folder created on a local disk
    (object stores have no folders: creating one would store marker objects)."""
    target = f"{base.rstrip('/')}/{relative}"
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
    return target


def parquet_options(columns: list[str]) -> dict[str, Any]:
    """The writer settings of every file of a queue table, for a file of ``columns``:
    dictionary encoding on the small repeated columns only (bodies dominate, and would
    only cost time), statistics on the columns Delta's file skipping uses."""
    return {
        "compression": "snappy",
        "use_dictionary": [name for name in DICTIONARY_COLUMNS if name in columns],
        "write_statistics": [name for name in STATS_COLUMNS if name in columns],
    }


def write_file(location: Location, record: str, rows: pa.Table, tag: str = "") -> StagedFile:
    """Write ``rows`` (:data:`FILE_SCHEMA`) as one Parquet file of partition ``record``."""
    if location.object_store() is not None:  # encoded in memory, stored in one request
        staged, data = encode_file(record, rows, tag)
        upload_file(location, staged.path, data)
        return staged
    rows = _file_rows(record, rows)
    relative = new_file(record, tag)
    fs, base = location.filesystem()
    with fs.open_output_stream(prepare_target(fs, base, relative)) as stream:
        _write_parquet(rows, stream)
        size = stream.tell()  # not a stat afterwards: on an object store, a request
    return StagedFile(relative, size, record, file_stats(rows), rows.num_rows)


# The columns of its rows a staged file carries to the commit, where it holds at most
# CARRIED_ROWS rows: what planning its enqueue reads (without a request for them).
CARRIED_COLUMNS = ("seq", "size", "priority", "deliver_at", "enqueued_at", "expires_at")
CARRIED_ROWS = 64 * 1024


@dataclass
class StagedQueueFile:
    """A message file staged for one queue; ``rows``: its :data:`CARRIED_COLUMNS` (and
    ``message_id``), where it is small."""

    queue: str
    file: StagedFile
    rows: pa.Table | None = None


class MessageFileWriter:
    """Message rows of any queues written as one file per queue, a row group at a time, so
    a writer holds one row group per queue in memory (a Spark task staging its partition
    of a write). The files are written as :func:`write_file` writes a message file."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self.fs, self.base = location.filesystem()
        self.buffers: dict[str, list[pa.Table]] = {}
        self.buffered: dict[str, int] = {}  # rows
        self.buffered_bytes: dict[str, int] = {}
        self.writers: dict[str, tuple[pq.ParquetWriter, pa.NativeFile, str]] = {}
        # Rows' columns carried to the commit (CARRIED_COLUMNS), or for a file of more rows
        # those of its statistics only.
        self.parts: dict[str, list[pa.Table]] = {}

    def add(self, rows: pa.Table) -> None:
        """Add message rows (as :data:`FILE_SCHEMA` types them), of one queue or several."""
        queues = rows.column("queue")
        names = pc.unique(queues).to_pylist()
        for name in names:
            part = rows if len(names) == 1 else rows.filter(pc.equal(queues, name))
            self.buffers.setdefault(name, []).append(part)
            self.buffered[name] = self.buffered.get(name, 0) + part.num_rows
            self.buffered_bytes[name] = self.buffered_bytes.get(name, 0) + part["body"].nbytes
            if self.buffered[name] >= ROW_GROUP_ROWS or self.buffered_bytes[name] >= (
                ROW_GROUP_BYTES
            ):
                self._flush(name)

    def _flush(self, name: str) -> None:
        # One row group: what was buffered, up to the bounds row_group_rows() applies.
        rows = pa.concat_tables(self.buffers.pop(name))
        self.buffered[name] = self.buffered_bytes[name] = 0
        if name not in self.writers:
            relative = new_file(MESSAGE)
            stream = open_output(self.location, relative)
            self.writers[name] = (_parquet_writer(stream, FILE_SCHEMA), stream, relative)
        self.writers[name][0].write_table(rows, row_group_size=ROW_GROUP_ROWS)
        kept = self.parts.setdefault(name, [])
        if sum(part.num_rows for part in kept) + rows.num_rows <= CARRIED_ROWS:
            kept.append(rows.select(["queue", *CARRIED_COLUMNS, "message_id"]))
        else:  # too many to carry: statistics only
            kept[:] = [part.select(["queue", "seq", "priority"]) for part in kept]
            kept.append(rows.select(["queue", "seq", "priority"]))

    def close(self) -> list[StagedQueueFile]:
        """Write what is buffered and close the files; what was staged, one file a queue."""
        for name in list(self.buffers):
            self._flush(name)
        files = []
        for name, (writer, stream, relative) in self.writers.items():
            writer.close()
            size = stream.tell()  # not a stat: on an object store, a request
            stream.close()
            small = pa.concat_tables(self.parts[name])
            staged = StagedFile(relative, size, MESSAGE, file_stats(small), small.num_rows)
            carried = small.drop_columns(["queue"]) if "size" in small.column_names else None
            files.append(StagedQueueFile(name, staged, carried))
        return files

    def discard(self) -> None:
        """Close and delete the files written so far."""
        for writer, stream, _ in self.writers.values():
            writer.close()
            stream.close()
        delete_files(self.location, [relative for _, _, relative in self.writers.values()])


def open_output(location: Location, relative: str) -> pa.NativeFile:
    """A stream writing the file at ``relative``: on object storage through obstore
    (:meth:`Location.object_store`: one request for a small file, a multipart upload for a
    large one, never a wait for ``100-continue``), else through the table's file system."""
    store = location.object_store()
    if store is None:
        fs, base = location.filesystem()
        return fs.open_output_stream(prepare_target(fs, base, relative))
    return pa.PythonFile(_StoreWriter(store, relative), mode="w")


class _StoreWriter:
    """obstore's writer of one object as the Python file pyarrow writes to."""

    def __init__(self, store: Any, relative: str) -> None:
        import obstore

        self._file = obstore.open_writer(store, relative)
        self._written = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")  # obstore takes unsigned bytes
        self._file.write(view)
        self._written += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        """Nothing: the writer sends what it holds when it has a part's worth, or closes."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._file.close()


def encode_file(record: str, rows: pa.Table, tag: str = "") -> tuple[StagedFile, pa.Buffer]:
    """``rows`` encoded as :func:`write_file` writes them, in memory: the file they make
    once :func:`upload_file` has stored the bytes (its size is known before then)."""
    stored = _file_rows(record, rows)
    sink = pa.BufferOutputStream()
    _write_parquet(stored, sink)
    data = sink.getvalue()
    staged = StagedFile(
        new_file(record, tag), data.size, record, file_stats(stored), stored.num_rows
    )
    if record == MESSAGE:  # compacted from here (:func:`~spark_queue.storage.row_cache.hold_rows`)
        hold_rows(staged.path, stored)
    return staged, data


def upload_file(location: Location, relative: str, data: pa.Buffer) -> None:
    """Store the bytes of a file :func:`encode_file` made at ``relative``; a message file's
    are kept for this process's reads (:func:`~spark_queue.storage.row_cache.hold_file`)."""
    fs, base = location.filesystem()
    if relative.startswith(f"{PARTITION}={MESSAGE}/"):  # a lease of it reads nothing
        hold_file(f"{base.rstrip('/')}/{relative}", data)
    store = location.object_store()
    if store is not None:
        import obstore

        # Arrow exposes its bytes as signed chars: viewed as unsigned, without a copy.
        obstore.put(store, relative, memoryview(data).cast("B"))
        return
    target = prepare_target(fs, base, relative)
    if not isinstance(fs, pafs.PyFileSystem):
        with fs.open_output_stream(target) as stream:
            stream.write(data)  # the buffer as it is, without a copy
        return
    # delta-rs's store (a PyFileSystem: where the options hold delta-rs's retry keys) takes
    # bytes, never the Arrow buffer a write hands it; slices smaller than the stream's
    # buffer are copied into that buffer, which reaches the store as bytes.
    with fs.open_output_stream(target, buffer_size=2 * UPLOAD_SLICE_BYTES) as stream:
        for start in range(0, data.size, UPLOAD_SLICE_BYTES):
            stream.write(data.slice(start, min(UPLOAD_SLICE_BYTES, data.size - start)))


def _file_rows(record: str, rows: pa.Table) -> pa.Table:
    """The columns a file of ``record`` stores, as the file's schema types them: those
    null in every row are left out, which Delta readers (delta-spark, delta-rs,
    :func:`~spark_queue.model.schema.file_columns`) read as nulls. Writing them would cost
    more than the rows themselves: a publish's message file sets 7 columns of 23 (for 32
    messages, 0.17 ms to encode where every column takes 0.41-0.44), an index or removal
    file a few."""
    if record == MESSAGE:
        if not rows.schema.equals(FILE_SCHEMA):  # as normalised: a cast would cost ~0.1 ms
            rows = rows.select(FILE_SCHEMA.names).cast(FILE_SCHEMA)
        count = rows.num_rows  # an empty file keeps its columns
        names, columns = rows.column_names, rows.columns  # not by name: ~1 us a lookup
        held = [n for n, column in zip(names, columns, strict=True) if column.null_count < count]
        return rows if not count or len(held) == len(names) else rows.select(held)
    names = set(rows.column_names)
    fields = [
        field_
        for field_ in FILE_SCHEMA
        if field_.name in names and rows.column(field_.name).null_count < rows.num_rows
    ]
    kept, schema = rows.select([field_.name for field_ in fields]), pa.schema(fields)
    # Rows typed as the file's already (record_rows makes them so): no cast, which costs
    # as much as one that converts.
    return kept if kept.schema.equals(schema) else kept.cast(schema)


def _parquet_writer(sink: Any, schema: pa.Schema) -> pq.ParquetWriter:
    """The Parquet writer of every file of a queue table (:func:`parquet_options`)."""
    return pq.ParquetWriter(sink, schema, **parquet_options(schema.names))


def _write_parquet(rows: pa.Table, sink: Any) -> None:
    with _parquet_writer(sink, rows.schema) as writer:
        writer.write_table(rows, row_group_size=row_group_rows(rows))


def delete_files(location: Location, relatives: list[str]) -> None:
    location.delete(relatives)


def record_rows(columns: dict[str, Any]) -> pa.Table:
    """Rows of a record other than ``message``: only ``columns`` (all of one length), typed
    as in :data:`FILE_SCHEMA`; :func:`write_file` leaves the other columns out."""
    arrays = {}
    for name, value in columns.items():
        kind = FILE_SCHEMA.field(name).type
        if isinstance(value, pa.ChunkedArray):
            value = value.combine_chunks()
        if not isinstance(value, pa.Array):
            value = pa.array(value, kind)
        # A cast to the type an array has already costs as much as one that converts.
        arrays[name] = value if value.type == kind else value.cast(kind)
    return pa.table(arrays)


def empty_rows(columns: dict[str, Any], count: int) -> pa.Table:
    """A :data:`FILE_SCHEMA` table of ``count`` rows, nulls except ``columns``."""
    given = record_rows(columns)
    return pa.Table.from_arrays(
        [
            given.column(field_.name) if field_.name in columns else pa.nulls(count, field_.type)
            for field_ in FILE_SCHEMA
        ],
        schema=FILE_SCHEMA,
    )
