"""The queue table on storage (:class:`QueueStore`): opening and creating it, its
snapshots (files and queue states, with a cache of states already read), reads of message
rows (the head of a level, leased ranges, filters), and the Delta commit.

Every write to the log goes through delta-rs (``deltalake``); the files a commit publishes
are written by :mod:`spark_queue.storage.files` (tasks stage message files, the driver writes
removals, dead letters and state) and the state's indexes are encoded by
:mod:`spark_queue.storage.state_rows`. Nothing here knows queue rules: that is
:mod:`spark_queue.rules`.
Runs on the driver side only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from spark_queue.errors import (
    CommitUnknownError,
    NotAQueueTableError,
    QueueNotFoundError,
    StorageError,
    UnsupportedFormatError,
)
from spark_queue.model.schema import (
    FILE_SCHEMA,
    FORMAT_DESCRIPTION,
    PARTITION,
    TABLE_CONFIGURATION,
    TABLE_SCHEMA,
    file_columns,
)
from spark_queue.rules import QueueState
from spark_queue.storage.commit_log import (
    EMPTY_SUMMARY,
    SUMMARY_KEY,
    CommitSummary,
    LogEntry,
    parse_log_entry,
)
from spark_queue.storage.delta_log import (
    READ_AHEAD,
    EntryStore,
    encode_entry,
    entry_store,
    parse_actions,
)
from spark_queue.storage.files import MESSAGE, QUEUE, SEEN, StagedFile
from spark_queue.storage.location import Location
from spark_queue.storage.message_files import (
    FIRST_HEAD_SLICE,
    FileHeadReader,
    MessageFiles,
    level_rows,
    only,
)
from spark_queue.storage.row_cache import DataFile, held_file
from spark_queue.storage.state_rows import states_of
from spark_queue.storage.table_folder import new_table_refusal
from spark_queue.storage.table_view import (
    TRUSTED_SECONDS,
    KnownTable,
    PreparedCommit,
    TableView,
    flatten_files,
    known_table,
)

if TYPE_CHECKING:  # deltalake is imported where a table is opened
    from deltalake import DeltaTable

# Files up to this size are read whole, in one request (QueueStore.read_rows): fetching
# columns not wanted costs less than a request more, on any object store, below it.
WHOLE_READ_BYTES = 1024 * 1024
# delta-rs's refusal of a commit from a table whose version's log entry is gone (1.6.6:
# ``Invalid table version: N``; it writes nothing): see QueueStore.commit.
PASSED_VERSION_ERROR = "Invalid table version"
# State files read together: on an object store each is a round trip, which the others need
# not wait for.
_READS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="spark-queue-reads")


def now_micros() -> int:
    return time.time_ns() // 1000


def require_queue(states: dict[str, QueueState], queue: str, table: str) -> QueueState:
    """``queue``'s state; raises :class:`QueueNotFoundError` naming the table's queues."""
    state = states.get(queue)
    if state is None:
        raise QueueNotFoundError(queue, table, states)
    return state


@dataclass
class Snapshot:
    """One version of a queue table: its files and its queues' states, from ``view``
    (its application transactions and configuration too)."""

    view: TableView
    files: pa.Table  # flattened add actions (table_view.FILE_COLUMNS)
    states: dict[str, QueueState]
    state_files: list[tuple[str, int, str]] = field(default_factory=list)  # path, size, record
    _messages: MessageFiles | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def version(self) -> int:
        return self.view.version

    @property
    def configuration(self) -> Mapping[str, str]:
        """The table's configuration (its properties)."""
        return self.view.configuration

    def transaction_version(self, app_id: str) -> int | None:
        """The last version of application transaction ``app_id`` here, or None."""
        return self.view.transaction_version(app_id)

    def message_files(
        self, queue: str, *, priority: int | None = None, from_seq: int = 0
    ) -> pa.Table:
        """Message files that may hold ``queue`` rows (of ``priority``) at or after a seq,
        by ``min_seq``. A file without statistics may hold anything."""
        if self._messages is None:  # every lease and ack asks: prepared once per version
            shared = self.files is self.view.files
            found = self.view.cache.get("messages") if shared else None
            if found is None:
                files = self.files.filter(pc.equal(self.files["record"], MESSAGE))
                found = MessageFiles.of(files.sort_by("min_seq"))
                if shared:
                    self.view.cache["messages"] = found
            self._messages = found
        return self._messages.holding(queue, priority, from_seq)

    def seen_files(self, queue: str) -> pa.Table:
        """``queue``'s files of recorded ids (de-duplication), oldest first."""
        files = self.files.filter(pc.equal(self.files["record"], SEEN))
        files = files.filter(pc.fill_null(pc.equal(files["min_queue"], queue), False))
        return files.sort_by("modified")


class QueueStore:
    """A queue table at ``path``: opening, reading state, reading heads, committing.

    ``storage_options`` reach an object store (:mod:`spark_queue.storage.location`); None: the
    environment's."""

    def __init__(
        self,
        path: str | os.PathLike[str] | Location,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.location = path if isinstance(path, Location) else Location.of(path, storage_options)
        self.uri = self.location.uri
        # The DeltaTable this thread last opened (:meth:`open`, :meth:`table_at`: history,
        # checkpoints, filters), brought up to date incrementally by the next open.
        # Per thread, so that another thread's open never moves a table in use.
        self._opened = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        # Tasks read files, never states; DeltaTables and thread-locals do not pickle.
        return {**self.__dict__, "_opened": None, "_entries": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _opened=threading.local())

    @property
    def known(self) -> KnownTable:
        """What this process knows of the table (shared by its stores)."""
        return known_table(self.location)

    @property
    def entries(self) -> EntryStore:
        """The table's log entries, as spark-queue writes and reads them."""
        found: EntryStore | None = self.__dict__.get("_entries")
        if found is None:
            found = self.__dict__["_entries"] = entry_store(self.location)
        return found

    @property
    def fs(self) -> pafs.FileSystem:
        return self.location.filesystem()[0]

    @property
    def base(self) -> str:
        """The table root's path on :attr:`fs`."""
        return self.location.filesystem()[1]

    def log_entry(self, version: int) -> str:
        """The path on :attr:`fs` of the Delta log entry (commit file) of ``version``."""
        return f"{self.base.rstrip('/')}/_delta_log/{version:020d}.json"

    def remember_states(self, paths: list[str], states: dict[str, QueueState]) -> None:
        """The states just committed in the state files at ``paths``."""
        self.known.remember_states(frozenset(paths), {n: s.copy() for n, s in states.items()})

    # -- the view of the table -------------------------------------------------------------

    def view(self, *, probe: bool = True) -> TableView | None:
        """The table as this process knows it (:mod:`~spark_queue.storage.table_view`), or
        None where there is no table. ``probe``: brought to the present first, reading the
        log entries other writers added since (one request where there are none). Else as
        known, for a commit, whose conditional create finds out, where it was known to be
        the latest within :data:`TRUSTED_SECONDS`; brought to the present where not (a
        commit never lands where log cleanup has been)."""
        view = self.known.view
        if view is None:
            return self._load()
        if probe or not view.trusted(time.monotonic()):
            return self._reach_present(view)
        return view

    def _load(self) -> TableView | None:
        """The table's latest version through delta-rs (the newest checkpoint and the log
        entries since), kept as this process's view; None where there is no table."""
        from deltalake.exceptions import TableNotFoundError

        started = time.monotonic()  # delta-rs lists the log: nothing newer was written before
        try:
            table = self.location.delta_table()
        except TableNotFoundError:
            return None
        self._check_format(table)
        return self.known.offer(TableView.of(table, started))

    @contextlib.contextmanager
    def storage_errors(self) -> Iterator[None]:
        """Where the log's store fails: a :class:`StorageError` naming the table, its
        endpoint and option keys (never their values)."""
        try:
            yield
        except FileNotFoundError:
            raise
        except OSError as error:
            raise StorageError(self.location.unreachable(error)) from None

    def _reach_present(self, view: TableView) -> TableView:
        """``view`` moved on by the log entries written after it, up to the missing one.

        Where that entry is missing later than :data:`TRUSTED_SECONDS` after the view was
        last known current, log cleanup may have deleted it: the view's own entry is
        checked too, and where it is gone as well, the table is loaded afresh."""
        with self.storage_errors():
            return self._read_on(view)

    def _read_on(self, view: TableView) -> TableView:
        """:meth:`_reach_present`, its errors as the store gives them."""
        moved, asked = self._entries_after(view)
        if moved is None:
            return self._load() or view
        if not moved.trusted(time.monotonic()) and not self.entries.exists(moved.version):
            self.known.forget()
            return self._load() or moved
        return self.known.offer(moved.current_from(asked))

    def _entries_after(self, view: TableView) -> tuple[TableView | None, float]:
        """``view`` moved on by the log entries written after it, up to the first missing
        one, and when the missing one was asked for; None where an entry changes what only
        delta-rs reads, or cannot follow the view (load the table afresh). The entries are
        read one, one, then runs of twice as many at once (:data:`READ_AHEAD` at most): an
        entry or two since cost what they did one at a time, a view many entries behind (a
        partition a client comes back to) a few requests in a row."""
        run, after = 1, 1
        while True:
            asked = time.monotonic()
            for data in self.entries.read_run(view.version + 1, run):
                if data is None:
                    return view, asked
                actions = parse_actions(data.decode("utf-8"))
                if actions.rebuilds or not view.precedes(actions.adds, actions.removes):
                    return None, asked
                view = view.moved_by(actions)
            run, after = after, min(2 * after, READ_AHEAD)

    def is_current(self, snapshot: Snapshot) -> bool:
        """Whether ``snapshot`` is of the table's latest version (reading the entries
        written since, where not)."""
        view = self.view()
        return view is None or view.version == snapshot.version

    # -- the Delta table -------------------------------------------------------------------

    def open(self, *, moved: bool | None = None) -> DeltaTable | None:
        """The DeltaTable at its latest version, or None where no table exists yet.

        The table this thread opened before is kept where :meth:`is_latest` says no newer
        version exists: two probes of log entries (a local disk: two system calls; S3: two
        HEADs) cost far less than delta-rs's update, which lists the log folder (~3.5 ms
        locally with nothing new). Where there is a newer one, where log cleanup has passed
        the table's version (a table left idle while other writers committed), or where the
        caller knows there is one (``moved=True``: it has just committed), the table is
        updated with the commits since (its own included): delta-rs starts again from the
        newest checkpoint where the entries after the table's version are gone, and the
        table is opened afresh where even that fails. ``moved=False``: the caller brought
        the table up to date a moment ago, so it is kept without a probe. A commit planned
        on a table that is not the latest fails all the same where another writer has
        just committed (:meth:`commit`).
        """
        from deltalake.exceptions import DeltaError, TableNotFoundError

        table: DeltaTable | None = getattr(self._opened, "table", None)
        if table is not None:
            if moved is False or (moved is None and self.is_latest(table.version())):
                return table
            try:
                table.update_incremental()
                return table
            except DeltaError:
                self._opened.table = None
        try:
            table = self.location.delta_table()
        except TableNotFoundError:
            return None
        self._check_format(table)
        self._opened.table = table
        return table

    def table_at(self, version: int, *, or_later: bool = False) -> DeltaTable:
        """A DeltaTable at ``version``: this thread's table moved on to it where it is at or
        before it (delta-rs reads the log entries since, no more), else one opened at it
        (the last checkpoint and every entry since). ``or_later``: this thread's table as it
        is where it has passed ``version``. A thread without a table keeps the one opened;
        :meth:`open` moves it on from there."""
        from deltalake.exceptions import DeltaError

        table: DeltaTable | None = getattr(self._opened, "table", None)
        if table is not None and or_later and table.version() > version:
            return table
        if table is not None and table.version() <= version:
            try:
                table.load_as_version(version)
                return table
            except DeltaError:  # its log was cleaned up, say: open one afresh
                table = self._opened.table = None
        opened = self.location.delta_table(version)
        if table is None:
            self._check_format(opened)
            self._opened.table = opened
        return opened

    def is_latest(self, version: int) -> bool:
        """Whether ``version`` is the table's latest, by two probes of the log: no entry
        follows it, and its own entry is still there (where storage cannot say: no).

        The second probe is what makes the first sound. A missing entry for the next
        version means that no writer made it yet, or that log cleanup deleted it after a
        checkpoint past it: a reader left idle while others committed more than
        ``spark_queue.logRetentionVersions`` versions would take the log for quiet for
        ever. Log cleanup (:func:`spark_queue.commit.maintenance.cleanup_log`) deletes the oldest
        entries first, one at a time, and stops at the first it cannot delete, so the
        entries it has deleted are always all those below some version, whatever number
        of cleanups run at once. ``version``'s entry, there after the next one was found
        missing, was there at that moment, so the next one had not been deleted then: it
        was not written yet. A probe trusted for some seconds would not do: cleanup keeps
        the commits of the last ``LOG_MIN_AGE_SECONDS`` by its own clock against the
        store's, and its time rule (``delta.logRetentionDuration``) has no such floor
        (docs/decisions/log-retention.md).
        """
        try:
            if self.entries.read(version + 1) is not None:  # one request on S3 (a GET)
                return False
        except OSError:
            return False
        return self.has_log_entry(version)  # after the probe above: the order makes it sound

    def read_log_entry(self, version: int, *, files: bool = True) -> LogEntry:
        """What ``version``'s log entry says (:func:`parse_log_entry`; ``files``: with the
        state files it added).

        Raises:
            FileNotFoundError: the entry is not there: not written yet, or deleted by log
                cleanup.
        """
        data = self.entries.read(version)  # one request on S3 (a GET)
        if data is None:
            raise FileNotFoundError(self.log_entry(version))
        return parse_log_entry(version, data.decode("utf-8"), files=files)

    def has_log_entry(self, version: int) -> bool:
        """Whether ``version``'s log entry is on storage (where storage cannot say: no)."""
        try:
            return self.entries.exists(version)
        except OSError:
            return False

    def _check_format(self, table: DeltaTable) -> None:
        metadata = table.metadata()
        columns = set(pa.schema(table.schema()).names)
        missing = set(TABLE_SCHEMA.names) - columns
        if metadata.partition_columns != [PARTITION] or missing:
            raise NotAQueueTableError(
                f"{self.uri} holds a Delta table that is not a spark-queue table "
                f"(partition columns {metadata.partition_columns}, missing columns "
                f"{sorted(missing)}); point 'path' at an empty or new folder, or at a queue table"
            )

    def create(self) -> None:
        """Create an empty queue table where there is none.

        Raises:
            NotAQueueTableError: no table is there and none may be created: the folder
                holds something else, or is inside another Delta table
                (:func:`~spark_queue.storage.table_folder.new_table_refusal`); nothing is
                written.
        """
        from deltalake import Schema
        from deltalake.exceptions import DeltaError
        from deltalake.transaction import create_table_with_add_actions

        if self.view(probe=False) is not None:
            return
        refusal = new_table_refusal(self.location)
        if refusal is not None:
            if self._load() is not None:  # another writer created it since the look above
                return
            raise NotAQueueTableError(refusal)
        # Another writer may create it meanwhile: then open what is there.
        with contextlib.suppress(DeltaError):
            create_table_with_add_actions(
                self.uri,
                Schema.from_arrow(TABLE_SCHEMA),
                [],
                mode="error",
                partition_by=[PARTITION],
                name="spark-queue",
                description=FORMAT_DESCRIPTION,
                configuration=TABLE_CONFIGURATION,
                storage_options=self.location.delta_options(),
            )
        assert self._load() is not None

    def snapshot(
        self, table: DeltaTable | None = None, *, with_states: bool = True, probe: bool = True
    ) -> Snapshot | None:
        """The table's files and queue states at its latest version (:meth:`view`; with
        ``probe`` unset, as known: see there), or at ``table``'s version. ``with_states``
        unset: the files only, and ``states`` is empty."""
        view = TableView.of(table, -float("inf")) if table is not None else self.view(probe=probe)
        if view is None:
            return None
        listed = view.state_files
        states = self.read_states(listed) if with_states else {}
        return Snapshot(view, view.files, states, listed)  # read only: shared safely

    def files_at(self, version: int) -> Snapshot | None:
        """The files (no states) of an earlier ``version``, or None where its log is gone."""
        from deltalake.exceptions import DeltaError

        try:  # a table of its own: this thread's open table stays at the latest version
            table = self.location.delta_table(version)
        except (DeltaError, OSError):
            return None
        view = TableView(version, flatten_files(table), table, {}, -float("inf"))
        return Snapshot(view, view.files, {})

    def all_exist(self, relatives: list[str]) -> bool:
        """Whether every one of these data files is still on storage (not vacuumed)."""
        infos = self.fs.get_file_info([f"{self.base.rstrip('/')}/{r}" for r in relatives])
        return all(info.type != pafs.FileType.NotFound for info in infos)

    def read_rows(
        self,
        relative: str,
        columns: list[str] | None = None,
        filters: Any = None,
        *,
        size: int | None = None,
    ) -> pa.Table:
        """A data file's ``columns`` (all where None), its rows matching ``filters``.

        ``size``: the file's size, where the caller knows it (the log records it). A file
        of :data:`WHOLE_READ_BYTES` or less is then read whole in one request, footer and
        all (:meth:`read_whole`; ``filters`` as conjunctions of ``(column, op, value)``),
        where reading its footer and then its columns takes a request each; or not at all
        where this process holds its bytes (:func:`~spark_queue.storage.row_cache.held_file`).
        """
        path = f"{self.base.rstrip('/')}/{relative}"
        if size is not None and size <= WHOLE_READ_BYTES:
            file = pq.ParquetFile(pa.BufferReader(held_file(path) or self.read_whole(relative)))
            # One thread, and not read_table's dataset layer: a threaded read of an
            # in-memory file leaves a thread that aborts the process at its exit, in most
            # runs ("terminate called without an active exception", apache/arrow#34314).
            wanted = columns or FILE_SCHEMA.names
            needed = [*wanted, *(c for c, _, _ in filters or [] if c not in wanted)]
            present = set(file.schema_arrow.names)
            rows = file.read([n for n in needed if n in present], use_threads=False)
            # As read_table(schema=FILE_SCHEMA) gives it: the columns the file leaves out
            # (null in every row) as nulls, each in its schema type.
            rows = file_columns(rows, needed)
            if filters:
                rows = rows.filter(pq.filters_to_expression(filters))
            return rows.select(wanted)
        # One open file, its column chunks read in coalesced ranges: by path, pyarrow's
        # dataset reader would stat the file twice first (object stores: two requests each).
        with self.fs.open_input_file(path) as source:
            return pq.read_table(
                source, columns=columns, filters=filters, schema=FILE_SCHEMA, pre_buffer=True
            )

    def read_whole(self, relative: str) -> pa.Buffer:
        """The bytes of a data file, in one request on S3 (a GET through
        :meth:`Location.object_store`, where pyarrow's client asks for the size first)."""
        store = self.location.object_store()
        if store is not None:
            import obstore

            return pa.py_buffer(obstore.get(store, relative).bytes())
        with self.fs.open_input_stream(f"{self.base.rstrip('/')}/{relative}") as stream:
            data: pa.Buffer = stream.read_buffer()
        return data

    def data_file(self, relative: str, size: int | None = None) -> DataFile:
        """A data file read through :mod:`~spark_queue.storage.row_cache`; one of
        :data:`WHOLE_READ_BYTES` or less, where its ``size`` is known, read whole in one
        request when anything of it is first needed."""
        whole = None
        if size is not None and size <= WHOLE_READ_BYTES:
            whole = functools.partial(self.read_whole, relative)
        return DataFile(self.fs, f"{self.base.rstrip('/')}/{relative}", whole)

    def stream_rows(
        self, relative: str, columns: list[str], batch_bytes: int, *, size: int | None = None
    ) -> Iterator[pa.Table]:
        """A file's ``columns``, decoded a batch of about ``batch_bytes`` at a time: a reader
        holds one batch rather than the file, hands each on as soon as it is decoded, and
        reuses the memory of the last: decoding a whole file at once is slower, mostly in
        fresh memory. ``size``: the file's, where known: one of :data:`WHOLE_READ_BYTES` or
        less is read whole in one request (:meth:`read_whole`)."""
        path = f"{self.base.rstrip('/')}/{relative}"
        whole = size is not None and size <= WHOLE_READ_BYTES
        if whole:
            data = held_file(path) or self.read_whole(relative)
            file = pq.ParquetFile(pa.BufferReader(data))
        else:  # pre_buffer: a row group's column chunks in one coalesced read, not one each
            file = pq.ParquetFile(path, filesystem=self.fs, pre_buffer=True)
        metadata = file.metadata
        if not metadata.num_rows:
            return
        first = metadata.row_group(0)
        row_bytes = max(1, first.total_byte_size // max(1, first.num_rows))
        held = set(file.schema_arrow.names)  # the others are left out as nulls
        read = [name for name in columns if name in held]
        for batch in file.iter_batches(  # an in-memory file on one thread (see read_rows)
            batch_size=max(1, batch_bytes // row_bytes), columns=read, use_threads=not whole
        ):
            rows = pa.Table.from_batches([batch])
            yield rows if len(read) == len(columns) else file_columns(rows, columns)

    def read_states(self, state_files: list[tuple[str, int, str]]) -> dict[str, QueueState]:
        """The queue states in ``state_files`` (path, size, record): those this process
        last wrote or read where these are their files, else :meth:`read_state_files`."""
        paths = frozenset(path for path, _, _ in state_files)
        states = self.known.states(paths)
        if states is None:
            states = self.read_state_files(state_files)
            self.known.remember_states(paths, states)
        return {name: state.copy() for name, state in states.items()}

    def read_state_files(self, state_files: list[tuple[str, int, str]]) -> dict[str, QueueState]:
        """The queue states in ``state_files`` (path, size, record), the files read at
        once: on an object store, one request in a row."""

        def rows(file: tuple[str, int, str]) -> tuple[str, pa.Table]:
            path, size, record = file
            columns = ["queue", "queue_state"] if record == QUEUE else None
            return record, self.read_rows(path, columns, size=size)

        if len(state_files) > 1:
            read = list(_READS.map(rows, state_files))
        else:
            read = [rows(file) for file in state_files]
        try:
            return states_of(read)
        except UnsupportedFormatError as error:
            raise UnsupportedFormatError(f"{self.uri}: {error}") from None

    # -- reading messages ------------------------------------------------------------------

    def head_reader(self, snapshot: Snapshot) -> FileHeadReader:
        return FileHeadReader(self, snapshot)

    def read_messages(
        self, snapshot: Snapshot, queue: str, seqs: np.ndarray, columns: list[str] | None = None
    ) -> pa.Table:
        """The stored message rows of ``queue`` with the given seqs (any order)."""
        if not len(seqs):
            return FILE_SCHEMA.empty_table()
        wanted = pa.array(np.unique(seqs), type=pa.int64())
        low, high = int(wanted[0].as_py()), int(wanted[-1].as_py())
        files = snapshot.message_files(queue, from_seq=low)
        files = files.filter(pc.fill_null(pc.less_equal(files["min_seq"], high), True))
        parts = []
        for path, size in zip(files["path"].to_pylist(), files["size"].to_pylist(), strict=True):
            for rows in self._row_groups_between(path, size, queue, low, high, columns):
                rows = rows.filter(pc.is_in(rows["seq"], wanted))
                if rows.num_rows:
                    parts.append(rows)
        if not parts:
            return (
                FILE_SCHEMA.empty_table()
                if columns is None
                else FILE_SCHEMA.empty_table().select(columns)
            )
        return pa.concat_tables(parts)

    def _row_groups_between(
        self,
        relative: str,
        size: int | None,
        queue: str,
        low: int,
        high: int,
        columns: list[str] | None,
    ) -> Iterator[pa.Table]:
        """The row groups of a message file that may hold ``queue`` rows with seqs from
        ``low`` to ``high`` (by their statistics), as :data:`FILE_SCHEMA` (or its
        ``columns``), through :mod:`spark_queue.storage.row_cache`: consumers lease from the same
        few row groups at the head one after another, and each lease's rows are read back."""
        source = self.data_file(relative, size)
        metadata = source.metadata
        wanted = (
            FILE_SCHEMA if columns is None else pa.schema([FILE_SCHEMA.field(c) for c in columns])
        )
        names = metadata.schema.names  # of the leaf columns, as the row groups' statistics
        seq_column, queue_column = names.index("seq"), names.index("queue")
        for index in range(metadata.num_row_groups):
            group = metadata.row_group(index)
            seqs, queues = (
                group.column(seq_column).statistics,
                group.column(queue_column).statistics,
            )
            if seqs is not None and seqs.has_min_max and (seqs.max < low or seqs.min > high):
                continue
            if queues is not None and queues.has_min_max and not queues.min <= queue <= queues.max:
                continue
            if only(queues, queue):
                rows = source.row_group(index, wanted.names)
            else:
                read = wanted.names + ["queue"] * ("queue" not in wanted.names)
                rows = source.row_group(index, read)
                rows = rows.filter(pc.equal(rows["queue"], queue)).select(wanted.names)
            yield rows.cast(wanted)

    def read_head_rows(
        self, relative: str, size: int | None, queue: str, priority: int, from_seq: int
    ) -> Iterator[pa.Table]:
        """One file's rows of a queue level from a seq, as :data:`HEAD_SCHEMA`, in seq order.

        Row groups wholly below ``from_seq`` are skipped by their statistics, and the rows
        of the others come in slices that start small and double (:data:`FIRST_HEAD_SLICE`
        rows, then twice as many, ...), each only if the caller asks: a lease of ten
        messages looks at about a thousand rows, a lease of a million at a few dozen slices.
        A row group's level rows, once decoded, filtered and sorted, are kept for the next
        read (:mod:`spark_queue.storage.row_cache`): leases after leases read the same head.
        ``size``: the file's, where known (:meth:`data_file`)."""
        source = self.data_file(relative, size)
        metadata = source.metadata
        seq_column = metadata.schema.names.index("seq")
        for index in range(metadata.num_row_groups):
            stats = metadata.row_group(index).column(seq_column).statistics
            if stats is not None and stats.has_min_max and stats.max < from_seq:
                continue
            rows, seqs = source.derived(
                index,
                ("head", queue, priority),
                functools.partial(level_rows, source, index, queue, priority),
            )
            start = int(np.searchsorted(seqs, from_seq))
            size = FIRST_HEAD_SLICE
            while start < rows.num_rows:
                yield rows.slice(start, size)
                start += size
                size *= 2

    # -- committing ------------------------------------------------------------------------

    def commit(
        self,
        snapshot: Snapshot,
        adds: list[StagedFile],
        removes: list[tuple[str, int, str]],
        *,
        app_id: str | None = None,
        app_version: int | None = None,
        summary: CommitSummary | None = None,
        app_transactions: Mapping[str, int] | None = None,
    ) -> TableView:
        """Publish files in one Delta commit, the version after ``snapshot``'s; returns the
        table as it is then (kept as this process's view: nothing is read back). Raises
        ``CommitFailedError`` where another writer made that version first, after reading
        what it committed (the log entries from that version on): the caller plans again.

        The commit records what it did (``summary``, :mod:`~spark_queue.storage.commit_log`),
        the application transaction ``(app_id, app_version)`` and every one of
        ``app_transactions`` (id -> version; a group commit's idempotent publishes).
        :meth:`prepare` and :meth:`publish` are its two halves, for a caller that plans its
        next commit while this one's log entry is on its way.
        """
        versions = dict(app_transactions or {})
        if app_id is not None and app_version is not None:
            versions[app_id] = app_version
        return self.publish(self.prepare(snapshot, adds, removes, versions, summary))

    def prepare(
        self,
        snapshot: Snapshot,
        adds: list[StagedFile],
        removes: list[tuple[str, int, str]],
        transactions: Mapping[str, int],
        summary: CommitSummary | None,
    ) -> PreparedCommit:
        """A commit of ``adds``, ``removes`` and the application transactions
        ``transactions`` (id -> version) after ``snapshot``, and the table as it will be
        once it lands; nothing is written."""
        view = snapshot.view
        encoded = EMPTY_SUMMARY if summary is None else summary.encode()
        entry = None
        if self.entries.creates:
            stamp = int(time.time() * 1000)
            entry = encode_entry(adds, removes, transactions, encoded, SUMMARY_KEY, stamp)
        return PreparedCommit(view, adds, removes, dict(transactions), encoded, entry)

    def publish(self, prepared: PreparedCommit) -> TableView:
        """Create the log entry of a prepared commit (:meth:`commit` says how); returns the
        table as it is then. Raises ``CommitFailedError`` where another writer made the
        version first (nothing landed), :class:`CommitUnknownError` where the store failed
        on the way (it may have landed)."""
        from deltalake.exceptions import CommitFailedError

        try:
            return self._publish(prepared)
        except (CommitFailedError, CommitUnknownError):
            raise
        except Exception as error:
            raise CommitUnknownError(
                f"a commit of version {prepared.view.version + 1} of {self.uri} may or may "
                f"not have landed: {error}"
            ) from error

    def _publish(self, prepared: PreparedCommit) -> TableView:
        """:meth:`publish`. The entry is created by spark-queue
        (:mod:`~spark_queue.storage.delta_log`): one conditional request, whose refusal is
        the lost race; where the view was last known
        current more than :data:`~spark_queue.storage.table_view.TRUSTED_SECONDS` before the
        entry landed, the entry before it is checked too (log cleanup may have deleted the
        version's entry before this one created it again, in the log's past: then it is
        deleted and the commit planned again). Where spark-queue cannot create entries on
        the store, delta-rs commits (:meth:`_commit_through_delta_rs`)."""
        from deltalake.exceptions import CommitFailedError

        view, entry = prepared.view, prepared.entry
        if entry is None:
            asked = time.monotonic()
            self._commit_through_delta_rs(prepared)
            return self.known.offer(prepared.landed.current_from(asked))
        known = self.known.view
        if known is not None and known.version == view.version:
            view = view.current_from(known.current_at)
        version = view.version + 1
        asked = time.monotonic()
        with self.storage_errors():
            if not self.entries.create(version, entry):
                if self._catch_up_after(view, entry):  # a retried create of its own
                    return self.known.offer(prepared.landed.current_from(asked))
                raise CommitFailedError(
                    f"version {version} of {self.uri} was committed by another writer first"
                )
            if not view.trusted(time.monotonic()) and not self.entries.exists(view.version):
                self._stray(version, asked)
        return self.known.offer(prepared.landed.current_from(asked))

    def _catch_up_after(self, view: TableView, entry: bytes) -> bool:
        """After the next entry of ``view`` was found there: whether it is ``entry`` (a
        create whose first attempt landed though its answer was lost, so the store's
        client tried again); where not, the view is moved on to the present."""
        found = self.entries.read(view.version + 1)
        if found == entry:
            return True
        if found is not None:
            actions = parse_actions(found.decode("utf-8"))
            if actions.rebuilds or not view.precedes(actions.adds, actions.removes):
                self.known.forget()
                return False
            view = view.moved_by(actions)
        self._reach_present(view)
        return False

    def _stray(self, version: int, asked: float) -> None:
        """The entry of ``version`` this process created (asked for at ``asked``) while the
        previous one is gone: log cleanup deleted both, so the new one is in the log's
        past, where no reader looks, and is deleted; unless so much time passed that the
        log may have moved on from it (then its fate is unknown)."""
        from deltalake.exceptions import CommitFailedError

        self.known.forget()
        if time.monotonic() - asked < TRUSTED_SECONDS:
            self.entries.delete(version)
            raise CommitFailedError(
                f"version {version - 1} of {self.uri} was planned on, and log cleanup had "
                f"deleted its log entry: planned again on the latest"
            )
        raise CommitUnknownError(
            f"a commit of version {version} of {self.uri} took over {TRUSTED_SECONDS:g} s, "
            "and log cleanup has passed the version it was planned on meanwhile: whether it "
            "counts is unknown; publish again with the same producer and sequence, or check"
        )

    def _commit_through_delta_rs(self, prepared: PreparedCommit) -> None:
        """A prepared commit through delta-rs (stores whose entries spark-queue does not
        create): from this thread's table moved to the version it was planned on.

        delta-rs would rebase a conflicting commit onto the winner by itself; a queue
        commit was planned from the state it read, so it must be planned again instead
        (``max_commit_retries=0``). Its post-commit hooks are off: they raise *after* the
        commit is written, which would make a committed batch look failed (checkpoints,
        log cleanup and compaction run in :mod:`spark_queue.commit.maintenance`). A
        version whose log entry log cleanup has deleted is refused by delta-rs, writing
        nothing, with ``Invalid table version``: a lost race too."""
        from deltalake import CommitProperties, PostCommitHookProperties, Transaction
        from deltalake.exceptions import CommitFailedError, DeltaError
        from deltalake.transaction import AddAction, RemoveAction

        view = prepared.view
        stamp = int(time.time() * 1000)
        actions: list[Any] = [
            AddAction(f.path, f.size, {PARTITION: f.record}, stamp, True, f.stats)
            for f in prepared.adds
        ]
        actions += [
            RemoveAction(path, True, stamp, size, {PARTITION: record})
            for path, size, record in prepared.removes
        ]
        versions = sorted(prepared.transactions.items())
        transactions = [Transaction(i, v) for i, v in versions] or None
        try:
            table = self.table_at(view.version)
            table.create_write_transaction(
                actions,
                mode="append",
                schema=TABLE_SCHEMA,
                partition_by=[PARTITION],
                commit_properties=CommitProperties(
                    custom_metadata={SUMMARY_KEY: prepared.summary},
                    max_commit_retries=0,
                    app_transactions=transactions,
                ),
                post_commithook_properties=PostCommitHookProperties(
                    create_checkpoint=False, cleanup_expired_logs=False
                ),
            )
        except CommitFailedError:
            self._reach_present(view)
            raise
        except DeltaError as error:
            if not str(error).startswith(PASSED_VERSION_ERROR):
                raise
            self.known.forget()
            raise CommitFailedError(
                f"version {view.version} of {self.uri} was planned on, and log cleanup has "
                f"deleted its log entry since: planned again on the latest ({error})"
            ) from error
