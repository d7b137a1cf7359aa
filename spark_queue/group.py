"""Group commit: the queue operations of every thread of a process on one table, one Delta
commit per round.

Every :class:`~spark_queue.table.QueueTable` of one table (same URI and storage options)
in a process shares one :class:`CommitGroup`. Callers queue requests
(:mod:`spark_queue.operations`) and wait on a future; a leader thread, started on demand,
takes every request queued while the previous commit was in flight (a *round*), applies
them in arrival order to one :class:`QueueTransaction` from one snapshot, commits once and
hands each caller its own result or its own error:

- a request that cannot be applied (an unknown queue, an argument mismatch, a rejected
  ``on_reject='fail'`` publish) fails alone: the round is planned again without it;
- a request that must see the round's commit first (:meth:`Request.waits`) starts the next
  round, with every request behind it, so arrival order is kept and nobody starves;
- a lost race plans the round again on the new version after a jittered backoff, taking in
  what arrived meanwhile, until :data:`~spark_queue.transaction.COMMIT_BUDGET` runs out: a
  call returns late rather than failing.

The leader keeps its Delta table open and updates it incrementally (one log entry per
round), and after each commit runs the table's upkeep (checkpoints, compaction) as any
writer does. It is a daemon thread that ends after :data:`IDLE_SECONDS` without requests.
Nothing here survives a fork (delta-rs's runtime does not either).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from spark_queue.errors import CommitConflictError, QueueError
from spark_queue.maintenance import after_commit
from spark_queue.operations import Request, Round
from spark_queue.storage import Location
from spark_queue.store import QueueStore
from spark_queue.transaction import COMMIT_BUDGET, QueueTransaction, backoff

IDLE_SECONDS = 30.0  # a leader with nothing to do for this long ends (a new one starts)
MAX_ROUND = 2048  # requests in one round, at most: a commit's size stays bounded


@dataclass
class Queued:
    request: Request
    future: Future
    arrived: float  # time.monotonic()


class RoundFailed(Exception):
    """A request failed while its round was planned: plan again without it."""


class CommitGroup:
    """The group commit of one table in this process. Thread-safe; see the module."""

    def __init__(self, location: Location) -> None:
        self.store = QueueStore(location)
        self._lock = threading.Condition()
        self._pending: deque[Queued] = deque()
        self._leader: threading.Thread | None = None
        self._listening = threading.Lock()
        self.rounds = 0  # commits made, for tests and benchmarks
        self.budget = COMMIT_BUDGET
        self._listeners: list[Callable[[], None]] = []

    def listen(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (quickly, without raising) after every commit of the group."""
        with self._listening:
            self._listeners.append(callback)

    def unlisten(self, callback: Callable[[], None]) -> None:
        with self._listening:
            self._listeners.remove(callback)

    def submit(self, request: Request) -> Future:
        """Queue ``request`` for the next round; its future holds what
        :meth:`Request.apply` returned once the commit holding it has landed, or its error."""
        future: Future = Future()
        with self._lock:
            self._pending.append(Queued(request, future, time.monotonic()))
            if self._leader is None:
                self._leader = threading.Thread(
                    target=self._lead, name=f"spark-queue-group {self.store.uri}", daemon=True
                )
                self._leader.start()
            else:
                self._lock.notify()
        return future

    # -- the leader ------------------------------------------------------------------------

    def _lead(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._lock.wait(IDLE_SECONDS)
                if not self._pending:
                    self._leader = None
                    return
                batch = self._take(MAX_ROUND)
            try:
                left = self._round(batch)
            except BaseException as error:
                for item in batch:
                    if not item.future.done():
                        item.request.discard(self.store)
                        item.future.set_exception(error)
                left = []
            with self._lock:
                self._pending.extendleft(reversed(left))  # first in the next round

    def _take(self, limit: int) -> list[Queued]:
        taken = []
        while self._pending and len(taken) < limit:
            taken.append(self._pending.popleft())
        return taken

    def _round(self, candidates: list[Queued]) -> list[Queued]:
        """Commit a prefix of ``candidates`` (those that do not wait for it) and settle their
        futures; returns the rest, in order."""
        from deltalake.exceptions import CommitFailedError

        deadline = time.monotonic() + self.budget
        attempt = 0
        while True:
            attempt += 1
            store = self.store
            table = store.open()
            if table is None and any(item.request.creates for item in candidates):
                table = store.create()
            if table is None:
                error = QueueError(f"no queue table at {store.uri}")
                for item in candidates:
                    item.future.set_exception(error)
                return []
            snapshot = store.snapshot(table)
            assert snapshot is not None
            transaction = QueueTransaction(store, snapshot, attempt=attempt)
            round = Round(transaction)
            results: list[Any] = []
            try:
                taken = self._plan(round, candidates, results)
                if round.changed:
                    transaction.commit(
                        operation="; ".join(round.operations),
                        app_transactions=round.app_versions,
                    )
            except RoundFailed:
                transaction.discard()
                candidates[:] = [item for item in candidates if not item.future.done()]
                for item in candidates:
                    item.request.forget(store)
                attempt -= 1  # not a lost race
                continue
            except CommitFailedError:
                transaction.discard()
                pause = backoff(attempt + 1)
                if time.monotonic() + pause > deadline:
                    error = CommitConflictError(
                        f"could not commit to {store.uri}: another writer committed first in "
                        f"each of {attempt} attempts over {self.budget:g} s"
                    )
                    for item in candidates:
                        item.request.discard(store)
                        item.future.set_exception(error)
                    return []
                time.sleep(pause)
                with self._lock:  # what arrived meanwhile joins the next attempt
                    candidates += self._take(MAX_ROUND - len(candidates))
                continue
            except BaseException:
                transaction.discard()
                raise
            if transaction.committed:
                self.rounds += 1
                with self._listening:
                    listeners = list(self._listeners)
                for listener in listeners:
                    listener()
            for item, result in zip(candidates[:taken], results, strict=True):
                item.future.set_result(result)
            if transaction.committed:
                after_commit(store, snapshot)
            return candidates[taken:]

    def _plan(self, round: Round, candidates: list[Queued], results: list[Any]) -> int:
        """Apply candidates in order until one waits for this round's commit; returns how
        many were applied. A failing one gets its error and raises :class:`RoundFailed`."""
        for index, item in enumerate(candidates):
            request = item.request
            if index and request.waits(round):
                return index
            round.transaction.policies = request.policies
            try:
                results.append(request.apply(round))
            except Exception as error:
                from deltalake.exceptions import CommitFailedError

                if isinstance(error, CommitFailedError):
                    raise
                request.discard(self.store)
                item.future.set_exception(error)
                raise RoundFailed from error
        return len(candidates)


_GROUPS: dict[tuple[int, str, tuple[tuple[str, str], ...]], CommitGroup] = {}
_GROUPS_LOCK = threading.Lock()


def group_of(location: Location) -> CommitGroup:
    """The process's commit group of the table at ``location`` (made on first use)."""
    import os

    key = (os.getpid(), location.uri, tuple(sorted(location.options.items())))
    with _GROUPS_LOCK:
        group = _GROUPS.get(key)
        if group is None:
            group = _GROUPS[key] = CommitGroup(location)
        return group


def call(location: Location, request: Request, finish: Callable[[Any], Any] | None = None) -> Any:
    """Submit ``request`` to the table's group and wait: its result (through ``finish``,
    in the calling thread), or its error."""
    outcome = group_of(location).submit(request).result()
    return finish(outcome) if finish is not None else outcome
