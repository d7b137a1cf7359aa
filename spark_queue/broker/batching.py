"""A client process's concurrent publishes to one broker, sharing messages on its streams
(docs/BROKER.md "Batches of publishes").

Through a broker, each caller waits for its commit and for every caller of its round to
come back: a message each way on its own stream, each taking the interpreter's lock of
both processes in turn with the others. A :class:`PublishBatcher` sends the publishes of a
process's threads that come together as one message, which the broker serves in one
thread, each publish a request of its own in the same round, and answers in one message,
each publish with its own result or its own error. The clients of a process for one
broker and table, with the same token, share one batcher (:func:`batcher_of`): each call
carries its own proof, so the calls of clients with sessions of their own share a message.

A batch goes at once where nothing else is under way. The callers of an answered batch
come back with their next publishes one after another: the next batch waits for them (at
most :data:`MAX_LINGER_SECONDS`, and half as long as the last batch took), as a broker's
round waits for its callers. While a batch is in flight, another goes only where more
publishes wait than it holds (as the group commit plans a round while another is in
flight): the broker's round in flight holds that one's, and the rest wait for its landing
anyway. Whichever caller finds a batch ready sends it on its own stream and hands each
caller its outcome; the others sleep until woken. A batch of one goes as a plain call.
Thread-safe.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from typing import Any, Protocol

import pyarrow as pa

from spark_queue.broker.streams import MAX_BATCH_CALLS, Outcome

# Batches of one batcher in flight at once, at most.
MAX_IN_FLIGHT = 4
# How long the next batch waits at most for the callers of the last one to come back.
MAX_LINGER_SECONDS = 0.01
# A batch's bytes at most (a publish that travels as a call carries short bodies only).
MAX_BATCH_BYTES = 1024 * 1024

Call = tuple[str, str | None, bytes]  # a method, its proof, its request


class Sender(Protocol):
    """What sends a batch: the calling thread's streams of its client
    (:class:`~spark_queue.broker.streams.CallStreams`)."""

    def call(self, method: str, proof: str | None, request: bytes) -> pa.Buffer:
        """One call alone: its encoded result (raises its error)."""

    def call_batch(self, calls: list[Call]) -> list[Outcome]:
        """Calls as one message: each one's outcome, in order (raises an error that is
        every one's: the stream broke, or the broker serves no streams)."""


class _Caller:
    """A publish waiting in a batcher. Its caller sleeps on ``asleep``, a lock held until
    someone wakes it (the cheapest wake-up CPython has: no condition, no lock made for
    each wait); it is released only under the batcher's lock, and only where held."""

    __slots__ = ("asleep", "batch", "call", "outcome", "sender", "size", "taken")

    def __init__(self, call: Call, sender: Sender) -> None:
        self.call = call
        self.sender = sender
        self.size = len(call[2])
        self.asleep = threading.Lock()
        self.asleep.acquire()
        self.outcome: Outcome | None = None  # set once answered
        self.batch: list[_Caller] | None = None  # a batch this caller is to send
        self.taken = False  # in a batch (its outcome comes with the batch's answer)

    def wake(self) -> None:
        """Wake the caller to look again (under the batcher's lock)."""
        if self.asleep.locked():
            self.asleep.release()


class PublishBatcher:
    """The publishes of one process to one broker for one table, sharing messages: those
    of every :class:`~spark_queue.broker.client.BrokerClient` of it in the process
    (:func:`batcher_of`), each call with its own proof. A batch goes on the streams of the
    client whose thread sends it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[_Caller] = deque()
        self._in_flight: list[int] = []  # the sizes of the batches in flight
        self._awaited = 0  # callers answered whose next publish has not come yet
        self._answered = 0.0  # time.monotonic() of the last answer
        self._batch_seconds = 0.0  # how long the last batch took
        self._watcher: _Caller | None = None  # the waiting caller that watches the time

    def call(self, call: Call, sender: Sender) -> pa.Buffer:
        """``call`` sent with the other publishes that come meanwhile (by ``sender`` where
        this thread sends the batch): its encoded result.

        Raises:
            BaseException: its own error, or its batch's (as :meth:`Sender.call_batch`
                raises).
        """
        own = _Caller(call, sender)
        with self._lock:
            self._queue.append(own)
            self._awaited = max(0, self._awaited - 1)
        while True:
            with self._lock:
                if own.outcome is not None:
                    break
                batch, own.batch = own.batch, None
                if batch is None and not own.taken:  # (taken: its batch's answer wakes it)
                    batch = self._ready()
                timeout: float | None = None
                if batch is not None:
                    if self._queue and self._watcher is None:
                        self._watcher = self._queue[0]  # left over from a full batch
                    if self._watcher is not None:
                        self._watcher.wake()  # to look again: it may be the next to send
                elif not own.taken:  # queued: one of the queued callers watches the time
                    if self._watcher is None:
                        self._watcher = own
                    if self._watcher is own and self._awaited:
                        timeout = max(0.0, self._deadline() - time.monotonic())
            if batch is None:
                own.asleep.acquire(timeout=-1 if timeout is None else timeout)
                continue
            self._run(batch, own.sender)
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
            batch[-1].taken = True
        self._in_flight.append(len(batch))
        if self._watcher in batch:
            self._watcher = None
        return batch

    def _run(self, batch: list[_Caller], sender: Sender) -> None:
        """Send ``batch`` by ``sender`` and hand each of its callers its outcome; hand the
        next batch, where one is ready, to its first caller, else wake the caller
        watching."""
        started = time.monotonic()
        outcomes: list[Outcome]
        try:
            if len(batch) == 1:
                outcomes = [sender.call(*batch[0].call)]
            else:
                outcomes = sender.call_batch([caller.call for caller in batch])
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


# The batchers of this process, by process (a batcher made before a fork is not the
# child's), broker, table and trust: held by their clients, dropped with the last of them.
_BATCHERS: weakref.WeakValueDictionary[tuple[Any, ...], PublishBatcher] = (
    weakref.WeakValueDictionary()
)
_BATCHERS_LOCK = threading.Lock()


def batcher_of(address: str, table: str, *trust: object) -> PublishBatcher:
    """The batcher of this process's publishes to the broker at ``address`` for ``table``,
    for the clients that trust it alike (``trust``: the token's key, the broker's id, the
    TLS roots): each call carries its own proof, so clients with sessions of their own
    share one, but a call never travels on the stream of a client that trusts otherwise."""
    key = (os.getpid(), address, table, *trust)
    with _BATCHERS_LOCK:
        batcher = _BATCHERS.get(key)
        if batcher is None:
            batcher = _BATCHERS[key] = PublishBatcher()
    return batcher
