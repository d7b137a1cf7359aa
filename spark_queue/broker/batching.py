"""A client process's concurrent publishes to one broker, sharing messages on its streams
(docs/BROKER.md "Batches").

Through a broker, each caller waits for its commit and for every caller of its round to
come back: a message each way on its own stream, each taking the interpreter's lock of
both processes in turn with the others. A :class:`PublishBatcher` (one per broker a
:class:`~spark_queue.broker.client.BrokerClient` talks to) sends the publishes of a
process's threads that come together as one message, which the broker serves in one
thread, each publish a request of its own in the same round, and answers in one message,
each publish with its own result or its own error.

A batch goes at once where nothing else is under way. The callers of an answered batch
come back with their next publishes one after another: the next batch waits for them (at
most :data:`MAX_LINGER_SECONDS`, and half as long as the last batch took), as a broker's
round waits for its callers. While a batch is in flight, another goes only where more
publishes wait than it holds (as the group commit plans a round while another is in
flight): the broker's round in flight holds that one's, and the rest wait for its landing
anyway. Whichever caller finds a batch ready sends it on its own stream and hands each
caller its outcome; the others wait on their own event. A batch of one goes as a plain
call. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import pyarrow as pa

from spark_queue.broker.streams import MAX_BATCH_CALLS, Outcome

# Batches of one batcher in flight at once, at most.
MAX_IN_FLIGHT = 4
# How long the next batch waits at most for the callers of the last one to come back.
MAX_LINGER_SECONDS = 0.01
# A batch's bytes at most (a publish that travels as a call carries short bodies only).
MAX_BATCH_BYTES = 1024 * 1024

Call = tuple[str, str | None, bytes]  # a method, its proof, its request
# Sends calls as one message: each one's outcome, in order (raises an error that is every
# one's: the stream broke, or the broker serves no streams).
Sender = Callable[[list[Call]], list[Outcome]]


class _Caller:
    """A publish waiting in a batcher. Its caller sleeps on ``asleep``, a lock held until
    someone wakes it (the cheapest wake-up CPython has: no condition, no lock made for
    each wait); it is released only under the batcher's lock, and only where held."""

    __slots__ = ("asleep", "batch", "call", "outcome", "size")

    def __init__(self, call: Call) -> None:
        self.call = call
        self.size = len(call[2])
        self.asleep = threading.Lock()
        self.asleep.acquire()
        self.outcome: Outcome | None = None  # set once answered
        self.batch: list[_Caller] | None = None  # a batch this caller is to send

    def wake(self) -> None:
        """Wake the caller to look again (under the batcher's lock)."""
        if self.asleep.locked():
            self.asleep.release()


class PublishBatcher:
    """The publishes of one process to one broker, sharing messages sent by ``send_many``
    (a batch of one by ``send_one``)."""

    def __init__(self, send_one: Callable[[Call], pa.Buffer], send_many: Sender) -> None:
        self._send_one = send_one
        self._send_many = send_many
        self._lock = threading.Lock()
        self._queue: deque[_Caller] = deque()
        self._in_flight: list[int] = []  # the sizes of the batches in flight
        self._awaited = 0  # callers answered whose next publish has not come yet
        self._answered = 0.0  # time.monotonic() of the last answer
        self._batch_seconds = 0.0  # how long the last batch took
        self._watcher: _Caller | None = None  # the waiting caller that watches the time

    def call(self, call: Call) -> pa.Buffer:
        """``call`` sent with the other publishes that come meanwhile: its encoded result.

        Raises:
            BaseException: its own error, or its batch's (as ``send_many`` raises).
        """
        own = _Caller(call)
        with self._lock:
            self._queue.append(own)
            self._awaited = max(0, self._awaited - 1)
        while True:
            with self._lock:
                if own.outcome is not None:
                    break
                batch, own.batch = own.batch or self._ready(), None
                timeout: float | None = None
                if batch is None:
                    if self._watcher is None or self._watcher.outcome is not None:
                        self._watcher = own
                    if self._watcher is own and self._awaited:
                        timeout = max(0.0, self._deadline() - time.monotonic())
                elif self._queue and (self._watcher is None or self._watcher in batch):
                    self._watcher = self._queue[0]  # left over from a full batch
                if batch is not None and self._watcher not in (None, own):
                    self._watcher.wake()  # to look again: it may be the next to send
            if batch is None:
                own.asleep.acquire(timeout=-1 if timeout is None else timeout)
                continue
            self._run(batch)
        if isinstance(own.outcome, BaseException):
            raise own.outcome
        return own.outcome

    def _deadline(self) -> float:
        return self._answered + min(MAX_LINGER_SECONDS, self._batch_seconds / 2)

    def _ready(self) -> list[_Caller] | None:
        """The next batch, where it is to go now (under ``_lock``): its callers taken."""
        if not self._queue or len(self._in_flight) >= MAX_IN_FLIGHT:
            return None
        full = len(self._queue) >= MAX_BATCH_CALLS
        if not full:
            if self._in_flight and len(self._queue) <= max(self._in_flight):
                return None  # they join the round after the one in flight anyway
            if self._awaited:
                if time.monotonic() < self._deadline():
                    return None
                self._awaited = 0  # those not back by now are not waited for again
        batch: list[_Caller] = []
        size = 0
        while self._queue and len(batch) < MAX_BATCH_CALLS:
            size += self._queue[0].size
            if batch and size > MAX_BATCH_BYTES:
                break
            batch.append(self._queue.popleft())
        self._in_flight.append(len(batch))
        if self._watcher in batch:
            self._watcher = None
        return batch

    def _run(self, batch: list[_Caller]) -> None:
        """Send ``batch`` and hand each of its callers its outcome; hand the next batch,
        where one is ready, to its first caller, else wake the caller watching."""
        started = time.monotonic()
        outcomes: list[Outcome]
        try:
            if len(batch) == 1:
                outcomes = [self._send_one(batch[0].call)]
            else:
                outcomes = self._send_many([caller.call for caller in batch])
        except BaseException as error:  # every caller's: each raises it
            outcomes = [error] * len(batch)
        with self._lock:
            now = time.monotonic()
            self._in_flight.remove(len(batch))
            self._batch_seconds, self._answered = now - started, now
            self._awaited += len(batch)
            for caller, outcome in zip(batch, outcomes, strict=True):
                caller.outcome = outcome
                caller.wake()
            following = self._ready()
            if following is not None:
                following[0].batch = following
                following[0].wake()
            elif self._queue:
                if self._watcher is None:
                    self._watcher = self._queue[0]
                self._watcher.wake()  # to watch the new deadline
