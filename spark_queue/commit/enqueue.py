"""One enqueue commit: staged message files become messages of their queues.

Shared by the sink's driver-side ``commit`` and :meth:`QueueTable.publish`. Writers commit
optimistically (:func:`~spark_queue.commit.transaction.run`): a writer that loses the race plans
again on the new version. A batch's seqs were numbered from a base read before its files
were written; when another producer of the same queue committed first, the batch is
renumbered at commit (:class:`Reservation`), so seqs follow commit order.
"""

from __future__ import annotations

from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.commit.transaction import QueueTransaction, declaration, run
from spark_queue.errors import RejectedMessagesError
from spark_queue.model.messages import Bodies
from spark_queue.model.policies import Policies
from spark_queue.storage.commit_log import Operation
from spark_queue.storage.files import (
    MESSAGE,
    StagedFile,
    StagedQueueFile,
    delete_files,
    write_file,
)
from spark_queue.storage.following import following
from spark_queue.storage.store import QueueStore, Snapshot

PRODUCER_APP_PREFIX = "spark-queue-producer-"  # + producer id: a publish's application transaction


def reserve(
    store: QueueStore, queue: str | None, arguments: dict[str, Any], policies: Policies | None
) -> int:
    """The first seq of a batch whose files are staged before its commit (a Spark write's
    tasks number their rows from it), the table created where there is none. The declare of
    ``queue`` that the batch's commit makes (with ``arguments`` and ``policies``, as
    :func:`commit_enqueue` is given them) is checked here, so a refusal comes before any
    file is written; nothing is committed. Another producer committing meanwhile is the
    commit's to resolve (:class:`Reservation`).

    Raises:
        ArgumentMismatchError: ``queue`` exists with other arguments.
        NotAQueueTableError, StorageError: the table cannot be used.
    """
    snapshot = following(store)  # the commit may run in another process: it made the last
    if snapshot is None:
        store.create()
        snapshot = store.snapshot(probe=False)
    assert snapshot is not None
    if queue is not None:
        declaration(queue, snapshot.states.get(queue), arguments, policies)
    return max((s.next_seq for s in snapshot.states.values()), default=0)


class Reservation:
    """A batch's staged message files and the first seq they were numbered from.

    When another producer of one of the batch's queues committed seqs at or above the base,
    the files are rewritten with every seq shifted by one amount, past every seq of the
    table: the arrival order within the batch stays. Files a renumbering wrote are this
    object's to delete (:meth:`discard`); the staged originals are the caller's.
    """

    def __init__(self, base: int, files: list[StagedQueueFile]) -> None:
        self.base = base
        self.files = files
        self.written: list[str] = []
        self.shifted = 0  # seqs moved by renumbering, in all

    @property
    def carried(self) -> dict[str, pa.Table]:
        """The rows the tasks carried of their small files, by path: not read again."""
        return {f.file.path: f.rows for f in self.files if f.rows is not None}

    @property
    def queues(self) -> list[str]:
        return sorted({f.queue for f in self.files})

    def renumber_after(self, store: QueueStore, transaction: QueueTransaction) -> None:
        """Shift the batch's seqs past every seq of its queues that ``transaction`` sees."""
        states = transaction.states
        taken = max((states[f.queue].next_seq for f in self.files if f.queue in states), default=0)
        if taken <= self.base:
            return
        shift = transaction.next_seq - self.base
        moved = [
            StagedQueueFile(f.queue, shift_seqs(store, f.file, shift)) if f.file.rows else f
            for f in self.files
        ]
        delete_files(store.location, self.written)  # an earlier renumbering's, never committed
        self.written = [f.file.path for f in moved if f.file.rows]
        self.base, self.files = self.base + shift, moved
        self.shifted += shift

    def discard(self, store: QueueStore) -> None:
        delete_files(store.location, self.written)


class PendingBatch(Reservation):
    """One queue's messages still in memory (a publish), numbered when a commit attempt
    knows the table's last seq: the file is written inside the attempt, so it is written
    again only when another producer of the queue commits during that attempt."""

    def __init__(self, queue: str, rows: pa.Table | Bodies) -> None:
        super().__init__(-1, [])
        self.queue = queue
        self._rows = rows  # normalised, seqs from 0; or bodies, shaped on first use
        self._upload: Future[None] | None = None  # the write of the file in :attr:`written`

    @property
    def num_rows(self) -> int:
        return self._rows.num_rows

    @property
    def bodies(self) -> Bodies | None:
        """The bodies not yet shaped, where the batch is bodies only."""
        return self._rows if isinstance(self._rows, Bodies) else None

    @property
    def rows(self) -> pa.Table:
        """The stored rows, seqs from 0 (bodies are shaped here, in the thread that
        plans the commit)."""
        if isinstance(self._rows, Bodies):
            self._rows = self._rows.normalised(self.queue)
        return self._rows

    @property
    def queues(self) -> list[str]:
        return [self.queue]

    def renumber_after(self, store: QueueStore, transaction: QueueTransaction) -> None:
        state = transaction.states.get(self.queue)
        if self.files and (state is None or state.next_seq <= self.base):
            if self._upload is not None:  # an earlier attempt's file: this commit names it too
                transaction.uploads.append(self._upload)
            return
        base = transaction.next_seq
        seqs = pc.add(self.rows["seq"], pa.scalar(base, pa.int64()))
        numbered = _with_seqs(self.rows, seqs)
        self.discard(store)  # an earlier attempt's file
        staged, self._upload = transaction.stage_rows(MESSAGE, numbered)
        transaction.held_rows[staged.path] = numbered
        self.base, self.written = base, [staged.path]
        self.files = [StagedQueueFile(self.queue, staged)]

    def discard(self, store: QueueStore) -> None:
        if self._upload is not None:  # deleted before its write ends, it would stay
            wait([self._upload])
        super().discard(store)


def shift_seqs(store: QueueStore, staged: StagedFile, shift: int) -> StagedFile:
    """A copy of a staged message file with every seq ``shift`` higher."""
    rows = store.read_rows(staged.path, size=staged.size)
    seqs = pc.add(rows["seq"], pa.scalar(shift, pa.int64()))
    return write_file(store.location, MESSAGE, _with_seqs(rows, seqs))


def _with_seqs(rows: pa.Table, seqs: pa.ChunkedArray) -> pa.Table:
    return rows.set_column(rows.schema.get_field_index("seq"), "seq", seqs)


@dataclass
class EnqueueOutcome:
    """What one enqueue commit did."""

    snapshot: Snapshot  # the version it planned on
    replayed: bool = False  # the application transaction was already at or past its version
    committed: int | None = None  # the application transaction's version found (replayed)
    rejected: dict[str, int] = field(default_factory=dict)  # per queue
    accepted: dict[str, pa.Array] = field(default_factory=dict)  # seqs stored, per queue
    changes: dict[str, dict[str, int]] = field(default_factory=dict)  # counter deltas
    attempt: int = 1


def commit_enqueue(
    store: QueueStore,
    batch: Reservation,
    *,
    arguments: dict[str, Any],
    policies: Policies | None,
    on_reject: str,
    operation: Operation,
    app_id: str | None = None,
    app_version: int | None = None,
    app_transactions: dict[str, int] | None = None,
) -> EnqueueOutcome:
    """Enqueue ``batch`` in one Delta commit, with ``Transaction(app_id, app_version)`` and
    the other application transactions ``app_transactions`` (id -> version).

    Where the table's application transaction ``app_id`` is already at or past
    ``app_version``, nothing is committed (``replayed``). Files are the caller's to delete
    when this raises or replays; :meth:`Reservation.discard` deletes the renumbered ones.

    Raises:
        RejectedMessagesError: ``on_reject`` is ``fail`` and a reject policy refused messages.
        CommitConflictError: every attempt lost the race to another writer.
    """

    def work(transaction: QueueTransaction) -> EnqueueOutcome:
        outcome = EnqueueOutcome(transaction.snapshot, attempt=transaction.attempt)
        if app_id is not None and app_version is not None:
            committed = transaction.snapshot.transaction_version(app_id)
            if committed is not None and committed >= app_version:
                outcome.replayed, outcome.committed = True, committed
                return outcome
        if isinstance(batch, PendingBatch) and "message_id" in batch.rows.column_names:
            transaction.check_ids_early(batch.queue, batch.rows["message_id"])
        batch.renumber_after(store, transaction)
        transaction.held_rows.update(batch.carried)
        before = {q: dict(transaction.states[q].counters) for q in transaction.states}
        outcome.rejected = transaction.enqueue(batch.files, arguments)
        if outcome.rejected and on_reject == "fail":
            raise RejectedMessagesError(
                "onReject=fail: the queue's reject policy refused "
                + ", ".join(f"{n} message(s) of queue {q!r}" for q, n in outcome.rejected.items())
                + "; nothing of this batch was committed"
            )
        transaction.commit(
            app_id=app_id,
            app_version=app_version,
            app_transactions=app_transactions,
            operation=operation,
        )
        outcome.accepted = dict(transaction.accepted)
        for name, state in transaction.states.items():
            old = before.get(name, {})
            changed = {
                c: n - old.get(c, 0) for c, n in state.counters.items() if n != old.get(c, 0)
            }
            if changed:
                outcome.changes[name] = changed
        return outcome

    queues = batch.queues
    what = ("queue " if len(queues) == 1 else "queues ") + ", ".join(repr(q) for q in queues)
    return run(store, work, policies=policies, what=what)
