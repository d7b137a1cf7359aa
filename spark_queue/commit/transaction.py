"""One Delta commit's worth of queue work, planned on the driver side.

A :class:`QueueTransaction` starts from a :class:`~spark_queue.storage.store.Snapshot`, lets callers
declare queues, enqueue staged messages, trim, or purge, and ends in exactly one Delta commit
holding every file it staged, the removal rows, the dead letters and the new queue states
(the previous state files are removed in the same commit). If another writer committed first,
the whole transaction is planned again from the new snapshot: see :func:`run`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.commit.backoff import backoff
from spark_queue.commit.failpoints import reached
from spark_queue.commit.maintenance import after_commit
from spark_queue.errors import (
    ArgumentMismatchError,
    CommitConflictError,
    CommitUnknownError,
    TableNotFoundError,
)
from spark_queue.model.partitions import check_seqs_left, table_partition
from spark_queue.model.policies import Policies, resolve_without_policies
from spark_queue.model.queue_arguments import (
    ARGUMENT_NAMES,
    QueueArguments,
    check_effective,
    option_name,
)
from spark_queue.model.schema import UTC_MICROS
from spark_queue.rules import (
    Level,
    MessageIndex,
    QueuePlan,
    QueueState,
    Redelivered,
    Removal,
    SeenRun,
    id_hashes,
    plan_enqueue,
    plan_settle,
)
from spark_queue.storage import dedup_window
from spark_queue.storage.commit_log import CommitOperation, CommitSummary, Operation
from spark_queue.storage.files import (
    MESSAGE,
    QUEUE,
    REMOVAL,
    SEEN,
    STATE_RECORDS,
    StagedFile,
    StagedQueueFile,
    delete_files,
    empty_rows,
    encode_file,
    record_rows,
    upload_file,
    write_file,
)
from spark_queue.storage.message_files import FileHeadReader
from spark_queue.storage.state_rows import index_rows, repeated
from spark_queue.storage.store import QueueStore, Snapshot, now_micros
from spark_queue.storage.table_view import PreparedCommit, TableView, staged_file_rows

# A commit that loses races is planned again for this long (seconds) before it fails.
COMMIT_BUDGET = 120.0
_CHECKS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="spark-queue-ids")
# Writes of a commit's files; shared, since starting threads for every commit cost more than
# a small commit's writes (about 1.5 ms of 15).
_WRITES = ThreadPoolExecutor(max_workers=8, thread_name_prefix="spark-queue-writes")
# The built-in value of every queue argument (a declare compares given ones with them),
# ``partitions`` too, which a queue's stored arguments leave out where it is 1.
BUILT_IN = {name: getattr(QueueArguments(), name) for name in ARGUMENT_NAMES}
WRITE_HERE_BYTES = 1024 * 1024  # see stage_rows
INCOMING_COLUMNS = ["seq", "size", "priority", "deliver_at", "enqueued_at", "expires_at"]
T = TypeVar("T")
# What checking incoming message ids against a queue's window finds: the ids' two hashes,
# which of them were seen already, and their hash order.
IdCheck = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class ArrivingIds:
    """The message ids of one queue's arrivals, duplicates cut: their hash lanes, and the
    positions of the set ones in hash order."""

    first: np.ndarray
    second: np.ndarray
    order: np.ndarray
    since: int  # the window's start: ids recorded earlier no longer count


@dataclass
class QueueTransaction:
    store: QueueStore
    snapshot: Snapshot
    now: int = field(default_factory=now_micros)
    states: dict[str, QueueState] = field(init=False)
    adds: list[StagedFile] = field(default_factory=list)
    written: list[StagedFile] = field(default_factory=list)  # by this transaction
    removal_rows: list[pa.Table] = field(default_factory=list)
    obsolete: list[str] = field(default_factory=list)  # staged files replaced by rewrites
    touched: set[str] = field(default_factory=set)
    summary: dict[str, dict[str, int]] = field(default_factory=dict)
    accepted: dict[str, pa.ChunkedArray] = field(default_factory=dict)  # arrivals' seqs stored
    # Policies this process applies when it declares (None: arguments stand as given/stored).
    policies: Policies | None = None
    attempt: int = 1  # of :func:`run`: above 1, another writer won the earlier ones
    committed: bool = False
    landed: TableView | None = None  # the table after the commit, once committed
    # Rows of staged files this process still holds (a publish's), by path: not read back,
    # which on an object store would cost a request per column.
    held_rows: dict[str, pa.Table] = field(default_factory=dict)
    # De-duplication: arrivals' message ids by queue (queues with a window only), the expired
    # ``seen`` files this commit removes, and the ids it records (queue, file, hashes, since).
    incoming_ids: dict[str, pa.ChunkedArray] = field(default_factory=dict)
    expired_seen: list[tuple[str, int, str]] = field(default_factory=list)
    recording: list[tuple[str, pa.Table, SeenRun, int]] = field(default_factory=list)
    early_checks: dict[str, Future[IdCheck]] = field(default_factory=dict)
    # Writes of files :meth:`stage_rows` staged, still under way.
    uploads: list[Future[None]] = field(default_factory=list)
    # A compaction's commit this one makes too (:meth:`replace_files`): the files it adds
    # and removes, and its summary's details.
    compacted: list[StagedFile] = field(default_factory=list)
    replaced: list[tuple[str, int, str]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    states_kept: bool = False  # by :meth:`prepare`: the commit keeps the state files
    _seen_files: list[str] = field(default_factory=list)  # the ids recorded, by prepare

    def __post_init__(self) -> None:
        self.states = {name: state.copy() for name, state in self.snapshot.states.items()}
        self.next_seq = max((s.next_seq for s in self.states.values()), default=0)
        self._view: tuple[int, Snapshot] | None = None

    def view(self) -> Snapshot:
        """The snapshot with the message files this transaction has staged so far: what a
        later operation of the same commit reads (a group commit leases, after a publish of
        the same round, messages that are not in the log yet). Commit from :attr:`snapshot`."""
        staged = [f for f in self.adds if f.record == MESSAGE]
        if not staged:
            return self.snapshot
        self.on_storage()  # read from there
        if self._view is None or self._view[0] != len(self.adds):
            files = pa.concat_tables([self.snapshot.files, staged_file_rows(staged)])
            view = Snapshot(
                self.snapshot.view, files, self.snapshot.states, self.snapshot.state_files
            )
            self._view = (len(self.adds), view)
        return self._view[1]

    def head_reader(self) -> FileHeadReader:
        """Heads of the queues as this transaction sees them (:meth:`view`)."""
        return self.store.head_reader(self.view())

    # -- declaring -------------------------------------------------------------------------

    def declare(self, name: str, given: dict[str, Any], *, alter: bool = False) -> QueueState:
        """Declare ``name`` with the given arguments, or check them against the queue's.

        ``given`` (validated, snake_case) are explicit arguments: a new queue remembers them,
        and with :attr:`policies` set its effective arguments are resolved from them
        (policy defaults where unset, caps as a minimum; docs/POLICIES.md). For an existing
        queue, each given argument is compared with the queue's explicit value (the built-in
        default where it has none), never with what a policy made of it: a differing one is
        an :class:`ArgumentMismatchError` unless ``alter`` is set, which merges them into the
        explicit ones. With :attr:`policies` set an existing queue is resolved again, so a
        changed policy file takes effect (the queue is then marked touched); without, its
        stored effective arguments stand (``alter`` changes only those given).
        """
        state = self.states.get(name)
        arguments, explicit, policy = declaration(name, state, given, self.policies, alter=alter)
        if state is None:
            state = QueueState(
                name, arguments, next_seq=self.next_seq, explicit=explicit, policy=policy
            )
            self.states[name] = state
            self.touched.add(name)
        elif alter or (arguments, policy) != (state.arguments, state.policy):
            state.arguments, state.explicit, state.policy = arguments, explicit, policy
            self.touched.add(name)
        return state

    # -- enqueueing ------------------------------------------------------------------------

    def enqueue(self, staged: list[StagedQueueFile], given: dict[str, Any]) -> dict[str, int]:
        """Enqueue the messages tasks staged; returns rejected counts per queue."""
        by_queue: dict[str, list[StagedFile]] = {}
        for item in staged:
            by_queue.setdefault(item.queue, []).append(item.file)
        for name in sorted(by_queue):
            self.declare(name, given)
        incoming = {name: self._incoming(name, files) for name, files in sorted(by_queue.items())}
        for arrivals in incoming.values():  # dead letters are numbered after every arrival
            if arrivals.num_rows:
                self.next_seq = max(self.next_seq, pc.max(arrivals["seq"]).as_py() + 1)
        self._check_seqs_left()
        return self._apply(incoming, by_queue)

    def _check_seqs_left(self) -> None:
        if self.next_seq:
            uri = self.store.location.uri
            check_seqs_left(uri, table_partition(uri), self.next_seq - 1)

    def settle(self, name: str) -> None:
        """Apply ``name``'s limits now (after ``alter``) and promote due scheduled messages."""
        self._apply({name: None}, {})

    def apply_plan(self, name: str, plan: QueuePlan) -> None:
        """Take a plan made for ``name`` (a lease, ack, return), dead letters included."""
        self._apply({name: None}, {}, {name: plan})

    def _apply(
        self,
        incoming: dict[str, pa.Table | None],
        staged: dict[str, list[StagedFile]],
        made: dict[str, QueuePlan] | None = None,
    ) -> dict[str, int]:
        """Plan every queue that receives messages, then every dead-letter queue they feed.

        ``incoming`` maps a queue to its arrivals (None: only settle it); dead letters join a
        queue after its own arrivals. Returns rejected counts per queue.
        """
        dead_letters: dict[str, list[pa.Table]] = {}
        rejected_counts: dict[str, int] = {}
        pending = set(incoming)
        planned: set[str] = set()
        reader = self.head_reader()
        while pending:
            name = self._next_to_plan(pending)
            pending.discard(name)
            planned.add(name)
            state = self.states[name]
            own = incoming.get(name)
            arriving = None
            if own is not None and name in self.incoming_ids:
                own, arriving = self._drop_duplicates(name, own, staged[name])
            letters = dead_letters.pop(name, [])
            rows = [own] if own is not None else []
            rows += [_incoming_of(t) for t in letters]
            if made and name in made:
                plan = made.pop(name)
            elif rows:
                plan = plan_enqueue(state, pa.concat_tables(rows), reader, self.now)
            else:
                plan = plan_settle(state, reader, self.now)
            self.states[name] = plan.state
            self.touched.add(name)
            self._record_removals(name, plan)
            letters_out = self._dead_letters(name, plan, own, staged.get(name, []))
            n_own = own.num_rows if own is not None else 0
            if arriving is not None and own is not None:
                self._record_ids(name, own, plan.accepted[:n_own], arriving)
            if own is not None:
                self.accepted[name] = own["seq"].filter(pa.array(plan.accepted[:n_own]))
                rejected = own.filter(pa.array(~plan.accepted[:n_own]))
                if rejected.num_rows:
                    rejected_counts[name] = rejected.num_rows
                    self._drop_rejected(staged[name], rejected["seq"])
                self.adds.extend(f for f in staged[name] if f.rows)
            if letters:
                arrived = pa.concat_tables(letters)
                self._add_rows((MESSAGE, arrived.filter(pa.array(plan.accepted[n_own:]))))
            if letters_out is not None:
                target = state.arguments.dead_letter_queue
                assert target is not None
                if target in planned or target == name:
                    # One hop per commit: a dead-letter cycle back to a planned queue ends here.
                    self.states[name].counters["dead_lettered"] -= letters_out.num_rows
                else:
                    self.declare(target, {})
                    dead_letters.setdefault(target, []).append(letters_out)
                    pending.add(target)
        return rejected_counts

    def _next_to_plan(self, pending: set[str]) -> str:
        """A queue none of whose pending sources dead-letter into it, else any."""
        for name in sorted(pending):
            sources = [
                s
                for s in pending
                if s != name and self.states[s].arguments.dead_letter_queue == name
            ]
            if not sources:
                return name
        return sorted(pending)[0]

    def _incoming(self, name: str, files: list[StagedFile]) -> pa.Table:
        columns = INCOMING_COLUMNS
        if self.states[name].arguments.duplicate_window:
            columns = [*INCOMING_COLUMNS, "message_id"]
        parts = [
            self.held_rows[f.path].select(columns)
            if f.path in self.held_rows
            else self.store.read_rows(f.path, columns, size=f.size)
            for f in files
        ]
        rows = pa.concat_tables(parts).sort_by("seq")
        if "message_id" in columns:
            self.incoming_ids[name] = rows["message_id"]
        return _incoming_of(rows)

    def _drop_duplicates(
        self, name: str, own: pa.Table, files: list[StagedFile]
    ) -> tuple[pa.Table, ArrivingIds]:
        """Arrivals whose ``message_id`` the queue recorded within its window, or that repeat
        an earlier arrival's, are cut out of the staged files and counted ``duplicates``;
        the ids of the rest are what this commit records, if the plan accepts them."""
        state = self.states[name]
        window_ms = state.arguments.duplicate_window
        assert window_ms
        since = self.now - window_ms * 1000
        ids = self.incoming_ids.pop(name)
        early = self.early_checks.pop(name, None)
        first, second, repeated, order = (
            early.result() if early is not None else self._check_ids(name, ids, since)
        )
        self.expired_seen.extend(dedup_window.expired_files(self.snapshot, name, since))
        order = order[~repeated[order]]  # the ids to record if accepted, in hash order
        if repeated.any():
            state.counters["duplicates"] += int(repeated.sum())
            self._drop_rejected(files, own["seq"].filter(pa.array(repeated)))
            own = own.filter(pa.array(~repeated))
            # Positions after the cut: each kept arrival moves down by the repeats before it.
            order = order - np.cumsum(repeated)[order]
        return own, ArrivingIds(first[~repeated], second[~repeated], order, since)

    def _check_ids(self, name: str, ids: pa.ChunkedArray | pa.Array, since: int) -> IdCheck:
        first, second, valid = id_hashes(ids)
        repeated, order = dedup_window.window(self.store, self.snapshot, name, since).duplicates(
            first, second, valid, since
        )
        return first, second, repeated, order

    def check_ids_early(self, name: str, ids: pa.ChunkedArray | pa.Array) -> None:
        """Start checking a publish's ids against ``name``'s window while its file is
        written (numpy and pyarrow release the GIL, so both cores work): an existing queue
        with a window only; the ids must be in seq order."""
        state = self.states.get(name)
        window_ms = state.arguments.duplicate_window if state is not None else None
        if window_ms:
            since = self.now - window_ms * 1000
            self.early_checks[name] = _CHECKS.submit(self._check_ids, name, ids, since)

    def _record_ids(
        self, name: str, own: pa.Table, accepted: np.ndarray, arriving: ArrivingIds
    ) -> None:
        """The ``seen`` rows of the ids this commit enqueued to ``name``, written with the
        commit's other files."""
        order = arriving.order[accepted[arriving.order]]
        if not len(order):
            return
        run = SeenRun.of_ordered(arriving.first, arriving.second, self.now, order)
        seqs = own["seq"].to_numpy()[order]
        self.recording.append(
            (name, dedup_window.seen_rows(name, run, seqs, self.now), run, arriving.since)
        )

    def _drop_rejected(self, files: list[StagedFile], rejected_seqs: pa.ChunkedArray) -> None:
        """Rewrite staged files without rejected messages: those are never stored."""
        self.on_storage()
        for index, staged in enumerate(files):
            rows = self.store.read_rows(staged.path, size=staged.size)
            keep = pc.invert(pc.is_in(rows["seq"], rejected_seqs.combine_chunks()))
            if pc.all(keep).as_py():
                continue
            kept = rows.filter(keep)
            replacement = write_file(self.store.location, MESSAGE, kept) if kept.num_rows else None
            self.obsolete.append(staged.path)  # deleted once the commit succeeded
            if replacement is not None:
                self.written.append(replacement)
                files[index] = replacement
            else:
                files[index] = StagedFile(staged.path, 0, MESSAGE, staged.stats, 0)

    def _dead_letters(
        self, name: str, plan: QueuePlan, own: pa.Table | None, staged: list[StagedFile]
    ) -> pa.Table | None:
        """Copies of what ``name`` dead-letters, as new messages of its dead-letter queue."""
        target = plan.state.arguments.dead_letter_queue
        if target is None:
            return None
        reasons = plan.dead_letters()
        if own is not None and plan.rejected_to_dlq.any():
            rejected = own["seq"].to_numpy()[plan.rejected_to_dlq[: own.num_rows]]
            reasons["maxlen"] = np.concatenate(
                [reasons.get("maxlen", np.zeros(0, np.int64)), rejected]
            )
        if not reasons:
            return None
        reason_of = {seq: reason for reason, seqs in reasons.items() for seq in seqs.tolist()}
        seqs = np.array(sorted(reason_of), dtype=np.int64)
        wanted = pa.array(seqs, type=pa.int64())
        parts = [self.store.read_messages(self.view(), name, seqs)]
        self.on_storage()
        for f in staged:
            if f.rows:
                rows = self.store.read_rows(f.path, size=f.size)
                parts.append(rows.filter(pc.is_in(rows["seq"], wanted)))
        originals = pa.concat_tables(parts).sort_by("seq")
        count = originals.num_rows
        new_seqs = np.arange(self.next_seq, self.next_seq + count, dtype=np.int64)
        self.next_seq += count
        self._check_seqs_left()
        moved = {
            "queue": pa.array([target] * count, pa.string()),
            "seq": new_seqs,
            "death_reason": pa.array(
                [reason_of[s] for s in originals["seq"].to_pylist()], pa.string()
            ),
            "original_queue": pa.array([name] * count, pa.string()),
            "original_seq": originals["seq"],
            "died_at": pa.array(np.full(count, self.now), pa.int64()).cast(UTC_MICROS),
            "enqueued_at": pa.array(np.full(count, self.now), pa.int64()).cast(UTC_MICROS),
            "deliver_at": pa.nulls(count, UTC_MICROS),
            "delivery_count": pa.array(np.zeros(count, np.int32)),
        }
        for column in ("message_id", "key", "body", "size", "headers", "priority", "expires_at"):
            moved[column] = originals[column]
        return empty_rows(moved, count)

    # -- other operations ------------------------------------------------------------------

    def purge(self, name: str, live_seqs: np.ndarray) -> int:
        """Remove the ready and scheduled messages ``live_seqs`` of ``name`` (outcome
        ``purged``), as they are after catching up with the clock; leases stay."""
        self.settle(name)
        state = self.states[name]
        count = len(live_seqs)
        state.counters["purged"] += count
        state.levels = {p: Level(head=state.next_seq) for p in state.levels}
        state.scheduled, state.extras, state.holes = MessageIndex(), MessageIndex(), set()
        state.redelivered = Redelivered()
        self._record_removals(
            name,
            QueuePlan(
                state, np.zeros(0, bool), np.zeros(0, bool), [Removal(live_seqs, "purged", None)]
            ),
        )
        return count

    # -- writing ---------------------------------------------------------------------------

    def _record_removals(self, name: str, plan: QueuePlan) -> None:
        for removal in plan.removals:
            count = len(removal.seqs)
            if not count:
                continue
            self.removal_rows.append(
                record_rows(
                    {
                        "queue": repeated(name, count, pa.string()),
                        "seq": removal.seqs,
                        "outcome": repeated(removal.outcome, count, pa.string()),
                        "event_at": repeated(self.now, count, pa.int64()).cast(UTC_MICROS),
                    }
                )
            )
            counts = self.summary.setdefault(name, {})
            counts[removal.outcome] = counts.get(removal.outcome, 0) + count

    def stage_rows(self, record: str, rows: pa.Table) -> tuple[StagedFile, Future[None]]:
        """``rows`` as a file of this commit, and its write: encoded here (its size and
        statistics are known at once), stored in the background while the commit is planned
        and its other files written (on an object store, one request less in a row). Reads
        of the file from storage, and the commit, wait for it (:meth:`on_storage`); whoever
        deletes the file waits for the returned write first."""
        staged, data = encode_file(record, rows)
        # A small file's write to a local disk costs less than handing it to a thread and
        # back; a large one's goes on while the commit is planned.
        here = not self.store.entries.remote and data.size <= WRITE_HERE_BYTES
        run = run_here if here else _WRITES.submit
        upload = run(upload_file, self.store.location, staged.path, data)
        self.uploads.append(upload)
        return staged, upload

    def on_storage(self) -> None:
        """Wait until every file :meth:`stage_rows` staged is stored; raises the first write
        error."""
        uploads, self.uploads = self.uploads, []
        wait(uploads)
        for upload in uploads:
            upload.result()

    def _add_rows(self, *parts: tuple[str, pa.Table | None]) -> list[StagedFile]:
        """Write each non-empty (record, rows) part as a file of this commit. Several parts
        are written at once: pyarrow releases the GIL while it encodes, and a large batch's
        removal rows and lease index are a million rows each."""
        writes = [(record, rows) for record, rows in parts if rows is not None and rows.num_rows]
        # One write alone is not handed to a thread: the commit waits for it all the same.
        run = _WRITES.submit if len(writes) > 1 else run_here
        futures = [run(write_file, self.store.location, *write) for write in writes]
        wait(futures)
        staged = [future.result() for future in futures if future.exception() is None]
        self.written.extend(staged)  # discarded on failure, whichever part failed
        self.adds.extend(staged)
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
        return staged

    def _queue_rows(self) -> pa.Table:
        names = sorted(self.states)
        return record_rows(
            {
                "queue": names,
                "queue_state": [self.states[n].to_json() for n in names],
                "event_at": pa.array(np.full(len(names), self.now), pa.int64()).cast(UTC_MICROS),
            }
        )

    def commit(
        self,
        *,
        app_id: str | None = None,
        app_version: int | None = None,
        operation: Operation | Sequence[Operation],
        app_transactions: dict[str, int] | None = None,
    ) -> None:
        """Write removals and states and publish everything in one Delta commit of
        ``operation`` (a group commit's: several), with the application transaction
        ``(app_id, app_version)`` and ``app_transactions``."""
        versions = dict(app_transactions or {})
        if app_id is not None and app_version is not None:
            versions[app_id] = app_version
        self.publish(self.prepare(operation, versions))

    def prepare(
        self, operation: Operation | Sequence[Operation], transactions: dict[str, int]
    ) -> PreparedCommit:
        """The first half of :meth:`commit`: every file of the commit stored, its log entry
        ready (:meth:`QueueStore.prepare`); :meth:`publish` creates it. A commit of
        compactions alone changes no queue state: it keeps the state files."""
        operations = [operation] if isinstance(operation, str) else operation
        self.states_kept = bool(operations) and all(
            Operation(o).kind is CommitOperation.COMPACT for o in operations
        )
        written = self._add_rows(
            *((SEEN, rows) for _, rows, _, _ in self.recording),
            (REMOVAL, pa.concat_tables(self.removal_rows) if self.removal_rows else None),
            *(
                ()
                if self.states_kept
                else ((QUEUE, self._queue_rows()), *index_rows(self.states).items())
            ),
        )
        self._seen_files = [staged.path for staged in written[: len(self.recording)]]
        self.on_storage()  # the log never names a file that is not there
        reached("commit.files-stored")
        replaced_states = [] if self.states_kept else self.snapshot.state_files
        return self.store.prepare(
            self.snapshot,
            [*self.adds, *self.compacted],
            [*replaced_states, *self.expired_seen, *self.replaced],
            transactions,
            CommitSummary.of(
                operation,
                queues=sorted(self.touched),
                attempt=self.attempt,
                removed=self.summary,
                details=self.details,
            ),
        )

    def replace_files(
        self, adds: list[StagedFile], removes: list[tuple[str, int, str]], details: dict[str, Any]
    ) -> bool:
        """Make a compaction's commit (files it stored, files they replace) part of this
        one, where every file it removes is in :attr:`snapshot` and no other compaction of
        this commit removes it; returns whether it did. Its files stay out of :meth:`view`:
        the rows they hold are those of the files they replace, which the view still has."""
        paths = [path for path, _, _ in removes]
        files = self.snapshot.files["path"]
        present = pc.sum(pc.is_in(files, value_set=pa.array(paths, pa.string()))).as_py() or 0
        taken = {path for path, _, _ in self.replaced}
        if present != len(set(paths)) or taken.intersection(paths):
            return False
        self.compacted.extend(adds)
        self.replaced.extend(removes)
        for key, value in details.items():
            self.details[key] = self.details.get(key, 0) + value
        return True

    def publish(self, prepared: PreparedCommit) -> None:
        """The second half of :meth:`commit`: create the log entry, then remember what
        landed (the queue states, the ids recorded) and delete what it replaced. Where the
        store fails on the way (:class:`CommitUnknownError`), the commit may have landed:
        its files stay (:meth:`discard` deletes none)."""
        try:
            self.landed = self.store.publish(prepared)
        except CommitUnknownError:
            self.written = []
            raise
        self.committed = True
        for (name, _, run, since), path in zip(self.recording, self._seen_files, strict=True):
            dedup_window.remember(self.store, name, path, run, since)
        if not self.states_kept:  # else the states known for the state files still hold
            self.store.remember_states(
                [a.path for a in self.adds if a.record in STATE_RECORDS], self.states
            )
        delete_files(self.store.location, self.obsolete)

    def next_snapshot(self, prepared: PreparedCommit) -> Snapshot:
        """The table as it will be once ``prepared`` (this transaction's) lands: what the
        next commit may be planned on before then."""
        landed = prepared.landed
        states = {name: state.copy() for name, state in self.states.items()}
        return Snapshot(landed, landed.files, states, landed.state_files)

    def discard(self) -> None:
        """Delete the files this transaction wrote itself (not the tasks' staged files, nor
        those of :meth:`stage_rows`, whose owners delete them once written)."""
        delete_files(self.store.location, [f.path for f in self.written])


def run_here(function: Callable[..., T], *args: Any) -> Future[T]:
    """``function(*args)`` run in this thread, as the future a thread pool's worker gives:
    where it would wait for the answer at once, a thread costs two handoffs for nothing."""
    done: Future[T] = Future()
    try:
        done.set_result(function(*args))
    except BaseException as error:  # the caller's, from the future, as from a worker
        done.set_exception(error)
    return done


def declaration(
    name: str,
    state: QueueState | None,
    given: dict[str, Any],
    policies: Policies | None,
    *,
    alter: bool = False,
) -> tuple[QueueArguments, dict[str, Any], str | None]:
    """What declaring queue ``name`` with ``given`` makes of it, changing nothing: its
    effective arguments, its explicit ones and the policy that applies
    (:meth:`QueueTransaction.declare` says how). ``state``: the queue as the table has it,
    None for a new queue.

    Raises:
        ArgumentMismatchError: the queue exists with other explicit arguments (not ``alter``).
        InvalidOptionError: the effective arguments do not go together.
    """
    if state is None:
        explicit = dict(given)
        if policies is None:
            resolution = resolve_without_policies(name, explicit)
        else:
            resolution = policies.resolve(name, explicit)
        return resolution.arguments, explicit, resolution.policy
    explicit = dict(state.explicit)
    if not alter:
        differ = [
            (k, explicit.get(k, BUILT_IN[k]), v)
            for k, v in given.items()
            if explicit.get(k, BUILT_IN[k]) != v
        ]
        if differ:
            shown = "; ".join(
                f"{option_name(k)}: queue has {_stored(k, explicit, state)}, given {_value(new)}"
                for k, _, new in differ
            )
            raise ArgumentMismatchError(
                f"queue {name!r} exists with other arguments ({shown}); nothing was "
                "written. To change them use alter (QueueTable.alter, spark-queue alter)"
            )
    else:
        explicit.update(given)
    if policies is not None:
        resolution = policies.resolve(name, explicit)
        return resolution.arguments, explicit, resolution.policy
    arguments = state.arguments.merged(given if alter else {})
    check_effective(arguments, queue=name)
    return arguments, explicit, state.policy


def _stored(argument: str, explicit: dict[str, Any], state: QueueState) -> str:
    """For a mismatch message: the queue's explicit value of ``argument``, or that it set
    none and what is in effect (a built-in or a policy's default)."""
    if argument in explicit:
        return _value(explicit[argument])
    return f"no value set (in effect {_value(getattr(state.arguments, argument))})"


def _value(value: Any) -> str:
    return "none" if value is None else repr(value)


def _incoming_of(rows: pa.Table) -> pa.Table:
    """The columns :func:`plan_enqueue` reads, from message rows (times as microseconds)."""
    return pa.table(
        {
            "seq": rows["seq"],
            "size": rows["size"],
            "priority": rows["priority"],
            "deliver_at": rows["deliver_at"].cast(pa.int64()),
            "enqueued_at": rows["enqueued_at"].cast(pa.int64()),
            "expires_at": rows["expires_at"].cast(pa.int64()),
        }
    )


def run(
    store: QueueStore,
    work: Callable[[QueueTransaction], T],
    *,
    create: bool = True,
    attempts: int | None = None,
    budget: float = COMMIT_BUDGET,
    policies: Policies | None = None,
    what: str = "the queue table",
    present: Callable[[], Snapshot | None] | None = None,
) -> T:
    """Plan ``work`` on the table as this process knows it and commit; plan again if
    another writer won.

    ``work`` performs the operations and calls :meth:`QueueTransaction.commit`; what it
    returns is returned. The commit's conditional create finds out whether another writer
    committed first; where ``work`` commits nothing or raises, the snapshot is checked to be
    the latest first (one request), and ``work`` runs again on the latest where it was not,
    so no answer comes from an old version. Errors that are not commit conflicts propagate,
    with this transaction's own files deleted. ``policies`` are applied by every declare it makes.
    After a commit it runs the post-commit work (:func:`maintenance.after_commit`: a log
    checkpoint at the interval, compaction when small files piled up), whoever committed.

    ``present`` reads the table at its latest version for every attempt, in place of the
    table as known (:func:`~spark_queue.storage.following.following`: for a process that
    plans on commits others make, which would find the table as known behind as a rule);
    ``work`` that commits nothing or raises then answers from it, with no look of its own.

    Lost races are retried after :func:`backoff` for ``budget`` seconds (a busy table makes
    a call late rather than failed), or for ``attempts`` attempts where that is given.

    Raises:
        CommitConflictError: every commit lost to another writer until the budget (or the
            attempts) ran out; the message names ``what``, e.g. the queue, and the attempts.
    """
    from deltalake.exceptions import CommitFailedError

    deadline = time.monotonic() + budget
    attempt = 0
    while attempt < attempts if attempts is not None else True:
        attempt += 1
        if attempt > 1:
            pause = backoff(attempt)
            if attempts is None and time.monotonic() + pause > deadline:
                attempt -= 1  # not made
                break
            time.sleep(pause)
        if create:
            store.create()
        # A first attempt plans on the table as known (its create finds out); after a lost
        # race and the pause, on the present: other writers committed during the pause, and
        # planning on the table as it was when the race was lost would lose again.
        snapshot = present() if present is not None else store.snapshot(probe=attempt > 1)
        if snapshot is None:
            raise TableNotFoundError(store.uri)
        transaction = QueueTransaction(store, snapshot, policies=policies, attempt=attempt)
        try:
            result = work(transaction)
        except CommitFailedError:
            transaction.discard()
            continue
        except Exception as error:
            transaction.discard()
            if (
                present is None
                and not isinstance(error, CommitUnknownError)
                and _behind(store, snapshot)
            ):
                # its error may be the old version's
                attempt -= 1  # not a lost race: planned again on the latest at once
                continue
            raise
        except BaseException:
            transaction.discard()
            raise
        if transaction.committed:
            after_commit(store, snapshot)
        elif present is None and _behind(store, snapshot):
            attempt -= 1
            continue
        return result
    raise CommitConflictError(
        f"could not commit to {what} in {store.uri}: another writer committed first in each "
        f"of {attempt} attempts"
    )


def _behind(store: QueueStore, snapshot: Snapshot) -> bool:
    """Whether ``snapshot`` is not of the table's latest version (where that cannot be
    told: no, and what was planned on it stands)."""
    try:
        return not store.is_current(snapshot)
    except Exception:
        return False
