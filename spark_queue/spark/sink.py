"""The sink: ``df.writeStream.format("ringqueue")`` and ``df.write.format("ringqueue")``.

What runs where (the "Processes" table of ``docs/DESIGN.md``):

- The writer is created on the driver side for every micro-batch and **pickled** into the
  tasks. The batch's sequence numbers are reserved once, in the driver-side planner process,
  before any task starts: when the batch writer is made (``DataSource.writer``), and when
  the streaming writer is pickled (:meth:`_QueueWriter.__getstate__`; ``streamWriter`` also
  makes the instance that commits, which reserves nothing). A refusal (a re-declare
  mismatch, not a queue table, an unreachable store) is raised there, by the batch writer;
  an error raised while pickling would reach the user as a pickling error, so the streaming
  writer carries it into its tasks, which raise it before writing anything.
- ``write()`` runs in executor tasks: it validates and normalises the rows, gives each its
  ``seq`` (``base + partition * SEQ_STRIDE + row``: arrival order), and stages Parquet files
  under the table root. Nothing is visible yet; a failed, retried or speculative attempt
  leaves only unreferenced files.
- ``commit()`` runs on the driver, in a fresh writer instance, and publishes every staged
  file, the evictions, the dead letters and the new queue states in **one** Delta commit
  carrying ``Transaction(app_id, batchId)``, so a replayed batch commits nothing twice
  (:func:`spark_queue.commit.enqueue.commit_enqueue`; a batch another producer of its queue
  overtook is renumbered there).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from spark_queue.commit import failpoints
from spark_queue.commit.enqueue import Reservation, commit_enqueue, reserve
from spark_queue.errors import CommitUnknownError, InvalidInputError, QueueError
from spark_queue.model.messages import normalise
from spark_queue.model.partitions import refuse_partitioned
from spark_queue.model.policies import load_policies
from spark_queue.portable import Portable
from spark_queue.spark.options import SinkOptions
from spark_queue.storage.commit_log import CommitOperation
from spark_queue.storage.files import MessageFileWriter, StagedQueueFile, delete_files
from spark_queue.storage.location import Location
from spark_queue.storage.store import QueueStore, now_micros

SEQ_STRIDE = 1 << 32  # seqs reserved per task partition in one batch
log = logging.getLogger("spark_queue")


@dataclass
class StagedPartition(Portable, WriterCommitMessage):
    """What one task staged: its files per queue, and the reservation it used.

    Made by :meth:`_QueueWriter.write` in an executor task and pickled back to the driver,
    where ``commit`` gets one per task (None for a task that failed)."""

    partition: int
    base: int
    query_id: str | None
    files: list[StagedQueueFile] = field(default_factory=list)


class _QueueWriter(Portable):
    """Shared by the batch and the streaming writer."""

    def __init__(self, options: SinkOptions, columns: list[str]) -> None:
        self.options = options
        self.columns = columns
        self.location = Location.of(options.path, options.storage)
        self._base: int | None = None
        self._refusal: QueueError | None = None  # raised by the tasks: see the module's doc
        # Read on the driver side for every batch (the writer is made again for each), so a
        # bad file fails the batch before any task runs and an edited file applies next batch.
        self.policies = load_policies(options.policies)

    def __getstate__(self) -> dict[str, Any]:
        # Pickling ships this writer to the tasks: reserve the batch's seqs first, once.
        if self._base is None and self._refusal is None:
            try:
                self._base = self._reserve()
            except QueueError as error:
                self._refusal = error
        return self.__dict__

    def reserve(self) -> None:
        """Reserve the write's seqs now, on the driver side: refusals raise here, where
        Spark reports them as they are."""
        if self._base is None:
            self._base = self._reserve()

    def _reserve(self) -> int:
        options = self.options
        store = QueueStore(self.location)
        base = reserve(store, options.queue, options.arguments, self.policies)
        if options.queue is not None:
            snapshot = store.snapshot(probe=False)  # as reserve just read it
            state = snapshot.states.get(options.queue) if snapshot is not None else None
            stored = state.arguments.partitions if state is not None else 1
            given = options.arguments.get("partitions", 1)
            refuse_partitioned(options.queue, max(stored, given), "the Spark sink")
        return base

    # -- tasks ------------------------------------------------------------------------------

    def _write(self, batches: Iterator[pa.RecordBatch]) -> StagedPartition:
        from pyspark import TaskContext

        if self._refusal is not None:
            raise self._refusal
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        query_id = context.getLocalProperty("sql.streaming.queryId") if context else None
        assert self._base is not None, "the writer reached a task without a reservation"
        staging = MessageFileWriter(self.location)
        next_seq = self._base + partition * SEQ_STRIDE
        enqueued_at = now_micros()
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if next_seq + batch.num_rows >= self._base + (partition + 1) * SEQ_STRIDE:
                    raise InvalidInputError(
                        f"a task received more than {SEQ_STRIDE} rows in one batch"
                    )
                rows = normalise(batch, next_seq, enqueued_at, self.options.queue)
                next_seq += batch.num_rows
                staging.add(rows)
            files = staging.close()
            failpoints.reached("sink.staged")
        except BaseException:
            staging.discard()
            raise
        return StagedPartition(partition, self._base, query_id, files)

    # -- the driver ---------------------------------------------------------------------------

    def _commit(self, messages: list[StagedPartition | None], batch_id: int | None) -> None:
        staged = [m for m in messages if m is not None]
        files = [f for m in staged for f in m.files]
        if not files:
            return
        query_id = next((m.query_id for m in staged if m.query_id), None)
        app_id = f"spark-queue-{query_id}" if (query_id and batch_id is not None) else None
        store = QueueStore(self.location)
        batch = Reservation(staged[0].base, files)
        try:
            outcome = commit_enqueue(
                store,
                batch,
                arguments=self.options.arguments,
                policies=self.policies,
                on_reject=self.options.on_reject,
                operation=CommitOperation.ENQUEUE.on(batch=batch_id),
                app_id=app_id,
                app_version=batch_id,
            )
        except CommitUnknownError:  # it may have landed: its files stay
            raise
        except BaseException:
            self._abort(messages)
            batch.discard(store)
            raise
        if outcome.replayed:
            # Already committed before a restart: this replay's files are not needed.
            self._abort(messages)
            batch.discard(store)
            log.info("batch %s was already committed to %s; replay skipped", batch_id, store.uri)
            return
        failpoints.reached("sink.committed")
        if outcome.rejected:
            log.warning("batch %s: rejected %s", batch_id, outcome.rejected)

    def _abort(self, messages: list[StagedPartition | None]) -> None:
        paths = [f.file.path for m in messages if m is not None for f in m.files]
        delete_files(self.location, paths)


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
