"""Group commit: the queue operations of every thread of a process on one table, one Delta
commit per round.

Every :class:`~spark_queue.table.QueueTable` of one table (same URI and storage options)
in a process shares one :class:`CommitGroup`. Callers queue requests
(:mod:`spark_queue.commit.requests`) and wait on a future; a leader thread, started on demand,
takes every request queued while the previous commit was in flight (a *round*), applies
them in arrival order to one :class:`QueueTransaction` from one snapshot, commits once and
hands each caller its own result or its own error:

- a request that cannot be applied (an unknown queue, an argument mismatch, a rejected
  ``on_reject='fail'`` publish) fails alone: the round is planned again without it;
- a request that must see the round's commit first (:meth:`Request.waits`) starts the next
  round, with every request behind it, so arrival order is kept and nobody starves;
- a lost race plans the round again on the new version after a jittered backoff, taking in
  what arrived meanwhile, until :data:`~spark_queue.commit.transaction.COMMIT_BUDGET` runs out: a
  call returns late rather than failing.

The leader plans each round on the table as this process knows it
(:meth:`QueueStore.view`: its own commits applied in memory, nothing read back); a commit's
conditional create finds out whether another writer committed first, and a round that
commits nothing checks for newer log entries before answering. The table's upkeep after a
commit (checkpoints, compaction) runs in a thread of its own, after the callers have their
answers, and rounds go on meanwhile: a caller never waits for it (a compaction's commit
rides in a round, beside the callers' requests). The leader is a daemon
thread that ends after :data:`IDLE_SECONDS` without requests.
Nothing here survives a fork (delta-rs's runtime does not either).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

try:
    import fcntl
except ImportError:  # not on Windows: no host lock there
    fcntl = None  # type: ignore[assignment]

from spark_queue.commit.backoff import backoff
from spark_queue.commit.maintenance import (
    auto_vacuum_look_due,
    auto_vacuum_safely,
    checkpoint_at,
    checkpoint_due,
    needs_compaction,
    plan_compaction,
)
from spark_queue.commit.requests import (
    CompactRequest,
    LeaseRequest,
    Outcome,
    PublishRequest,
    PublishRun,
    Request,
    Round,
    Unmergeable,
    mergeable,
)
from spark_queue.commit.transaction import COMMIT_BUDGET, QueueTransaction
from spark_queue.errors import (
    CommitConflictError,
    CommitUnknownError,
    QueueError,
    TableNotFoundError,
)
from spark_queue.storage.commit_log import Operation
from spark_queue.storage.location import Location
from spark_queue.storage.store import QueueStore, Snapshot

IDLE_SECONDS = 30.0  # a leader with nothing to do for this long ends (a new one starts)
HOST_LOCK_WAIT = 5.0  # seconds a round waits for the host lock before going on without it
COMPACTION_CHECK_ROUNDS = 8  # small files are counted every 8th round
GATHER_SECONDS = 0.002  # a round waits this long at most for the callers of the last
MAX_ROUND = 2048  # requests in one round, at most: a commit's size stays bounded

log = logging.getLogger("spark_queue")

# How long a round may wait for the callers of the last to come back: GATHER_SECONDS for
# callers in this process; longer in a broker's (set_return_wait), whose callers come back
# over an RPC.
_return_wait = GATHER_SECONDS


def set_return_wait(seconds: float) -> None:
    """Let the rounds of this process's groups wait up to ``seconds`` for the callers of the
    round before to come back (never longer than half a round, nor than 1.5 times as long as
    they took the time before): a broker's callers come back over an RPC, one at a time
    through its interpreter, several milliseconds after their answers; a round that goes
    without them splits them into cohorts that take turns, each round half as full."""
    global _return_wait
    _return_wait = max(GATHER_SECONDS, seconds)


# Told of every commit a round makes: its requests, the seconds from the round's start to
# its landed commit (planning, lost races and their backoff included), and its attempts.
RoundObserver = Callable[[int, float, int], None]


class HostLock:
    """An exclusive lock (``flock``) that the group commits of every process of this host
    take, per table, around planning and committing a round: they then take turns instead
    of losing races to each other, which wastes a whole planned round each. It only spares
    work; correctness stays with Delta's optimistic commits (other hosts, Spark jobs, and
    systems without ``fcntl``, where it does nothing). The kernel drops it with its
    process, so a killed process never holds it; one that holds it and hangs (stopped, or
    stuck on storage) delays the others by :data:`HOST_LOCK_WAIT` a round at most, after
    which they go on without it. Used by one thread at a time (the leader)."""

    def __init__(self, location: Location) -> None:
        digest = hashlib.sha256(location.uri.encode()).hexdigest()[:32]
        self.path = os.path.join(tempfile.gettempdir(), "spark-queue-locks", f"{digest}.lock")
        self._held: Any = None  # the open file whose lock this process holds
        # A child forked meanwhile shares the open file, and with it the lock, until it
        # closes its copy: it does at once.
        os.register_at_fork(after_in_child=self._forget_in_child)

    def _forget_in_child(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None

    def __enter__(self) -> None:
        if fcntl is None:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        opened = open(self.path, "a")
        try:
            fcntl.flock(opened.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._held = opened
            return
        except BlockingIOError:
            pass
        # Wait in the kernel's queue, in a thread, for HOST_LOCK_WAIT at most; a lock it
        # gets after this round gave up is released at once (closing its file).
        decided = threading.Lock()
        got = threading.Event()
        abandoned = False

        def wait() -> None:
            fcntl.flock(opened.fileno(), fcntl.LOCK_EX)
            with decided:
                if abandoned:
                    opened.close()
                else:
                    got.set()

        threading.Thread(target=wait, name="spark-queue-host-lock", daemon=True).start()
        got.wait(HOST_LOCK_WAIT)
        with decided:
            if got.is_set():
                self._held = opened
            else:
                abandoned = True

    def __exit__(self, *exc: object) -> None:
        if self._held is not None:
            self._held.close()  # closing the file releases its lock
            self._held = None


@dataclass
class Queued:
    request: Request[Any]
    future: Future[Any]


# A unit of planning: queued requests, and the one request that plans them (a run of
# publishes merged, or a request alone).
Unit = tuple[list[Queued], Request[Any]]


class RoundFailed(Exception):
    """A request failed while its round was planned: plan again without it."""


class Behind(Exception):
    """A round that commits nothing was planned on a version that is not the latest: plan
    it again on the latest (read meanwhile)."""


class LandFirst(Exception):
    """A round planned on the one before it, whose log entry is still on its way, must see
    the table as it is: that round lands (or not) first, and this one is planned again."""


@dataclass
class InFlight:
    """A round whose log entry is on its way: its callers are answered once it lands."""

    applied: list[Queued]  # its requests, answered with results
    results: list[Any]
    units: list[Unit]
    round: Round
    snapshot: Snapshot  # planned on
    next: Snapshot  # the table once it lands
    landing: Future[None]
    started: float
    attempt: int


class CommitGroup:
    """The group commit of one table in this process. Thread-safe; see the module."""

    def __init__(self, location: Location) -> None:
        self.store = QueueStore(location)
        self._host_lock = HostLock(location)
        self._lock = threading.Condition()
        self._pending: deque[Queued] = deque()
        self._leader: threading.Thread | None = None
        self._listening = threading.Lock()
        self.rounds = 0  # commits made (paces the checks for small files)
        self.budget = COMMIT_BUDGET
        self._listeners: list[Callable[[list[Operation]], None]] = []
        # The broker's metrics (:mod:`spark_queue.server.metrics`); None costs a round one
        # attribute test.
        self.observer: RoundObserver | None = None
        # Upkeep in its own thread (:meth:`_upkeep`), with a store of its own (its table
        # stays open in that thread): what is due, whether the thread lives, whether it
        # works now; all under _upkeep_signal.
        self._upkeep_store = QueueStore(location)
        self._upkeep_signal = threading.Condition()
        self._checkpoint_due: int | None = None
        self._compaction_due: Snapshot | None = None  # the version to plan one on
        self._vacuum_due = False
        self._upkeeping = False
        self._upkeep_working = False
        self._upkeep_thread: threading.Thread | None = None
        self._closed = False
        self._expected = 0  # requests the next round gathers for (see _lead)
        self._gathering = False  # the leader waits for them
        # For the gather's wait (set_return_wait): when the last round's callers were
        # answered, when the latest request came, how long the last round's callers took
        # to come back, and how long the last round took from its start to its landing.
        self._answered = 0.0
        self._arrived = 0.0
        self._came_back = 0.0
        self._round_seconds = 0.0
        self._entries = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-queue-entry")
        self._speculating = False  # the round planned now follows one still in flight

    def listen(self, callback: Callable[[list[Operation]], None]) -> None:
        """Call ``callback`` with the operations of every commit of the group, after it
        landed (quickly, without raising: it runs on the leader thread)."""
        with self._listening:
            self._listeners.append(callback)

    def unlisten(self, callback: Callable[[list[Operation]], None]) -> None:
        with self._listening:
            self._listeners.remove(callback)

    def submit(self, request: Request[Outcome]) -> Future[Outcome]:
        """Queue ``request`` for the next round; its future holds what
        :meth:`Request.apply` returned once the commit holding it has landed, or its error."""
        future: Future[Outcome] = Future()
        with self._lock:
            if self._closed:
                raise QueueError(
                    f"the commit group of {self.store.uri} is closed: the process exits"
                )
            self._pending.append(Queued(request, future))
            self._arrived = time.monotonic()
            if self._leader is None:
                self._leader = threading.Thread(
                    target=self._lead, name=f"spark-queue-group {self.store.uri}", daemon=True
                )
                self._leader.start()
            elif not self._gathering or len(self._pending) >= self._expected:
                # A gathering leader is woken once, by the request it waits for last (or
                # its timeout): each wake-up costs it the GIL, taken from the callers.
                self._lock.notify()
        return future

    # -- the leader ------------------------------------------------------------------------

    def _lead(self) -> None:
        flight: InFlight | None = None  # the round whose log entry is on its way
        while True:
            with self._lock:
                if not self._pending and flight is None and not self._closed:
                    self._lock.wait(IDLE_SECONDS)
                # A round is planned while another is in flight only where more requests
                # wait than that one holds: callers that wait for their answer all come back
                # when it lands, and a round of part of them would split them into cohorts
                # that take turns, each round half as full.
                while (
                    flight is not None
                    and len(self._pending) <= len(flight.applied)
                    and not flight.landing.done()
                    and not self._closed
                ):
                    self._lock.wait()  # more requests, or the landing
                if not self._pending and flight is None:
                    self._leader = None
                    return
                # The round in flight lands first where it has landed already (its callers
                # then join the next round) or nothing waits to be planned meanwhile.
                landing = flight is not None and (flight.landing.done() or not self._pending)
                batch = [] if landing else self._gather()
            try:
                if flight is not None and landing:
                    rest, flight = self._finish(flight), None
                else:
                    rest, flight = self._round_after(batch, flight)
            except BaseException as error:  # an unexpected failure: every caller hears of it
                waiting = [*batch, *(flight.applied if flight is not None else [])]
                for item in waiting:
                    if not item.future.done():
                        item.request.discard(self.store)
                        item.future.set_exception(error)
                rest, flight = [], None
            with self._lock:
                self._pending.extendleft(reversed(rest))  # first in the next round

    def _gather(self) -> list[Queued]:
        """The next round's requests (under ``_lock``). Callers of the last round are still
        coming back with their next request (each needs the GIL for a moment): the round
        waits for them a little, as a commit costs far more than the wait. Else synchronous
        callers split into cohorts that take turns, each round half as full. Where they take
        longer to come back (:func:`set_return_wait`), it waits as long as they took the
        time before, and half as long again."""
        wait = max(
            GATHER_SECONDS, min(_return_wait, self._round_seconds / 2, 1.5 * self._came_back)
        )
        gather_until = max(time.monotonic() + GATHER_SECONDS, self._answered + wait)
        self._gathering = True
        while len(self._pending) < self._expected and not self._closed:
            left = gather_until - time.monotonic()
            if left <= 0:
                self._came_back = wait  # not all came back: the next round waits longer
                break
            self._lock.wait(left)
        else:
            self._came_back = max(0.0, self._arrived - self._answered)
        self._gathering = False
        return self._take(MAX_ROUND)

    def _wake(self, _: object) -> None:
        """Wake the leader (a round in flight landed)."""
        with self._lock:
            self._lock.notify()

    def _take(self, limit: int) -> list[Queued]:
        taken: list[Queued] = []
        while self._pending and len(taken) < limit:
            taken.append(self._pending.popleft())
        return taken

    def _round(self, candidates: list[Queued]) -> list[Queued]:
        """Commit a prefix of ``candidates`` (those that do not wait for it) and settle their
        futures once its log entry landed; returns the rest, in order."""
        rest, flight = self._round_after(candidates, None)
        return rest if flight is None else [*self._finish(flight), *rest]

    def _finish(self, flight: InFlight) -> list[Queued]:
        """Wait for ``flight`` to land and answer its callers; where another writer won,
        plan it again (:meth:`_round_after`, its attempts and budget going on) until it
        lands or fails. Returns what is left for the next round."""
        if self._land(flight) != "lost":
            return []
        rest, again = self._round_after(
            flight.applied, None, attempt=flight.attempt, started=flight.started, lost=True
        )
        return rest if again is None else [*self._finish(again), *rest]

    def _land(self, flight: InFlight) -> str:
        """Wait for ``flight``'s log entry: ``landed`` (its callers answered, its upkeep
        started), ``lost`` (another writer won: its files deleted, its requests to plan
        again) or ``failed`` (its callers have the error)."""
        from deltalake.exceptions import CommitFailedError

        try:
            flight.landing.result()
        except CommitFailedError:
            flight.round.transaction.discard()
            discard_runs(flight.units, self.store)
            for item in flight.applied:
                item.request.forget(self.store)
            return "lost"
        except BaseException as error:
            if not isinstance(error, CommitUnknownError):  # else it may have landed: kept
                flight.round.transaction.discard()
                discard_runs(flight.units, self.store)
            for item in flight.applied:
                if not isinstance(error, CommitUnknownError):
                    item.request.discard(self.store)
                item.future.set_exception(error)
            return "failed"
        self._round_seconds = time.monotonic() - flight.started
        self._answer(flight.applied, flight.results, flight.round, flight.snapshot)
        observer = self.observer
        if observer is not None:
            observer(len(flight.applied), time.monotonic() - flight.started, flight.attempt)
        return "landed"

    def _answer(
        self, applied: list[Queued], results: list[Any], round: Round, snapshot: Snapshot
    ) -> None:
        """Settle the futures of a round's requests; after a commit, tell the listeners and
        start its upkeep first (settle() sees it)."""
        if round.transaction.committed:
            self.rounds += 1
            with self._listening:
                listeners = list(self._listeners)
            for listener in listeners:
                listener(round.operations)
            self._upkeep(snapshot)
        with self._lock:  # the next round gathers for these and their callers
            self._expected = min(MAX_ROUND, len(self._pending) + len(applied))
            self._answered = time.monotonic()
        for item, result in zip(applied, results, strict=True):
            item.future.set_result(result)

    def _round_after(
        self,
        candidates: list[Queued],
        previous: InFlight | None,
        *,
        attempt: int = 0,
        started: float | None = None,
        lost: bool = False,
    ) -> tuple[list[Queued], InFlight | None]:
        """Plan and store a round of a prefix of ``candidates`` (those that do not wait
        for it) and send its log entry on its way; returns the rest, in order, and the
        round in flight (None where it committed nothing, and its callers are answered).

        With ``previous`` in flight, the round is planned on the table as it will be once
        that lands, and its files are stored meanwhile: only then does it wait for
        ``previous``, whose callers are answered, and send its own entry. Where
        ``previous`` does not land, or the round must see the table as it is (a request
        fails, it commits nothing, a filter or a de-duplicating round before it), it is
        planned again on the table as it is. ``lost``: ``candidates`` lost a race before
        (``attempt`` attempts since ``started``): wait first, then plan again."""
        from deltalake.exceptions import CommitFailedError

        started = time.monotonic() if started is None else started
        deadline = started + self.budget
        merge = True
        present = False  # whether the next plan must read the table's present first
        while True:
            if lost:
                pause = backoff(attempt + 1)
                if time.monotonic() + pause > deadline:
                    self._conflict(candidates, attempt)
                    return [], None
                time.sleep(pause)
                with self._lock:  # what arrived meanwhile joins the next attempt
                    candidates += self._take(MAX_ROUND - len(candidates))
                lost = False
                present = True
            if previous is not None and not _may_follow(previous, candidates):
                if self._land(previous) == "lost":  # its requests go first, on the present
                    candidates = [*previous.applied, *candidates]
                    attempt, started = previous.attempt, previous.started
                    deadline = started + self.budget
                    lost = True
                previous = None
                continue
            attempt += 1
            store = self.store
            units = self._units(candidates, merge)
            with self._host_lock:
                # Planned on the table as known, without a probe (on S3, a request a round):
                # a writer that committed since makes the commit lose, and one that commits
                # nothing checks before it answers. After a lost race and its pause, on the
                # present: the writers that won kept committing during the pause.
                snapshot: Snapshot | None = previous.next if previous is not None else None
                if snapshot is None:
                    snapshot = store.snapshot(probe=present)
                    present = False
                    if snapshot is None and any(item.request.creates for item in candidates):
                        store.create()
                        snapshot = store.snapshot(probe=False)
                if snapshot is None:
                    error = TableNotFoundError(store.uri)
                    for item in candidates:
                        item.future.set_exception(error)
                    return [], None
                transaction = QueueTransaction(store, snapshot, attempt=attempt)
                round = Round(transaction)
                results: list[Any] = []
                outcome, landed = "landed", previous  # of previous, where it lands here
                self._speculating = previous is not None
                try:
                    taken = self._plan(round, units, results)
                    prepared = (
                        transaction.prepare(round.operations, round.app_versions)
                        if round.changed
                        else None
                    )
                    if previous is not None:
                        if prepared is None:
                            raise LandFirst  # it answers now: from the table as it is
                        outcome, landed = self._land(previous), previous
                        previous = None
                        if outcome != "landed":
                            raise LandFirst
                    if prepared is None and not store.is_current(snapshot):
                        raise Behind
                except LandFirst:
                    transaction.discard()
                    discard_runs(units, store)
                    candidates[:] = [item for item in candidates if not item.future.done()]
                    for item in candidates:
                        item.request.forget(store)
                    attempt -= 1  # not a lost race
                    if previous is not None:  # not landed yet
                        outcome, landed = self._land(previous), previous
                        previous = None
                    if outcome == "lost" and landed is not None:  # its requests go first
                        candidates[:] = [*landed.applied, *candidates]
                        attempt, started = landed.attempt, landed.started
                        deadline = started + self.budget
                        lost = True
                    continue
                except (RoundFailed, Unmergeable, Behind) as error:
                    transaction.discard()
                    discard_runs(units, store)
                    merge = merge and not isinstance(error, Unmergeable)
                    candidates[:] = [item for item in candidates if not item.future.done()]
                    for item in candidates:
                        item.request.forget(store)
                    attempt -= 1  # not a lost race
                    continue
                except CommitFailedError:
                    transaction.discard()
                    discard_runs(units, store)
                    lost = True
                    continue
                except BaseException:
                    transaction.discard()
                    discard_runs(units, store)
                    raise
                finally:
                    self._speculating = False
                applied = candidates[:taken]
                if prepared is None:
                    self._answer(applied, results, round, snapshot)
                    return candidates[taken:], None
                # One thread creates the group's entries, in order; the leader goes on.
                landing = self._entries.submit(transaction.publish, prepared)
                landing.add_done_callback(self._wake)
                flight = InFlight(
                    applied,
                    results,
                    units,
                    round,
                    snapshot,
                    transaction.next_snapshot(prepared),
                    landing,
                    started,
                    attempt,
                )
            return candidates[taken:], flight

    def _conflict(self, candidates: list[Queued], attempts: int) -> None:
        """Every attempt lost until the budget ran out: each caller hears so."""
        conflict = CommitConflictError(
            f"could not commit to {self.store.uri}: another writer committed first in "
            f"each of {attempts} attempts over {self.budget:g} s"
        )
        for item in candidates:
            item.request.discard(self.store)
            item.future.set_exception(conflict)

    def _upkeep(self, planned_on: Any) -> None:
        """The work after a commit (:func:`maintenance.after_commit`), in a thread of its
        own, one at a time: a log checkpoint at the interval (delta-rs replays the log
        since the last one and writes a Parquet checkpoint, ~100 ms every 50 commits) and
        compaction (hundreds of milliseconds), during which the leader commits rounds on:
        a compaction's files are read and written here, and its commit is the next round's
        (:meth:`_compact`). A checkpoint that falls due while the thread is
        busy is taken when it is done. Where the table sets ``spark_queue.autoVacuumHours``,
        also its automatic vacuum (:func:`maintenance.auto_vacuum`: once an hour for the
        whole table, listing every file under it; a process exiting waits for one under
        way)."""
        checkpoint = checkpoint_due(planned_on)
        # Looking for small files costs a few ms over the file list: every few rounds is
        # enough, as compaction waits for 32 of them.
        compaction = not self.rounds % COMPACTION_CHECK_ROUNDS and needs_compaction(planned_on)
        vacuum = auto_vacuum_look_due(self.store.uri, planned_on)
        if checkpoint is None and not compaction and not vacuum:
            return
        with self._upkeep_signal:
            if self._closed:  # close() may be joining already
                return
            if checkpoint is not None:
                self._checkpoint_due = max(self._checkpoint_due or 0, checkpoint)
            if compaction:
                self._compaction_due = planned_on
            self._vacuum_due = self._vacuum_due or vacuum
            if self._upkeeping:  # the running thread takes them
                self._upkeep_signal.notify_all()
                return
            self._upkeeping = self._upkeep_working = True
            self._upkeep_thread = threading.Thread(
                target=self._upkeep_loop, name="spark-queue-upkeep", daemon=True
            )
            self._upkeep_thread.start()

    def _upkeep_loop(self) -> None:
        """The upkeep thread: it lives while work keeps falling due and ends after
        :data:`IDLE_SECONDS` without any. Living on keeps its table open: each checkpoint
        then reads only the log entries since the last (on S3, two requests an entry),
        where a table opened afresh reads the last checkpoint and every entry since it,
        each time. A compaction reads no log: it plans on the version the leader gave it."""
        try:
            while self._upkeep_next(IDLE_SECONDS):
                pass
        finally:  # ended, even by an error its jobs did not catch: the next one starts anew
            with self._upkeep_signal:
                if self._upkeep_thread is threading.current_thread():  # not a successor
                    self._upkeeping = self._upkeep_working = False
                    self._upkeep_signal.notify_all()

    def _upkeep_next(self, wait: float) -> bool:
        """Run what is due, waiting ``wait`` seconds at most for some; False where nothing
        fell due (then the thread ends) or the group closed."""
        with self._upkeep_signal:
            self._upkeep_working = False
            if not self._any_due() and not self._closed:
                self._upkeep_signal.notify_all()  # settle(): nothing under way
                self._upkeep_signal.wait(wait)
            checkpoint, compaction, vacuum = (
                self._checkpoint_due,
                self._compaction_due,
                self._vacuum_due,
            )
            self._checkpoint_due, self._compaction_due, self._vacuum_due = None, None, False
            if checkpoint is None and compaction is None and not vacuum:
                self._upkeeping = False
                self._upkeep_signal.notify_all()
                return False
            self._upkeep_working = True
        store = self._upkeep_store
        if checkpoint is not None:
            checkpoint_at(store, checkpoint)
        if compaction is not None:
            self._compact(compaction)
        if vacuum:
            auto_vacuum_safely(store)
        return True

    def _any_due(self) -> bool:
        """Whether upkeep work has fallen due (under _upkeep_signal)."""
        return (
            self._checkpoint_due is not None or self._compaction_due is not None or self._vacuum_due
        )

    def _compact(self, planned_on: Snapshot) -> None:
        """Compact the table as it was at ``planned_on`` (its files read and written in
        this thread) and have a round commit it (:class:`CompactRequest`): the rounds are
        this process's one writer of the table, so a compaction never makes a round lose
        its race, nor loses its own, and takes no log entry of its own. Best effort, as the
        commits it follows have landed: an error is logged and a later round tries again."""
        try:
            planned = plan_compaction(self._upkeep_store, planned_on)
            if planned is None:
                return
            try:
                answer = self.submit(CompactRequest(planned))
            except QueueError:  # the group closed meanwhile: no round took its files
                planned.discard(self.store.location)
                return
            if not answer.result():  # a file it replaces is gone: another process compacted
                planned.discard(self.store.location)
        except Exception as error:  # its round deleted its files (kept where it may have landed)
            log.warning(
                "auto-compaction of %s failed, left for a later round: %s", self.store.uri, error
            )

    def settle(self) -> None:
        """Wait until the upkeep that fell due so far (a checkpoint, a compaction, an
        automatic vacuum) has run: for a caller that must see it, as a test does. Rounds go
        on meanwhile."""
        with self._upkeep_signal:
            self._upkeep_signal.wait_for(
                lambda: not self._upkeeping or (not self._upkeep_working and not self._any_due())
            )

    def close(self) -> None:
        """Let the leader finish what is queued, and end it and any compaction: delta-rs
        objects held by threads still running when the interpreter finalises crash it (a
        segmentation fault at exit). Called at exit; later requests raise ``QueueError``."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            leader = self._leader
        if leader is not None:
            leader.join()
        self._entries.shutdown()  # the leader saw every round in flight land
        with self._upkeep_signal:  # upkeep the leader started before it saw the close
            self._upkeep_signal.notify_all()
            upkeep = self._upkeep_thread
        if upkeep is not None:
            upkeep.join()

    def _units(self, candidates: list[Queued], merge: bool) -> list[Unit]:
        """The candidates as units of planning: alone, or, with ``merge``, neighbouring
        publishes of one queue and the same arguments as one :class:`PublishRun`."""
        runs: list[list[Queued]] = []
        for item in candidates:
            if merge and runs and mergeable(runs[-1][0].request, item.request):
                runs[-1].append(item)
            else:
                runs.append([item])
        return [
            # A run of more than one holds publishes only (mergeable).
            (run, PublishRun(_publishes(run)) if len(run) > 1 else run[0].request)
            for run in runs
        ]

    def _plan(self, round: Round, units: list[Unit], results: list[Any]) -> int:
        """Apply units in order until one waits for this round's commit; returns how many
        requests were applied. A failing one gets its error (every request of a run the
        same) and raises :class:`RoundFailed`, where the round was planned on the latest
        version (else :class:`Behind`); a run that cannot share out its result raises
        :class:`Unmergeable`."""
        from deltalake.exceptions import CommitFailedError

        taken = 0
        for index, (items, request) in enumerate(units):
            if index and request.waits(round):
                return taken
            round.transaction.policies = request.policies
            try:
                result = request.apply(round)
            except (CommitFailedError, Unmergeable):
                raise
            except Exception as error:
                if self._speculating:  # planned on a round still on its way
                    raise LandFirst from error
                if self._behind(round):  # its error may be the old version's (a new queue)
                    raise Behind from error
                request.discard(self.store)
                for item in items:
                    item.request.discard(self.store)
                    item.future.set_exception(error)
                raise RoundFailed from error
            results.extend(result if isinstance(request, PublishRun) else [result])
            taken += len(items)
        return taken

    def _behind(self, round: Round) -> bool:
        """Whether ``round`` was planned on a version that is not the latest (where that
        cannot be told: no, and the error stands)."""
        try:
            return not self.store.is_current(round.transaction.snapshot)
        except Exception:
            return False


def _may_follow(previous: InFlight, candidates: list[Queued]) -> bool:
    """Whether a round of ``candidates`` may be planned before ``previous`` lands: not
    after a round that recorded ids (a window is read as committed), nor for a lease with
    a filter (it runs on the committed table)."""
    if previous.round.transaction.recording:
        return False
    return not any(
        isinstance(item.request, LeaseRequest) and item.request.filter is not None
        for item in candidates
    )


def discard_runs(units: list[Unit], store: QueueStore) -> None:
    """Delete the files of the publish runs of an attempt that did not commit (the next
    attempt makes its runs again)."""
    for _, request in units:
        if isinstance(request, PublishRun):
            request.discard(store)


_GROUPS: dict[tuple[int, str, tuple[tuple[str, str], ...]], CommitGroup] = {}
_GROUPS_LOCK = threading.Lock()


@atexit.register
def _close_groups() -> None:
    with _GROUPS_LOCK:
        groups = [g for (pid, _, _), g in _GROUPS.items() if pid == os.getpid()]
    for group in groups:
        group.close()


def group_of(location: Location) -> CommitGroup:
    """The process's commit group of the table at ``location`` (made on first use)."""
    key = (os.getpid(), location.uri, tuple(sorted(location.options.items())))
    with _GROUPS_LOCK:
        group = _GROUPS.get(key)
        if group is None:
            group = _GROUPS[key] = CommitGroup(location)
        return group


def _publishes(run: list[Queued]) -> list[PublishRequest]:
    """A merged run's requests: publishes, as :func:`mergeable` joins no others."""
    return cast(list[PublishRequest], [item.request for item in run])
