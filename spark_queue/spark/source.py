"""The streaming source: ``spark.readStream.format("ringqueue")``, a consumer of one queue.

How leases and acknowledgements map onto Spark's micro-batch protocol (SEMANTICS §3):

- ``latestOffset(start, limit)`` runs on the driver before each micro-batch. In one Delta
  commit it **acknowledges** this consumer's leases up to ``start`` (Spark passes the end of
  the last batch it committed, so everything up to there is safely in the sink) and **leases**
  the next batch from the head. The new offset names that lease and lists the leased seqs as
  ranges, so a restarted query replays exactly those messages (``partitions`` reads them back
  from the offset log, without ``latestOffset``).
- ``commit(end)`` is not used: it lags one batch and is not called for the last batch of an
  AvailableNow run. The window that remains: a committed batch stays leased until the next
  trigger or the next run of the query (or until its ``leasePeriod`` returns it).
- Leases this consumer holds beyond ``start`` were committed to the table by a
  ``latestOffset`` whose offset Spark never logged (the query died in between): they are the
  next batch, so they are neither stuck nor acknowledged unread by a later batch's ack.
- ``semantics=at-most-once`` removes messages when leasing them (counted ``acked``);
  ``ackMode=manual`` leaves acknowledgement to ``QueueTable.ack`` (e.g. in ``foreachBatch``).
- A new query (a fresh checkpoint, or one whose offset log is empty) starts a new consumer
  session: its first ``latestOffset`` returns what the consumer name still held, as when an
  Artemis consumer closes, in the commit that leases its first batch. ``initialOffset``
  commits nothing, because Spark also calls it to replay batch 0 from its offset log, and
  that batch's leases must stay where they are.

What runs where: every method but ``read`` runs in the driver-side source worker, which keeps
this instance for the whole query run; ``read`` runs in executor tasks from a pickled copy
and gets everything from its :class:`LeasedRange` partition (the table's location included).
With ``readMode=driver`` (:class:`DriverReadStreamReader`) the source worker also reads each
batch as it leases it, and only a replay after a restart reads in an executor task.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from spark_queue.commit import failpoints
from spark_queue.commit.requests import Planner, ack_planner, apply_lease, release_planner
from spark_queue.commit.transaction import QueueTransaction, run
from spark_queue.errors import TableNotFoundError, UnsupportedFormatError
from spark_queue.model.schema import BROWSE_ARROW_SCHEMA, BROWSE_COLUMNS
from spark_queue.partitioned import Partitions
from spark_queue.portable import Portable
from spark_queue.rules import Leases, ascending, is_ascending
from spark_queue.spark.options import SourceOptions
from spark_queue.spark.worker_gc import freeze_long_lived
from spark_queue.storage.commit_log import CommitOperation
from spark_queue.storage.following import following
from spark_queue.storage.location import Location
from spark_queue.storage.store import QueueStore, Snapshot, require_queue

OFFSET_VERSION = 2  # the only one read; 1 held ``redelivered`` as a count per seq
TASK_BYTES = 128 * 1024 * 1024  # bodies per read task at most, about
MIN_TASK_BYTES = 8 * 1024 * 1024  # below this a batch is not split for parallelism
MIN_TASKS = 2
ARROW_BATCH_BYTES = 8 * 1024 * 1024  # per Arrow batch handed to the JVM, about
# readMode=driver with neither maxMessagesPerTrigger nor maxBytesPerTrigger: bodies per
# batch at most, about, since the driver's source worker holds a batch whole.
DRIVER_BATCH_BYTES = 64 * 1024 * 1024
# What a read takes from the message files; delivery counts, consumer and state are the
# lease's, not the stored ones.
STORED_COLUMNS = [c for c in BROWSE_COLUMNS if c not in ("delivery_count", "consumer", "state")]
MAX_THREADS = 16  # a partitioned queue's tables committed to or read at once, at most


def _partitions_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="spark-queue-partitions")


def _pool_in_child() -> None:
    """A forked child has none of its parent's threads, which the pool would count as
    running (its work would wait for them forever): it starts a pool of its own."""
    global _PARTITIONS
    _PARTITIONS = _partitions_pool()


# The threads of the partitions' work: shared by every call, since a pool of its own started
# a thread per partition twice a micro-batch (acknowledge and lease, then plan the reads).
_PARTITIONS = _partitions_pool()
os.register_at_fork(after_in_child=_pool_in_child)

T = TypeVar("T")


def by_seq(seqs: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``seqs`` and ``values`` in seq order; no sort where they already are (leases are
    taken from the head in seq order)."""
    if is_ascending(seqs):
        return seqs, values
    order = np.argsort(seqs)
    return seqs[order], values[order]


def delivery_runs(leased: Leases) -> list[list[int]]:
    """Delivery counts above 1 as ``[first, last, count]`` runs over the leased seqs in
    order: every leased seq from ``first`` to ``last`` was delivered ``count`` times. A
    returned batch leased again is a run or a few, where one entry per message made a
    million-message offset 20 MB of JSON, parsed again by every task."""
    if not len(leased) or not (leased.deliveries > 1).any():
        return []
    seqs, counts = by_seq(leased.seq, leased.deliveries)
    changes = np.flatnonzero(np.diff(counts) != 0) + 1
    firsts = np.concatenate([[0], changes])
    lasts = np.concatenate([changes - 1, [len(seqs) - 1]])
    again = counts[firsts] > 1
    return [
        [first, last, count]
        for first, last, count in zip(
            seqs[firsts[again]].tolist(),
            seqs[lasts[again]].tolist(),
            counts[firsts[again]].tolist(),
            strict=True,
        )
    ]


def check_offset(offset: dict, queue: str) -> dict:
    """``offset`` from Spark's checkpoint, if this source wrote it in :data:`OFFSET_VERSION`;
    else an :class:`UnsupportedFormatError` naming the version found."""
    found = offset.get("version")
    if found != OFFSET_VERSION:
        raise UnsupportedFormatError(
            f"the checkpoint's offset of queue {queue!r} has format version {found}; this "
            f"spark-queue reads version {OFFSET_VERSION} only: start the query with a new "
            "checkpointLocation"
        )
    return offset


def seq_ranges(seqs: np.ndarray) -> list[list[int]]:
    """Seqs (in any order) as sorted inclusive [first, last] runs of consecutive numbers."""
    ordered = ascending(np.asarray(seqs, dtype=np.int64))  # a lease holds each seq once
    if not len(ordered):
        return []
    breaks = np.flatnonzero(np.diff(ordered) != 1)
    firsts = ordered[np.concatenate([[0], breaks + 1])]
    lasts = ordered[np.concatenate([breaks, [len(ordered) - 1]])]
    return [[first, last] for first, last in zip(firsts.tolist(), lasts.tolist(), strict=True)]


def split_seqs(leased: Leases, min_tasks: int = MIN_TASKS) -> list[int]:
    """Where a batch's reading splits into tasks: the first seq of every task after the
    first. Tasks read equal shares of the bodies, at most :data:`TASK_BYTES` each (Spark's
    ``maxPartitionBytes``), and there are at least ``min_tasks`` where each would still
    read :data:`MIN_TASK_BYTES`: Spark runs them in parallel, one per core, and every task
    more than the cores costs a Python worker round trip (figures: DESIGN.md, "Measured
    choices in the code")."""
    seqs, sizes = by_seq(leased.seq, leased.size)
    cumulative = np.cumsum(sizes)
    total = int(cumulative[-1]) if len(cumulative) else 0
    tasks = max(-(-total // TASK_BYTES), min(min_tasks, total // MIN_TASK_BYTES))
    if tasks <= 1:
        return []
    cuts = np.searchsorted(cumulative, total * np.arange(1, tasks) / tasks, side="right")
    return sorted(set(seqs[cuts[cuts < len(seqs)]].tolist()))


def clip_ranges(ranges: list[list[int]], low: int | None, high: int | None) -> list[list[int]]:
    """The parts of inclusive seq ranges within [low, high] (None: unbounded)."""
    clipped = []
    for first, last in ranges:
        first = first if low is None else max(first, low)
        last = last if high is None else min(last, high)
        if first <= last:
            clipped.append([first, last])
    return clipped


def is_initial(offset: dict) -> bool:
    """Whether ``offset`` is an ``initialOffset``: Spark starts a new query from it, and
    never logs it (an offset Spark logs names the seqs of a batch)."""
    return "ranges" not in offset


@dataclass
class LeasedRange(Portable, InputPartition):
    """The messages of one lease that one task reads: files, seq ranges, delivery counts.

    Made by ``partitions`` on the driver side and pickled into one executor task, which needs
    nothing else."""

    location: Location
    queue: str
    consumer: str
    paths: list[str]
    ranges: list[list[int]]
    redelivered: list[list[int]]  # [first, last, count] where the count is not 1
    whole: list[bool]  # per path: every row is this queue's and leased here (no filter)
    sizes: list[int | None]  # per path: its size (a small file is read in one request)


def read_leased(partition: LeasedRange) -> Iterator[pa.Table]:
    """The partition's messages as delivered, in tables of about :data:`ARROW_BATCH_BYTES`
    where a file is leased whole, else one table per file (a task holds one of them in
    memory at a time)."""
    store = QueueStore(partition.location)
    low, high = partition.ranges[0][0], partition.ranges[-1][1]
    schema = BROWSE_ARROW_SCHEMA
    runs = np.array(partition.redelivered, dtype=np.int64).reshape(-1, 3)
    for path, whole, size in zip(partition.paths, partition.whole, partition.sizes, strict=True):
        if whole:  # every row is wanted: no filter (a quarter of the read), streamed
            for rows in store.stream_rows(path, STORED_COLUMNS, ARROW_BATCH_BYTES, size=size):
                seqs = rows["seq"].to_numpy()
                yield _as_delivered(rows, seqs, partition.consumer, runs).cast(schema)
            continue
        rows = store.read_rows(
            path,
            STORED_COLUMNS,
            filters=[("queue", "=", partition.queue), ("seq", ">=", low), ("seq", "<=", high)],
            size=size,
        )
        seqs = rows["seq"].to_numpy()
        inside = np.zeros(len(seqs), dtype=bool)
        for first, last in partition.ranges:
            inside |= (seqs >= first) & (seqs <= last)
        if not inside.all():  # usually one range covers the read: the filter did it
            rows, seqs = rows.filter(pa.array(inside)), seqs[inside]
        if rows.num_rows:
            yield _as_delivered(rows, seqs, partition.consumer, runs).cast(schema)


def files_covering(snapshot: Any, queue: str, ranges: list[list[int]]) -> pa.Table:
    """The message files of ``snapshot`` that may hold ``queue``'s seqs in ``ranges``."""
    low, high = ranges[0][0], ranges[-1][1]
    files = snapshot.message_files(queue, from_seq=low)
    return files.filter(pc.fill_null(pc.less_equal(files["min_seq"], high), True))


def arrow_batches(rows: pa.Table) -> list[pa.RecordBatch]:
    """``rows`` in Arrow batches of about :data:`ARROW_BATCH_BYTES`: the JVM holds each one
    off its heap while it converts it."""
    row_bytes = max(1, rows.nbytes // max(1, rows.num_rows))
    return rows.to_batches(max_chunksize=max(1, ARROW_BATCH_BYTES // row_bytes))


def delivery_counts(seqs: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """The delivery count of each leased seq: its run's (``runs``: first, last, count rows,
    in order), else 1."""
    counts = np.ones(len(seqs), dtype=np.int32)
    if len(runs):
        at = np.searchsorted(runs[:, 0], seqs, side="right") - 1
        within = (at >= 0) & (seqs <= runs[np.maximum(at, 0), 1])
        counts[within] = runs[at[within], 2]
    return counts


def _as_delivered(rows: pa.Table, seqs: np.ndarray, consumer: str, runs: np.ndarray) -> pa.Table:
    """Stored message rows with their delivery count, consumer and state ``leased``."""
    counts = delivery_counts(seqs, runs)
    rows = rows.append_column("delivery_count", pa.array(counts, pa.int32()))
    every_row = pa.array(np.zeros(rows.num_rows, dtype=np.int32))
    rows = rows.append_column("consumer", pa.array([consumer]).take(every_row))
    rows = rows.append_column("state", pa.array(["leased"]).take(every_row))
    return rows.select(BROWSE_COLUMNS)


class TableStreamReader(Portable):
    """The source's consumer of its queue in one queue table: the root's, or one partition
    table of a partitioned queue (:class:`RingQueueStreamReader` holds one per partition).

    Its offsets are the format every query of a queue without partitions logs: a session,
    the last lease id, and the leased seqs as ranges. The protocol, window by window, is the
    module docstring's."""

    def __init__(self, options: SourceOptions, store: QueueStore | None = None) -> None:
        self.options = options
        self.store = store if store is not None else QueueStore(options.path, options.storage)
        self._stop_below: int | None = None  # AvailableNow: what existed when it started
        self._initial: dict | None = None
        # The snapshot the last lease was planned on: its message files hold the batch (a
        # lease adds none, and files a later compaction drops stay until a vacuum).
        self.planned_on: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "planned_on": None}  # a snapshot is this process's only

    # -- offsets -----------------------------------------------------------------------------

    def _offset(
        self, lease: int, first: int, leased: Leases | None = None, version: int | None = None
    ) -> dict:
        offset: dict[str, Any] = {
            "version": OFFSET_VERSION,
            "queue": self.options.queue,
            "consumer": self.options.consumer,
            "session": first,  # lease ids above this belong to this query
            "lease": lease,
        }
        if leased is not None and len(leased):
            offset["ranges"] = seq_ranges(leased.seq)
            splits = split_seqs(leased)
            if splits:
                offset["splits"] = splits
            offset["redelivered"] = delivery_runs(leased)
            if self.options.semantics == "at-most-once" and version is not None:
                # The batch's rows were removed when leased, so a later compaction may drop
                # them from the files: the batch reads the files of the version it was
                # leased at.
                offset["table_version"] = version
        return offset

    def initialOffset(self) -> dict:
        """Where a new query starts: a session above every lease id this consumer name has
        taken. It commits nothing: Spark also calls it when it replays batch 0 from its
        offset log, and that replay must read the batch it logged, with nothing returned
        to the queue meanwhile. The first ``latestOffset`` of a new query, which starts from
        this offset, returns what the name still held (:func:`is_initial`).

        Spark calls it more than once at the start of a fresh checkpoint, so the answer is
        worked out once and kept.
        """
        if self._initial is None:
            snapshot = self.store.snapshot()
            if snapshot is None:
                raise TableNotFoundError(self.store.uri)
            state = self._require(snapshot.states)
            first = state.consumers.get(self.options.consumer, {}).get("last_lease", 0)
            self._initial = self._offset(first, first)
        return self._initial

    def stop_at_present(self) -> None:
        """AvailableNow: lease nothing enqueued after now."""
        snapshot = self.store.snapshot()
        state = snapshot.states.get(self.options.queue) if snapshot else None
        self._stop_below = state.next_seq if state is not None else 0

    def advance(
        self,
        start: dict,
        max_messages: int | None,
        max_bytes: int | None,
        present: Snapshot | None = None,
    ) -> dict:
        """Acknowledge what Spark committed (up to ``start``) and lease the next batch of at
        most ``max_messages`` (0: acknowledge only) and ``max_bytes``; ``start`` itself
        where nothing was leased. ``present``: the table's latest version, read a moment
        ago (the lease plans on it first, rather than read it again)."""
        check_offset(start, self.options.queue)
        lease_id, leased, version = self._advance(
            start["session"], start["lease"], is_initial(start), max_messages, max_bytes, present
        )
        if not len(leased):
            return start
        return self._offset(lease_id, start["session"], leased, version)

    def _advance(
        self,
        session: int,
        through: int,
        new_query: bool,
        max_messages: int | None,
        max_bytes: int | None,
        present: Snapshot | None,
    ) -> tuple[int, Leases, int]:
        """One commit: return what this consumer name held before the session (a new
        query's first call only), acknowledge this session's leases up to lease id
        ``through`` (what Spark committed), then find the next batch: leases held beyond
        ``through`` (leased for an offset Spark never logged), else new leases from the
        head. Returns the batch's last lease id, its leases (none: nothing to deliver) and
        the table version that holds them. Planned on the table's present (``present``
        first, where given)."""
        options = self.options
        limits = replace(options.limits, max_messages=max_messages, max_bytes=max_bytes)

        def work(transaction: QueueTransaction) -> tuple[int, Leases, int]:
            changed = False

            def end_leases(after: int, upto: int, planner: Planner) -> None:
                """End this consumer's leases with ids in (``after``, ``upto``]."""
                nonlocal changed
                state = self._require(transaction.states)
                leases = state.leases
                ending = leases.held(consumer=options.consumer) & (leases.lease_id <= upto)
                ending &= leases.lease_id > after
                if ending.any():
                    plan = planner(transaction, state, leases.seq[ending])
                    transaction.apply_plan(options.queue, plan)
                    changed = True

            if new_query:  # what the name held before (lease ids start at 1) goes back
                end_leases(0, session, release_planner(options.consumer, delay_us=None))
            if options.ack_mode == "commit":  # what Spark committed is acknowledged
                end_leases(session, through, ack_planner(options.consumer))
            leases = self._require(transaction.states).leases
            unlogged = leases.take(
                leases.held(consumer=options.consumer)
                & (leases.lease_id > through)
                & (leases.until > transaction.now)
            )
            if max_messages == 0:  # this partition's turn to sit a bounded batch out
                leased = Leases()
            elif len(unlogged) and (max_messages is not None or max_bytes is not None):
                leased = unlogged  # one batch, whatever bounds it was leased under
            else:
                delivered, applied = apply_lease(
                    transaction,
                    options.queue,
                    limits,
                    filter=options.filter,
                    max_backlog=options.max_backlog,
                    below_seq=self._stop_below,
                    remove=options.semantics == "at-most-once",
                    settle=False,  # a micro-batch commits only when it delivers or acks
                )
                changed |= applied
                leased = Leases.concat([unlogged, delivered])
            version = transaction.snapshot.version
            self.planned_on = transaction.snapshot
            if changed:
                failpoints.reached("source.lease-planned")
                transaction.commit(
                    operation=CommitOperation.CONSUME.on(options.queue, options.consumer)
                )
                version += 1  # a commit without retries lands on the next version or fails
            return (int(leased.lease_id.max()) if len(leased) else through), leased, version

        # A producer's commits come between two triggers as a rule: each attempt plans on
        # the present, read with what it depends on at once
        # (docs/decisions/source-reads-the-present.md).
        given = [present] if present is not None else []
        store, queue = self.store, options.queue

        def latest() -> Snapshot | None:
            return given.pop() if given else following(store, queue)

        return run(store, work, create=False, present=latest)

    # -- reading a batch -----------------------------------------------------------------------

    def batch_partitions(self, start: dict, end: dict) -> list[LeasedRange]:
        """The read tasks of the batch that ends at ``end`` (none where it is ``start``)."""
        # ``end`` alone says what the batch is: on a replay of batch 0, ``start`` is a new
        # ``initialOffset``, which may already count the batch's own lease.
        check_offset(end, self.options.queue)
        if end == start or not end.get("ranges"):
            return []
        return self.partitions_over(end, self._files_of(end["ranges"], end.get("table_version")))

    def planned_partitions(self, end: dict) -> list[LeasedRange]:
        """The read tasks of the batch :meth:`advance` just leased, over the files of the
        snapshot it was planned on (no second update of the table)."""
        return self.partitions_over(
            end, files_covering(self.planned_on, self.options.queue, end["ranges"])
        )

    def partitions_over(self, end: dict, files: pa.Table) -> list[LeasedRange]:
        """The read tasks of the batch ``end`` names, over the message ``files`` that may
        hold its seqs."""
        ranges = end["ranges"]
        queue = self.options.queue
        sizes = dict(zip(files["path"].to_pylist(), files["size"].to_pylist(), strict=True))
        listed = [
            (path, low, high, low is not None and high is not None and first == last == queue)
            for path, low, high, first, last in zip(
                files["path"].to_pylist(),
                files["min_seq"].to_pylist(),
                files["max_seq"].to_pylist(),
                files["min_queue"].to_pylist(),
                files["max_queue"].to_pylist(),
                strict=True,
            )
        ]
        bounds = [None, *end.get("splits", []), None]
        runs = end.get("redelivered", [])
        partitions = []
        for task_low, task_next in pairwise(bounds):
            task = clip_ranges(ranges, task_low, None if task_next is None else task_next - 1)
            reads = [
                (path, one_queue and any(a <= low and high <= b for a, b in task))
                for path, low, high, one_queue in listed
                if clip_ranges(task, low, high)
            ]
            if task and reads:
                low, high = task[0][0], task[-1][1]
                partitions.append(
                    LeasedRange(
                        self.store.location,
                        self.options.queue,
                        self.options.consumer,
                        [path for path, _ in reads],
                        task,
                        [run for run in runs if run[1] >= low and run[0] <= high],
                        [whole for _, whole in reads],
                        [sizes[path] for path, _ in reads],
                    )
                )
        return partitions

    def _files_of(self, ranges: list[list[int]], version: int | None) -> pa.Table:
        """The message files that may hold the seqs of ``ranges``: those of ``version`` where
        the offset names one and its files are all still there (a replay after a vacuum
        reads the latest, as it does without a version), else the latest version's."""
        queue = self.options.queue

        def covering(snapshot: Any) -> pa.Table:
            return files_covering(snapshot, queue, ranges)

        # The files are all it needs, of the table as known: the version leased on, as a
        # rule (a replay after a restart: the latest).
        latest = self.store.snapshot(with_states=False, probe=False)
        if latest is None:
            raise TableNotFoundError(self.store.uri)
        if version is not None and version != latest.version:  # committed to since
            then = self.store.files_at(version)
            if then is not None:
                files = covering(then)
                if self.store.all_exist(files["path"].to_pylist()):
                    return files
        return covering(latest)

    # -- helpers -------------------------------------------------------------------------------

    def _require(self, states: dict[str, Any]) -> Any:
        return require_queue(states, self.options.queue, self.store.uri)


def per_partition(offset: dict) -> dict[int, dict]:
    """Each partition's offset in ``offset``: a partitioned queue's offset holds them by
    partition number; any other is partition 0's (the root's)."""
    if "partitions" not in offset:
        return {0: offset}
    return {int(k): part for k, part in offset["partitions"].items()}


def shares(total: int | None, count: int, turn: int) -> list[int | None]:
    """A batch's bound ``total`` (None: none) shared among ``count`` partitions: equal
    shares, the remainder one each to the partitions from ``turn`` on (turn by turn, so a
    bound below the count leaves no partition out for long)."""
    if total is None:
        return [None] * count
    each, rest = divmod(total, count)
    return [each + ((k - turn) % count < rest) for k in range(count)]


def in_parallel(work: Callable[[int], T], partitions: Iterable[int]) -> dict[int, T]:
    """``work(k)`` for every partition ``k`` at once, in the shared threads of
    :data:`_PARTITIONS` (each a table's requests and commits); the first error raised once
    all are done. ``work`` must not call this itself: the threads are shared."""
    chosen = list(partitions)
    if len(chosen) <= 1:
        return {k: work(k) for k in chosen}
    futures = {k: _PARTITIONS.submit(work, k) for k in chosen}
    wait(futures.values())
    return {k: future.result() for k, future in futures.items()}


class RingQueueStreamReader(Portable, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A consumer of one queue: ``spark.readStream.format("ringqueue")``.

    Made from the options in a driver-side Python worker that keeps it for the whole query
    run: ``initialOffset``, ``latestOffset`` (acknowledge and lease, one commit a table) and
    ``partitions`` run there. ``read`` runs in executor tasks on a pickled copy and takes
    everything from its :class:`LeasedRange`. The protocol, window by window, is the module
    docstring's.

    A queue without partitions is one :class:`TableStreamReader`'s, whose offsets Spark
    logs as they are. A partitioned queue is read from every partition at once: each has
    its own :class:`TableStreamReader` and offset, committed to its own table, and the
    query's offset holds them under ``partitions``, by partition number. A batch's bounds
    are shared among the partitions (:func:`shares`). A partition the queue gained after an
    offset was logged starts from its initial offset; a query whose queue is partitioned
    after it started (its offsets then are the root's) reads every partition from then on.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.root = QueueStore(options.path, options.storage)
        self.layout = Partitions(self.root)
        self.tables: dict[int, TableStreamReader] = {}
        self._served: int | None = None  # AvailableNow: the partitions there when it started
        self._default_limit: Any = None
        self._initial: dict | None = None
        self._turn = 0  # the partition a bound's remainder goes to first, batch by batch

    def table(self, partition: int) -> TableStreamReader:
        """The reader of ``partition``'s table (0: the root)."""
        found = self.tables.get(partition)
        if found is None:
            store = self.layout.store_of(self.options.queue, partition)
            found = self.tables[partition] = TableStreamReader(self.options, store)
        return found

    def _joined(self, parts: dict[int, dict]) -> dict:
        return {
            "version": OFFSET_VERSION,
            "queue": self.options.queue,
            "consumer": self.options.consumer,
            "partitions": {str(k): parts[k] for k in sorted(parts)},
        }

    def _count(self, *, fresh: bool = False) -> int:
        if self._served is not None:
            return self._served
        return self.layout.count(self.options.queue, fresh=fresh)

    # -- offsets -----------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        """Where a new query starts (:meth:`TableStreamReader.initialOffset`, for each
        partition); worked out once and kept, as Spark calls it more than once."""
        if self._initial is None:
            count = self._count(fresh=True)
            if count == 1:
                self._initial = self.table(0).initialOffset()
            else:
                self._initial = self._joined(
                    in_parallel(lambda k: self.table(k).initialOffset(), range(count))
                )
        return self._initial

    def getDefaultReadLimit(self) -> Any:
        if self.options.max_messages is not None:
            self._default_limit = ReadMaxRows(self.options.max_messages)
        elif self.options.max_bytes is not None:
            self._default_limit = ReadMaxBytes(self.options.max_bytes)
        else:
            self._default_limit = ReadAllAvailable()
        return self._default_limit

    def prepareForTriggerAvailableNow(self) -> None:
        count = self._count(fresh=True)
        in_parallel(lambda k: self.table(k).stop_at_present(), range(count))
        self._served = count

    def _bounds(self, limit: Any) -> tuple[int | None, int | None]:
        """Messages and bytes a batch may take under Spark's ``limit``."""
        options = self.options
        unbounded = isinstance(limit, ReadAllAvailable) and not isinstance(
            self._default_limit, ReadAllAvailable
        )  # Trigger.Once: read everything
        max_messages = None if unbounded else options.max_messages
        max_bytes = None if unbounded else options.max_bytes
        if isinstance(limit, ReadMaxRows):
            max_messages = limit.max_rows
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = limit.max_bytes
        return max_messages, max_bytes

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """Acknowledge what Spark committed (up to ``start``) and lease the next batch; the
        first call of a new query returns what the consumer name held first."""
        assert start is not None, "Spark 4.2 passes the start offset"
        check_offset(start, self.options.queue)
        failpoints.reached("source.latest-offset")
        max_messages, max_bytes = self._bounds(limit)
        present = None
        due = self._served is None and self.layout.counted(self.options.queue) is None
        if due and "partitions" not in start:
            # The count is read from the root, the table a queue without partitions leases
            # from: its present, read once, gives both (a root known current too long ago,
            # brought there by the count, would be read entry by entry).
            present = following(self.root, self.options.queue)
        count = self._count()
        if count == 1 and "partitions" not in start:
            end = self.table(0).advance(start, max_messages, max_bytes, present)
        else:
            end = self._advance_partitions(start, count, max_messages, max_bytes)
        if end != start:
            failpoints.reached("source.lease-committed")
        return end

    def _advance_partitions(
        self, start: dict, count: int, max_messages: int | None, max_bytes: int | None
    ) -> dict:
        """Every partition's :meth:`TableStreamReader.advance` at once, each within its
        share of the bounds; ``start`` where none leased anything."""
        starts = per_partition(start)
        begins = {k: starts.get(k) or self.table(k).initialOffset() for k in range(count)}
        messages = shares(max_messages, count, self._turn)
        if max_bytes is not None:  # each share takes a message at least, as the whole does
            max_bytes = max(1, max_bytes // count)
        self._turn += 1
        ends = in_parallel(
            lambda k: self.table(k).advance(begins[k], messages[k], max_bytes), range(count)
        )
        # A bound below the count sat partitions out (each acknowledged only): where those
        # that leased found nothing, the others take their turns now, so a batch finds
        # nothing only where every partition has nothing.
        waiting = [k for k in range(count) if messages[k] == 0]
        while waiting and all(ends[k] == begins[k] for k in ends):
            turn, waiting = waiting[: max_messages or 1], waiting[max_messages or 1 :]
            ends |= in_parallel(lambda k: self.table(k).advance(begins[k], 1, max_bytes), turn)
        if all(ends[k] == begins[k] for k in ends):
            return start
        return self._joined({**starts, **ends})

    def reportLatestOffset(self) -> dict | None:
        return None

    # -- reading a batch -----------------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> list[LeasedRange]:
        check_offset(end, self.options.queue)
        check_offset(start, self.options.queue)
        tasks = self._batch(per_partition(start), per_partition(end))
        if tasks:
            failpoints.reached("source.partitions")
        return [task for k in sorted(tasks) for task in tasks[k]]

    def _batch(self, starts: dict[int, dict], ends: dict[int, dict]) -> dict[int, list]:
        """The read tasks of each partition whose offset moved from ``starts`` to ``ends``."""
        moved = [k for k, end in ends.items() if end != starts.get(k) and end.get("ranges")]
        return in_parallel(
            lambda k: self.table(k).batch_partitions(starts.get(k, {}), ends[k]), moved
        )

    def planned_partitions(self, start: dict, end: dict) -> list[LeasedRange]:
        """The read tasks of the batch :meth:`latestOffset` just leased from ``start`` to
        ``end``, over the files of the snapshots it was planned on."""
        starts, ends = per_partition(start), per_partition(end)
        moved = [k for k, part in ends.items() if part != starts.get(k) and part.get("ranges")]
        return [task for k in moved for task in self.table(k).planned_partitions(ends[k])]

    def read(self, partition: LeasedRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        freeze_long_lived()
        for rows in read_leased(partition):
            yield from arrow_batches(rows)

    def commit(self, end: dict) -> None:
        """Not used: acknowledgement happens in the next ``latestOffset`` (module doc)."""


class DriverReadStreamReader(Portable, SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """A consumer of one queue that reads each batch as it leases it: ``readMode=driver``.

    The same protocol as :class:`RingQueueStreamReader` (it does the leasing), through
    PySpark's simple stream reader: ``read(start)`` runs in the driver-side source worker
    when Spark asks for the latest offset, leases the next batch in one commit and reads its
    rows there. PySpark hands those rows to Spark with the batch's partitions, so no
    executor task starts a Python worker for them: 55-65 ms less per micro-batch on two
    cores (docs/BENCHMARKS.md, "End-to-end latency"). The batch passes through the driver
    whole, so it is for small batches: without ``maxMessagesPerTrigger`` or
    ``maxBytesPerTrigger`` a batch takes at most :data:`DRIVER_BATCH_BYTES` of bodies.

    ``readBetweenOffsets`` replays a batch Spark logged before a restart; it runs in an
    executor task, from a pickled copy, as ``RingQueueStreamReader.read`` does.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.leases = RingQueueStreamReader(options)
        limit = self.leases.getDefaultReadLimit()
        self._limit = (
            ReadMaxBytes(DRIVER_BATCH_BYTES) if isinstance(limit, ReadAllAvailable) else limit
        )

    def initialOffset(self) -> dict:
        return self.leases.initialOffset()

    def prepareForTriggerAvailableNow(self) -> None:
        self.leases.prepareForTriggerAvailableNow()

    def read(self, start: dict) -> tuple[Iterator[pa.RecordBatch], dict]:
        leases = self.leases
        end = leases.latestOffset(start, self._limit)
        if end == start:
            return iter(()), start
        # A list's iterator: PySpark copies it to hand the batch over (a generator would not
        # copy).
        return iter(self._batches(leases.planned_partitions(start, end))), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[pa.RecordBatch]:
        freeze_long_lived()  # an executor task's worker, as RingQueueStreamReader.read's
        return iter(self._batches(self.leases.partitions(start, end)))

    def _batches(self, partitions: list[LeasedRange]) -> list[pa.RecordBatch]:
        return [
            batch
            for partition in partitions
            for rows in read_leased(partition)
            for batch in arrow_batches(rows)
        ]

    def commit(self, end: dict) -> None:
        """Not used: acknowledgement happens in the next ``read`` (module doc)."""
