"""The sink: ``df.writeStream.format("ringqueue")`` and ``df.write.format("ringqueue")``.

What runs where (the "Processes" table of ``docs/DESIGN.md``):

- The writer is created on the driver side for every micro-batch and **pickled** into the
  tasks. The batch's seqs are reserved once, in the driver-side planner process, before any
  task starts: when the batch writer is made (``DataSource.writer``), and when the
  streaming writer is pickled (:meth:`_QueueWriter.__getstate__`; ``streamWriter`` also
  makes the instance that commits, which reserves nothing). A reservation reads each table
  the write goes to (a partitioned queue's root and its partition tables): its next seq and
  its lane width (:mod:`spark_queue.model.lanes`), which the last sink commit to it
  recorded: a replayed micro-batch reads a table's width from before the batch wherever
  the batch has not committed (where it has, its commit is skipped). A refusal (a
  re-declare mismatch, not a queue table, an unreachable store) is raised there, by the
  batch writer; an error raised while pickling would reach the user as a pickling error,
  so the streaming writer carries it into its tasks, which raise it before writing
  anything.
- ``write()`` runs in executor tasks: it validates and normalises the rows, sends each row
  of a partitioned queue to its partition (its key's, or the task's sticky one), numbers
  each table's rows in the task's lane (:func:`~spark_queue.model.lanes.lane_offsets`: task
  after task, the write's arrival order), and stages Parquet files under each table's
  root. Nothing is visible yet; a failed, retried or speculative attempt leaves only
  unreferenced files.
- ``commit()`` runs on the driver, in a fresh writer instance, and publishes each table's
  staged files, evictions, dead letters and new queue states in **one** Delta commit per
  table (the tables at once), each carrying ``Transaction(app_id, batchId)`` and the table's
  lane width for the next write (:func:`~spark_queue.model.lanes.next_width`), so a replayed
  batch commits nothing twice, also where a driver died between two tables' commits
  (:func:`spark_queue.commit.enqueue.commit_enqueue`; a batch another producer of its queue
  overtook is renumbered there).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from spark_queue.commit import failpoints
from spark_queue.commit.enqueue import Reservation, commit_enqueue, reserve
from spark_queue.errors import CommitUnknownError, QueueError
from spark_queue.model.lanes import FIRST_WIDTH, WIDTH_APP, lane_offsets, next_width
from spark_queue.model.messages import normalise
from spark_queue.model.partitions import check_seqs_left, partition_uri, row_partitions
from spark_queue.model.policies import load_policies
from spark_queue.partitioned import partition_arguments, partitions_in
from spark_queue.portable import Portable
from spark_queue.spark.options import SinkOptions
from spark_queue.storage.commit_log import CommitOperation
from spark_queue.storage.files import MessageFileWriter, StagedQueueFile, delete_files
from spark_queue.storage.location import Location
from spark_queue.storage.store import QueueStore, now_micros
from spark_queue.table import QueueTable

log = logging.getLogger("spark_queue")
T = TypeVar("T")


@dataclass(frozen=True)
class TablePlan(Portable):
    """Where a write's rows of one table go: the table (a partitioned queue's partition
    ``partition``, 0 for the root), its next seq when the write was reserved, and the lane
    width the last sink commit to it recorded (None: none did)."""

    partition: int
    uri: str
    base: int
    recorded: int | None

    @property
    def width(self) -> int:
        """The write's lane width here (:func:`~spark_queue.model.lanes.lane_offsets`)."""
        return self.recorded or FIRST_WIDTH


@dataclass
class StagedTable(Portable):
    """What one task staged for one table: its files per queue, and the plan it numbered
    them by."""

    plan: TablePlan
    files: list[StagedQueueFile] = field(default_factory=list)


@dataclass
class StagedPartition(Portable, WriterCommitMessage):
    """What one task staged: its files per table and queue.

    Made by :meth:`_QueueWriter.write` in an executor task and pickled back to the driver,
    where ``commit`` gets one per task (None for a task that failed)."""

    partition: int
    query_id: str | None
    tables: list[StagedTable] = field(default_factory=list)


class _QueueWriter(Portable):
    """Shared by the batch and the streaming writer."""

    def __init__(self, options: SinkOptions, columns: list[str]) -> None:
        self.options = options
        self.columns = columns
        self.location = Location.of(options.path, options.storage)
        self._plans: list[TablePlan] | None = None
        self._turn = 0  # a batch write's rotation of keyless rows: see _write
        self._refusal: QueueError | None = None  # raised by the tasks: see the module's doc
        # Read on the driver side for every batch (the writer is made again for each), so a
        # bad file fails the batch before any task runs and an edited file applies next batch.
        self.policies = load_policies(options.policies)

    def __getstate__(self) -> dict[str, Any]:
        # Pickling ships this writer to the tasks: reserve the batch's seqs first, once.
        if self._plans is None and self._refusal is None:
            try:
                self._plans, self._turn = self._reserve()
            except QueueError as error:
                self._refusal = error
        return self.__dict__

    def reserve(self) -> None:
        """Reserve the write's seqs now, on the driver side: refusals raise here, where
        Spark reports them as they are."""
        if self._plans is None:
            self._plans, self._turn = self._reserve()

    def _reserve(self) -> tuple[list[TablePlan], int]:
        """Each table's plan: the root's, then a partitioned queue's partitions' in order;
        and the root's version, which moves a batch write's keyless rows on. A write giving
        ``partitions`` for a queue it creates declares the queue first (its partition
        tables, then the root), as ``QueueTable.declare`` does."""
        options = self.options
        store = QueueStore(self.location)
        base = reserve(store, options.queue, options.arguments, self.policies)
        count = 1
        if options.queue is not None:
            snapshot = store.snapshot(probe=False)  # as reserve just read it
            count = partitions_in(snapshot, options.queue) if snapshot is not None else 1
            given = options.arguments.get("partitions", 1)
            if given > count:  # a new queue (reserve refused another count of an old one)
                table = QueueTable(options.path, self.policies, options.storage, broker="off")
                table.declare(options.queue, **options.arguments)
                base, count = reserve(store, options.queue, options.arguments, None), given
        plans = [_plan(store, 0, base)]
        snapshot = store.snapshot(probe=False)
        turn = snapshot.version if snapshot is not None else 0
        if count > 1:
            queue = options.queue
            assert queue is not None
            own = partition_arguments(options.arguments)

            def plan_of(partition: int) -> TablePlan:
                uri = partition_uri(self.location.uri, queue, partition)
                table = QueueStore(Location(uri, self.location.options))
                return _plan(table, partition, reserve(table, queue, own, None))

            plans += _at_once(plan_of, list(range(1, count)))
        return plans, turn

    # -- tasks ------------------------------------------------------------------------------

    def _write(self, batches: Iterator[pa.RecordBatch]) -> StagedPartition:
        from pyspark import TaskContext

        if self._refusal is not None:
            raise self._refusal
        context = TaskContext.get()
        task = context.partitionId() if context else 0
        query_id = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch_id = context.getLocalProperty("streaming.sql.batchId") if context else None
        assert self._plans is not None, "the writer reached a task without a reservation"
        plans = self._plans
        # Rows without a key stay in one partition a task, moving on each micro-batch (a
        # replay's batch id is its first run's, so it sends them where that run did) or
        # each batch write (by the root's version when it was reserved).
        turn = int(batch_id) if batch_id is not None else self._turn
        keyless = (task + turn) % len(plans)
        numbering = [TaskLane(plan, task) for plan in plans]
        staging: dict[int, MessageFileWriter] = {}
        enqueued_at = now_micros()
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                rows = normalise(batch, 0, enqueued_at, self.options.queue)
                for partition, part in self._routed(rows, keyless):
                    numbered = numbering[partition].number(part)
                    if partition not in staging:
                        location = Location(plans[partition].uri, self.location.options)
                        staging[partition] = MessageFileWriter(location)
                    staging[partition].add(numbered)
            tables = [
                StagedTable(plans[partition], writer.close())
                for partition, writer in sorted(staging.items())
            ]
            failpoints.reached("sink.staged")
        except BaseException:
            for writer in staging.values():
                writer.discard()
            raise
        return StagedPartition(task, query_id, tables)

    def _routed(self, rows: pa.Table, keyless: int) -> Iterator[tuple[int, pa.Table]]:
        """``rows`` by partition: a partitioned queue's rows to their partitions (their
        key's, else ``keyless``), rows of any other queue (a ``queue`` column's) to the
        root."""
        count = len(self._plans or ())
        if count == 1:
            yield 0, rows
            return
        keys = rows["key"] if "key" in rows.column_names else None
        targets = row_partitions(keys, rows.num_rows, count, keyless)
        others = pc.not_equal(rows["queue"], self.options.queue).to_numpy(zero_copy_only=False)
        targets[others] = 0
        for partition in np.unique(targets).tolist():
            yield partition, rows.filter(pa.array(targets == partition))

    # -- the driver ---------------------------------------------------------------------------

    def _commit(self, messages: list[StagedPartition | None], batch_id: int | None) -> None:
        staged = [m for m in messages if m is not None]
        by_table = tables_of(staged)
        if not by_table:
            return
        query_id = next((m.query_id for m in staged if m.query_id), None)
        app_id = f"spark-queue-{query_id}" if (query_id and batch_id is not None) else None

        def commit_table(partition: int) -> None:
            plan, files, largest = by_table[partition]
            width = next_width(plan.recorded, largest)
            self._commit_table(plan, files, batch_id, app_id, width)

        _at_once(commit_table, sorted(by_table))
        failpoints.reached("sink.committed")

    def _commit_table(
        self,
        plan: TablePlan,
        files: list[StagedQueueFile],
        batch_id: int | None,
        app_id: str | None,
        width: int,
    ) -> None:
        """One table's share of the batch in one Delta commit, with the batch's application
        transaction and the lane width of the next write (:data:`WIDTH_APP`)."""
        store = QueueStore(Location(plan.uri, self.location.options))
        batch = Reservation(plan.base, files)
        root = plan.partition == 0
        try:
            outcome = commit_enqueue(
                store,
                batch,
                arguments=(
                    self.options.arguments if root else partition_arguments(self.options.arguments)
                ),
                policies=self.policies if root else None,
                on_reject=self.options.on_reject,
                operation=CommitOperation.ENQUEUE.on(batch=batch_id),
                app_id=app_id,
                app_version=batch_id,
                app_transactions={WIDTH_APP: width},
            )
        except CommitUnknownError:  # it may have landed: its files stay
            raise
        except BaseException:
            delete_files(store.location, [f.file.path for f in files])
            batch.discard(store)
            raise
        if outcome.replayed:
            # Already committed before a restart: this replay's files are not needed.
            delete_files(store.location, [f.file.path for f in files])
            batch.discard(store)
            log.info("batch %s was already committed to %s; replay skipped", batch_id, store.uri)
            return
        failpoints.reached("sink.partition-committed")
        if outcome.rejected:
            log.warning("batch %s: rejected %s in %s", batch_id, outcome.rejected, store.uri)

    def _abort(self, messages: list[StagedPartition | None]) -> None:
        """Delete what the tasks staged and no table's log references: a table the batch
        committed to before another's commit failed keeps its files."""
        by_table = tables_of([m for m in messages if m is not None])

        def abort_table(partition: int) -> None:
            plan, files, _ = by_table[partition]
            store = QueueStore(Location(plan.uri, self.location.options))
            snapshot = store.snapshot()
            kept = set(snapshot.files["path"].to_pylist()) if snapshot is not None else set()
            paths = [f.file.path for f in files if f.file.path not in kept]
            delete_files(store.location, paths)

        _at_once(abort_table, sorted(by_table))


@dataclass
class TaskLane:
    """A task's numbering of one table's rows: the task, and the rows it numbered so far."""

    plan: TablePlan
    task: int
    numbered: int = 0

    def number(self, rows: pa.Table) -> pa.Table:
        """``rows`` with the next seqs of the task's lane.

        Raises:
            QueueError: the table's seqs are used up, or the task is past the lanes' limits
                (nothing is committed).
        """
        n = rows.num_rows
        offsets = lane_offsets(self.task, self.plan.width, self.numbered, n)
        check_seqs_left(self.plan.uri, self.plan.partition, self.plan.base + int(offsets[-1]))
        seqs = pa.array(self.plan.base + offsets, pa.int64())
        self.numbered += n
        return rows.set_column(rows.schema.get_field_index("seq"), "seq", seqs)


def tables_of(
    staged: list[StagedPartition],
) -> dict[int, tuple[TablePlan, list[StagedQueueFile], int]]:
    """The tasks' staged files by table: each table's plan, files, and the most rows one
    task staged for it."""
    found: dict[int, tuple[TablePlan, list[StagedQueueFile], int]] = {}
    for message in staged:
        for table in message.tables:
            if table.files:
                plan, files, largest = found.get(table.plan.partition, (table.plan, [], 0))
                rows = sum(f.file.rows for f in table.files)
                found[plan.partition] = (plan, files + table.files, max(largest, rows))
    return found


def _plan(store: QueueStore, partition: int, base: int) -> TablePlan:
    """A table's plan as :func:`reserve` left it read: its recorded lane width with it."""
    snapshot = store.snapshot(probe=False)
    recorded = snapshot.transaction_version(WIDTH_APP) if snapshot is not None else None
    return TablePlan(partition, store.location.uri, base, recorded)


def _at_once(call: Callable[[int], T], items: list[int]) -> list[T]:
    """``call`` of each item, in threads where there are several (one table's commit or
    read each); every call ends before the first error is raised."""
    if len(items) <= 1:  # none: an abort of a write whose tasks staged nothing
        return [call(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
        futures = [pool.submit(call, item) for item in items]
    return [future.result() for future in futures]


class RingQueueBatchWriter(_QueueWriter, DataSourceArrowWriter):
    """``df.write.format("ringqueue")``: one Delta commit for the whole write.

    Made on the driver side, where it reserves the write's seqs, and pickled into every
    task. ``write`` runs in executor tasks and stages Parquet files; ``commit`` runs on the
    driver and publishes them in one Delta commit; ``abort`` deletes what tasks staged."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedPartition:
        return self._write(iterator)

    def commit(self, messages: list[StagedPartition | None]) -> None:  # type: ignore[override]
        self._commit(messages, None)

    def abort(self, messages: list[StagedPartition | None]) -> None:  # type: ignore[override]
        self._abort(messages)


class RingQueueStreamWriter(_QueueWriter, DataSourceStreamArrowWriter):
    """``df.writeStream.format("ringqueue")``: one Delta commit per micro-batch.

    Made on the driver side for every micro-batch and pickled into its tasks (pickling
    reserves the batch's seqs). ``write`` runs in executor tasks and stages Parquet files;
    ``commit(messages, batchId)`` runs on the driver, in a fresh instance, and publishes them
    in one Delta commit with the application transaction ``(query id, batchId)``, so a
    replayed batch is a no-op; ``abort`` deletes what tasks staged."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedPartition:
        return self._write(iterator)

    def commit(self, messages: list[StagedPartition | None], batchId: int) -> None:  # type: ignore[override]
        self._commit(messages, batchId)

    def abort(self, messages: list[StagedPartition | None], batchId: int) -> None:  # type: ignore[override]
        self._abort(messages)
