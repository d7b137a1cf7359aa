"""Clients for services: a :class:`Consumer` (SQS, Kafka, pika consumers as models) and a
:class:`Publisher` (Kafka's producer: linger and batch size), on a :class:`QueueTable`.

Both run in the calling process and commit through its group commit (:mod:`spark_queue.
group`), so many clients of one table in one process share commits. They use only the
table's public operations (``lease``, ``ack``, ``cancel``, ``extend``, ``release``,
``publish``), from threads of their own, so whatever serves those operations serves them.

The consumer's background thread prefetches, flushes acknowledgements, extends leases and
long-polls; the publisher's sends batches. Both are thread-safe and context managers;
neither survives a fork.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from spark_queue.errors import (
    BrokerAuthenticationError,
    BrokerError,
    BrokerRequestError,
    ClientClosedError,
    CommitConflictError,
    InvalidOptionError,
    StorageError,
)
from spark_queue.model.arguments import (
    POSITIVE,
    SEQ,
    parse_consumer_name,
    parse_duration_ms,
    parse_given,
    parse_queue_name,
    parse_seq,
    shown,
)
from spark_queue.model.messages import as_input_table
from spark_queue.model.queue_arguments import validate_arguments
from spark_queue.model.schema import LEASE_VERSION_KEY

if TYPE_CHECKING:
    from spark_queue.model.results import PublishOutcome
    from spark_queue.storage.store import QueueStore


class QueueOperations(Protocol):
    """What the clients use of a table: :class:`~spark_queue.table.QueueTable`'s
    operations, with their signatures (anything serving them, a broker's stub say, serves
    the clients); ``store`` is read for long polling."""

    store: QueueStore

    def lease(self, queue: str, consumer: str = ..., **options: Any) -> pa.Table: ...

    def ack(self, queue: str, seqs: list[int], consumer: str | None = ...) -> int: ...

    def cancel(
        self,
        queue: str,
        seqs: list[int],
        consumer: str | None = ...,
        *,
        delay: str | int | None = ...,
    ) -> int: ...

    def extend(self, queue: str, seqs: list[int], consumer: str, period: str | int) -> int: ...

    def release(
        self, consumer: str, queue: str | None = ..., *, seqs: list[int] | None = ...
    ) -> int: ...

    def publish_outcome(self, queue: str, rows: Any, **options: Any) -> PublishOutcome: ...


DEFAULT_LEASE_PERIOD = "30 seconds"
LOCAL_POLL_MS = 25  # between two log checks of an idle consumer, at most: local disk
OBJECT_STORE_POLL_MS = 100  # and on an object store, where each is a request
DEFAULT_ACK_INTERVAL_MS = 1000  # a quarter of the lease period where that is shorter
RECEIVERS_SEEN = 5.0  # seconds: threads that received within this long share the handling
GROWTH = 32  # a prefetch that ran dry grows this many times: a fast handler is fed soon
FIRST_POLL_INTERVAL = 0.005  # seconds: an idle consumer's first log check comes this soon
GATHER_SECONDS = 0.002  # a publisher waits this long at most for a landed batch's senders
# A consumer's background thread tries again after a transient failure, waiting from the
# first delay, doubled each time up to the last (jittered down by up to half).
FIRST_RETRY_DELAY = 0.1
MAX_RETRY_DELAY = 5.0

log = logging.getLogger(__name__)


def transient(error: BaseException) -> bool:
    """Whether a consumer's background thread tries again after ``error``: the store or a
    broker failed, or every commit attempt lost its race; not a missing queue, a bad option
    or a refused token, which trying again would not mend."""
    if isinstance(error, BrokerAuthenticationError | BrokerRequestError):
        return False
    return isinstance(error, StorageError | CommitConflictError | BrokerError | OSError)


@dataclass
class Message:
    """A message a :class:`Consumer` delivered: ack it, or nack it, once handled."""

    queue: str
    seq: int
    body: bytes
    key: str | None
    headers: dict[str, str] | None
    message_id: str | None
    priority: int
    delivery_count: int  # 1 on the first delivery
    enqueued_at: datetime | None
    consumer: Consumer = field(repr=False, compare=False)

    def ack(self) -> None:
        """Acknowledge it (batched: see :class:`Consumer`)."""
        self.consumer.ack(self)

    def nack(self, delay: str | int | None = None) -> None:
        """Return it to the queue now (see :meth:`Consumer.nack`)."""
        self.consumer.nack(self, delay)


class Consumer:
    """Messages of ``queue`` for consumer ``name``, one at a time (iterate, or
    :meth:`receive`) or in batches (:meth:`batches`), with prefetch, batched
    acknowledgements, lease extension and long polling. Made by :meth:`QueueTable.consumer`.

    - **Prefetch**: leases are taken ahead of the handler, sized to keep it busy without
      hoarding. The consumer measures how long a lease takes (``r``) and how long the
      handler takes a message (``h``: from a message's delivery to the same thread's next
      :meth:`receive`, over the threads receiving), so ``need = ceil(r / h)`` messages are
      handled while a lease is in flight: it leases again once fewer than ``need`` are
      prefetched, up to ``need + need // 2``. A handler slower than a lease holds one message
      in hand and at most one ahead; a fast one is fed by leases of up to ``max_prefetch``.
      Before both are measured the size starts at 1 and grows 32-fold whenever the handler
      finds nothing prefetched after a full lease. Messages prefetched and in hand
      (delivered, not acked or nacked) are never more than ``max_prefetch``, as pika's
      ``prefetch_count``, so a slow handler holds few messages and other workers get the
      rest.
    - **Acknowledgements** are batched: flushed once ``ack_batch`` are pending, once the
      oldest has waited ``ack_interval_ms`` (None: 1 s, or a quarter of the lease
      period where shorter; it must stay below half of it, since an acknowledged message's
      lease is no longer extended), and on :meth:`flush` and :meth:`close`;
      a flush and a lease go to the table together (one commit, where the group commit can).
    - **Lease extension**: every lease runs for ``lease_period``; the leases of messages
      prefetched or in hand are extended once half of it has passed, so a message is never
      redelivered while it is handled, however slow the handler, as long as this process
      lives. A killed process's leases run out and their messages are delivered again.
    - **Long polling**: a consumer that finds nothing waits for a new table version (a stat
      of the next log entry, every ``max_poll_interval_ms`` at most (None: 25 ms on a
      local disk, 100 ms on an object store, where each check is a request), starting at 5 ms;
      commits of this process wake it at once), and leases again at least every
      ``idle_lease_interval_ms`` (scheduled messages falling due, leases running out
      make no version).
    - :meth:`close` flushes acknowledgements and releases every message prefetched or in
      hand and not acknowledged (ready at once; no delivery limit counted).

    - **Transient failures** of the background thread (the store cannot be reached, a
      broker failed, every commit attempt lost its race) are waited out: it tries again
      with a jittered backoff from 0.1 s up to 5 s apart, acknowledgements and extensions
      kept for the next try, and logs a warning when a streak starts and when it ends.
      Leases run on meanwhile: an outage longer than ``lease_period`` lets another worker
      have the messages in hand (acknowledging them then ends nothing).

    Thread-safe: many threads may receive from one consumer. Other errors of the background
    thread (an unknown queue, a refused token, say) are raised by the next :meth:`receive`.
    """

    def __init__(
        self,
        table: QueueOperations,
        queue: str,
        name: str,
        *,
        max_prefetch: int = 1000,
        lease_period: str | int = DEFAULT_LEASE_PERIOD,
        ack_batch: int = 1000,
        ack_interval_ms: str | int | None = None,
        max_poll_interval_ms: str | int | None = None,
        idle_lease_interval_ms: str | int = 1000,
        max_deliveries: int = 0,
        max_cancels: int = 0,
        filter: str | None = None,
    ) -> None:
        # Every option is checked here, by the specification's parsers (durations in its
        # one grammar: a whole number of milliseconds, or a number with a unit), so a bad
        # one fails when the consumer is made, never in its background thread.
        parse_queue_name("queue", queue)
        parse_consumer_name("name", name)
        period_ms = parse_duration_ms("lease_period", lease_period, minimum_ms=1)
        given = parse_given(
            "consumer",
            {
                "max_prefetch": max_prefetch,
                "ack_batch": ack_batch,
                "ack_interval_ms": ack_interval_ms,
                "max_poll_interval_ms": max_poll_interval_ms,
                "idle_lease_interval_ms": idle_lease_interval_ms,
                "max_deliveries": max_deliveries,
                "max_cancels": max_cancels,
                "filter": filter,
            },
        )
        interval_ms: float | None = given["ack_interval_ms"]
        if interval_ms is None:
            interval_ms = min(DEFAULT_ACK_INTERVAL_MS, period_ms / 4)
        if interval_ms >= period_ms / 2:
            # An acknowledged message's lease is no longer extended: its flush must land
            # before the lease runs out, or the message is delivered again.
            raise InvalidOptionError(
                f"ack_interval_ms ({interval_ms:g} ms) must be below half the "
                f"lease_period ({period_ms} ms)"
            )
        poll_ms = given["max_poll_interval_ms"]
        if poll_ms is None:
            local = table.store.location.scheme in ("", "file")
            poll_ms = LOCAL_POLL_MS if local else OBJECT_STORE_POLL_MS
        self.table = table
        self.queue = queue
        self.name = name
        self.max_prefetch = given["max_prefetch"]
        self.lease_period_s = period_ms / 1000
        self.ack_batch = given["ack_batch"]
        self.ack_interval_s = interval_ms / 1000
        self.max_poll_interval_s = poll_ms / 1000
        self.idle_lease_interval_s = given["idle_lease_interval_ms"] / 1000
        self._lease_options: dict[str, Any] = {
            "lease_period": period_ms,
            "max_deliveries": given["max_deliveries"] or 0,
            "max_cancels": given["max_cancels"] or 0,
            "filter": given["filter"],
        }
        self._cond = threading.Condition()
        self._buffer: deque[Message] = deque()  # prefetched, not delivered yet
        self._in_hand: dict[int, Message] = {}
        self._renew_at: dict[int, float] = {}  # seq -> when its lease is extended next
        self._next_renew = math.inf  # the earliest of them, or earlier (never later)
        self._acks: list[int] = []
        self._acks_since = 0.0
        self.target = 1  # messages to hold prefetched, at most (see above)
        self._low = 0  # lease again once no more than this many are prefetched
        self._lease_s: float | None = None  # how long a lease takes (moving average)
        self._handler_s: float | None = None  # how long a thread handles a message (same)
        self._receivers: dict[int, float] = {}  # thread id -> when it last received
        self._taken = threading.local()  # this thread's last delivery: when, how many
        self._last_full = False  # the last lease got all it asked: the queue may have more
        self._woken = False  # a commit of this process happened while idle
        self._error: BaseException | None = None
        self._closed = False
        self._last_got = 0  # messages the last lease delivered
        self._planned_on: int | None = None  # the table version the last lease planned on
        self._idle = False
        self.polls = 0  # log checks made while idle, for tests and benchmarks
        self.leases = 0  # lease calls made, for tests and benchmarks
        self.retries = 0  # transient failures the background thread waited out
        self._calls = ThreadPoolExecutor(max_workers=2, thread_name_prefix="spark-queue-consumer")
        self._listening = _listen(table, self._wake)
        self._thread = threading.Thread(
            target=self._run, name=f"spark-queue-consumer {queue} {name}", daemon=True
        )
        self._thread.start()

    # -- receiving ---------------------------------------------------------------------------

    def receive(self, max_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """Up to ``max_messages`` messages, waiting up to ``timeout`` seconds (None: until
        one arrives) for the first; an empty list when none came in time.

        Raises:
            InvalidOptionError: ``max_messages`` is not a whole number >= 1, or
                ``timeout`` not None or a finite number of seconds >= 0.
            ClientClosedError: the consumer is closed.
            QueueError: the background thread failed (say, the queue does not exist).
        """
        max_messages = POSITIVE.parse("max_messages", max_messages)
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 <= timeout < math.inf
        ):
            raise InvalidOptionError(
                f"timeout must be None (wait until a message comes) or seconds >= 0; "
                f"got {timeout!r}"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            sizes = (self.target, self._low)
            self._handled(time.monotonic())
            while True:
                if self._error is not None:
                    raise self._error
                if self._closed:
                    raise ClientClosedError(f"consumer {self.name!r} of {self.queue!r} is closed")
                if self._buffer:
                    break
                if self._last_full and self._handler_s is None:
                    # Not measured yet, and the handler outran the leases: lease more at once.
                    self.target = min(self.max_prefetch, self.target * GROWTH)
                    self._low = self.target // 2
                    self._last_full = False
                if (self.target, self._low) != sizes:
                    # The background thread may lease more now. Only then: a notify on
                    # every pass would have idle receivers wake each other without end.
                    sizes = (self.target, self._low)
                    self._cond.notify_all()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return []
                self._cond.wait(left)
            taken: list[Message] = []
            while self._buffer and len(taken) < max_messages:
                message = self._buffer.popleft()
                self._in_hand[message.seq] = message
                taken.append(message)
            self._taken.at, self._taken.count = time.monotonic(), len(taken)
            self._cond.notify_all()  # the fetcher may lease more now
            return taken

    def _handled(self, now: float) -> None:
        """This thread is back for more: measure how long it took a message, and size the
        prefetch again (under the lock)."""
        thread = threading.get_ident()
        self._receivers[thread] = now
        at = getattr(self._taken, "at", None)
        if at is None:
            return
        self._taken.at = None
        per_message = (now - at) / max(1, self._taken.count)
        self._handler_s = _average(self._handler_s, per_message)
        self._resize(now)

    def _resize(self, now: float) -> None:
        if self._handler_s is None or self._lease_s is None:
            return
        receivers = sum(1 for seen in self._receivers.values() if now - seen < RECEIVERS_SEEN)
        interval = max(self._handler_s, 1e-6) / max(1, receivers)  # between two deliveries
        need = max(1, math.ceil(self._lease_s / interval))
        self.target = min(self.max_prefetch, need + need // 2)
        self._low = min(need - 1, self.target // 2)

    def __iter__(self) -> Iterator[Message]:
        """Messages one at a time, until the consumer is closed."""
        while True:
            try:
                yield self.receive(1)[0]
            except ClientClosedError:
                return

    def batches(self, max_messages: int = 100) -> Iterator[list[Message]]:
        """Lists of up to ``max_messages`` messages (what is prefetched, at least one),
        until the consumer is closed."""
        while True:
            try:
                yield self.receive(max_messages)
            except ClientClosedError:
                return

    # -- settling ----------------------------------------------------------------------------

    def ack(self, message: Message | int) -> None:
        """Acknowledge a delivered message (or its seq); committed with the next flush.

        Raises:
            InvalidOptionError: ``message`` is neither a :class:`Message` nor a seq.
            ClientClosedError: the consumer is closed (its leases were released).
        """
        seq = _seq_of(message)
        with self._cond:
            if self._closed:
                raise ClientClosedError(f"consumer {self.name!r} of {self.queue!r} is closed")
            if self._in_hand.pop(seq, None) is None:
                return  # not in hand: acked or nacked before
            self._renew_at.pop(seq, None)
            if not self._acks:
                self._acks_since = time.monotonic()
            self._acks.append(seq)
            self._cond.notify_all()

    def nack(self, message: Message | int, delay: str | int | None = None) -> None:
        """Return a delivered message to the queue now, counted as a cancel
        (``max_cancels``); ready again after ``delay`` (``30 seconds``, ``5m``,
        milliseconds; None: the queue's redelivery backoff). Commits before it returns.

        Raises:
            InvalidOptionError: ``message`` is neither a :class:`Message` nor a seq.
            ClientClosedError: the consumer is closed.
        """
        seq = _seq_of(message)
        with self._cond:
            if self._closed:
                raise ClientClosedError(f"consumer {self.name!r} of {self.queue!r} is closed")
            held = self._in_hand.pop(seq, None)
            if held is None:
                return
            renew_at = self._renew_at.pop(seq, None)
            self._cond.notify_all()
        try:
            self.table.cancel(self.queue, [seq], self.name, delay=delay)
        except BaseException:  # still in hand: nack again, ack it, or close releases it
            with self._cond:
                self._in_hand[seq] = held
                if renew_at is not None:
                    self._renew_at[seq] = renew_at
                    self._next_renew = min(self._next_renew, renew_at)
            raise

    def flush(self) -> None:
        """Commit the pending acknowledgements now; where that fails, they stay pending
        (for the background thread's next flush) and the error is raised."""
        with self._cond:
            seqs, self._acks = self._acks, []
        if not seqs:
            return
        try:
            self.table.ack(self.queue, seqs, self.name)
        except BaseException:
            with self._cond:
                if not self._acks:
                    self._acks_since = time.monotonic()
                self._acks[:0] = seqs
            raise

    @property
    def idle(self) -> bool:
        """Whether it is long-polling: its last lease found nothing."""
        with self._cond:
            return self._idle

    def held(self) -> int:
        """Messages prefetched or in hand: never above ``max_prefetch``."""
        with self._cond:
            return len(self._buffer) + len(self._in_hand)

    def close(self) -> None:
        """Stop: flush acknowledgements, release what was prefetched or is in hand and not
        acknowledged. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self._listening.close()
        try:
            self.flush()
        finally:  # release what is unhandled even where the flush failed
            with self._cond:
                unhandled = [m.seq for m in self._buffer] + list(self._in_hand)
                self._buffer.clear()
                self._in_hand.clear()
            try:
                if unhandled:
                    self.table.release(self.name, self.queue, seqs=unhandled)
            finally:
                self._calls.shutdown()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the background thread --------------------------------------------------------------

    def _wake(self, operations: list[str]) -> None:
        """A commit of this process landed: wake if it may have fed this queue. Its
        operations name their queue second (``PUBLISH orders``); a commit of another
        queue wakes nothing."""
        feeding = [op for op in operations if op.split(" ", 1)[0] not in NOT_FEEDING]
        if not any(op.split(" ")[1:2] in ([], [self.queue]) for op in feeding):
            return
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def _run(self) -> None:
        poll = _Poll()
        failures = 0  # transient failures in a row
        try:
            while True:
                step = _Step()
                try:
                    if not self._step(poll, step):
                        return
                except Exception as error:
                    if not transient(error):
                        raise
                    failures += 1
                    self._retry_later(error, failures, step)
                    continue
                if failures:
                    log.warning("consumer %r of %r: the table answers again", self.name, self.queue)
                    failures = 0
        except BaseException as error:  # raised to the receivers, who would wait forever
            with self._cond:
                self._error = error
                self._cond.notify_all()

    def _step(self, poll: _Poll, step: _Step) -> bool:
        """One turn of the background thread: wait for work (checking the log when idle),
        or flush, extend and lease (what it takes to send goes in ``step``). False once
        the consumer is closed."""
        with self._cond:
            if self._closed:
                return False
            now = time.monotonic()
            held = len(self._buffer) + len(self._in_hand)
            room = self.max_prefetch - held
            low = len(self._buffer) <= self._low
            flush_due = bool(self._acks) and (
                len(self._acks) >= self.ack_batch or now - self._acks_since >= self.ack_interval_s
            )
            step.renew = self._due_renewals(now)
            idle = poll.idle_since is not None
            woken, self._woken = self._woken, False
            poll_due = idle and (
                woken or now - poll.idle_since >= self.idle_lease_interval_s  # type: ignore[operator]
            )
            fetch = room > 0 and low and (not idle or poll_due)
            if not (fetch or flush_due or step.renew):
                self._cond.wait(self._next_wait(now, idle, poll))
                check_log = (
                    idle
                    and poll.watched is not None
                    and not self._woken
                    and time.monotonic() >= poll.check_at
                )
                if check_log:
                    self.polls += 1
            else:
                check_log = False
                want = min(room, max(1, self.target - len(self._buffer))) if fetch else 0
                if flush_due or fetch:
                    step.acks, self._acks = self._acks, []
        if check_log:
            self._check_log(poll)
        elif fetch or flush_due or step.renew:
            self._exchange(want, step.acks, step.renew)
            if want:
                self._after_lease(poll)
        return True

    def _check_log(self, poll: _Poll) -> None:
        """An idle consumer's look at the log for a commit that may feed its queue. I/O (a
        stat; a request on an object store), so outside the lock, which receivers and this
        process's commits (``_wake``) take."""
        assert poll.watched is not None
        moved = poll.watched.moved()
        with self._cond:
            self._woken = self._woken or moved
            poll.interval = min(poll.interval * 2, self.max_poll_interval_s)
            poll.check_at = time.monotonic() + poll.interval

    def _after_lease(self, poll: _Poll) -> None:
        """Start or end the idle wait, as the lease just made found messages or not."""
        with self._cond:
            got = self._last_got
        if got:
            poll.idle_since, poll.watched = None, None
            poll.interval = FIRST_POLL_INTERVAL
        else:
            poll.idle_since = time.monotonic()
            # From the version the lease planned on: a publish committed while the lease
            # was in flight still wakes the wait.
            poll.watched = _LogWatch(self.table, self.queue, self._planned_on)
            poll.check_at = poll.idle_since + poll.interval
        with self._cond:
            self._idle = not got
            self._cond.notify_all()

    def _retry_later(self, error: Exception, failures: int, step: _Step) -> None:
        """After a transient failure: put back what ``step`` took (acks and extensions are
        sent again: acking or extending twice ends or extends nothing more), then wait a
        jittered backoff (``close`` cuts it short)."""
        delay = min(MAX_RETRY_DELAY, FIRST_RETRY_DELAY * 2 ** (failures - 1))
        delay *= random.uniform(0.5, 1.0)
        if failures == 1:
            log.warning(
                "consumer %r of %r: %s: %s; trying again with backoff",
                self.name,
                self.queue,
                type(error).__name__,
                error,
            )
        with self._cond:
            self.retries += 1
            now = time.monotonic()
            if step.acks:
                self._acks[:0] = step.acks
                self._acks_since = now - self.ack_interval_s  # due again after the backoff
            for seq in step.renew:
                if seq in self._renew_at:
                    self._renew_at[seq] = now
                    self._next_renew = now
            until = now + delay
            while not self._closed and (left := until - time.monotonic()) > 0:
                self._cond.wait(left)

    def _due_renewals(self, now: float) -> list[int]:
        """Seqs whose lease is due for extension (under the lock); the scan runs only once
        the earliest is due, not at every wake-up of the background thread."""
        if now < self._next_renew:
            return []
        due = [seq for seq, at in self._renew_at.items() if at <= now]
        if not due:  # the earliest was acked or nacked since
            self._next_renew = min(self._renew_at.values(), default=math.inf)
        return due

    def _next_wait(self, now: float, idle: bool, poll: _Poll) -> float:
        waits: list[float] = [self.idle_lease_interval_s]
        if idle:
            waits.append(poll.check_at - now)
        if self._acks:
            waits.append(self._acks_since + self.ack_interval_s - now)
        if self._renew_at:
            waits.append(self._next_renew - now)
        return max(0.0, min(waits))

    def _exchange(self, want: int, acks: list[int], renew: list[int]) -> None:
        """Flush ``acks``, extend ``renew`` and lease ``want`` messages, concurrently, so
        the group commit can put them in one commit. A lease that returned is kept before
        the first error of the three is raised."""
        calls = []
        if acks:
            calls.append(self._calls.submit(self.table.ack, self.queue, acks, self.name))
        if renew:
            calls.append(
                self._calls.submit(
                    self.table.extend,
                    self.queue,
                    renew,
                    self.name,
                    self._lease_options["lease_period"],
                )
            )
            with self._cond:
                later = time.monotonic() + self.lease_period_s / 2
                for seq in renew:
                    if seq in self._renew_at:
                        self._renew_at[seq] = later
                self._next_renew = min(self._renew_at.values(), default=math.inf)
        leased = None
        failure: Exception | None = None
        if want:
            self.leases += 1
            started = time.monotonic()
            try:
                leased = self.table.lease(
                    self.queue, self.name, max_messages=want, **self._lease_options
                )
            except Exception as error:
                failure = error
            with self._cond:
                self._lease_s = _average(self._lease_s, time.monotonic() - started)
                self._resize(time.monotonic())
        for call in calls:  # every call ends before a failure is raised
            try:
                call.result()
            except Exception as error:
                failure = failure or error
        if leased is not None:
            self._keep(leased, want)
        if failure is not None:
            raise failure

    def _keep(self, leased: pa.Table, want: int) -> None:
        """Buffer the messages a lease of ``want`` returned."""
        messages = self._messages(leased)
        with self._cond:
            now = time.monotonic()
            renew_at = now + self.lease_period_s / 2
            # A message whose lease ran out while this consumer held it (an extension that
            # could not land in time) may come back to it: it is leased again, not
            # delivered a second time to a receiver of this consumer.
            held = {m.seq for m in self._buffer} | set(self._in_hand)
            for message in messages:
                if message.seq not in held:
                    self._buffer.append(message)
                self._renew_at[message.seq] = renew_at
            self._next_renew = min(self._next_renew, renew_at)
            self._last_got = len(messages)
            version = (leased.schema.metadata or {}).get(LEASE_VERSION_KEY)
            self._planned_on = None if version is None else int(version)
            self._last_full = len(messages) == want
            self._cond.notify_all()

    def _messages(self, leased: pa.Table) -> list[Message]:
        columns = leased.select(
            ["queue", "seq", "body", "key", "headers", "message_id", "priority",
             "delivery_count", "enqueued_at"]
        ).to_pydict()  # fmt: skip
        return [
            Message(
                queue=columns["queue"][i],
                seq=columns["seq"][i],
                body=columns["body"][i],
                key=columns["key"][i],
                headers=None if columns["headers"][i] is None else dict(columns["headers"][i]),
                message_id=columns["message_id"][i],
                priority=columns["priority"][i],
                delivery_count=columns["delivery_count"][i],
                enqueued_at=columns["enqueued_at"][i],
                consumer=self,
            )
            for i in range(leased.num_rows)
        ]


def _seq_of(message: Message | int) -> int:
    """The seq of a message given to :meth:`Consumer.ack` or :meth:`Consumer.nack`: a
    :class:`Message`, or its seq."""
    if isinstance(message, Message):
        return message.seq
    try:
        return parse_seq("message", message)
    except InvalidOptionError:
        raise InvalidOptionError(
            f"message must be a Message or {SEQ.valid}; got {shown(message)}"
        ) from None


# Operations after which a queue may have messages to deliver that it had not before: every
# one but these (a lease that returned expired leases is caught by the idle lease interval).
NOT_FEEDING = frozenset({"LEASE", "ACK", "EXTEND", "EXPIRE", "COMPACT", "CONSUME"})


# The keyword options of a Consumer, whose names QueueTable.consumer checks.
CONSUMER_OPTIONS = tuple(
    p.name
    for p in inspect.signature(Consumer.__init__).parameters.values()
    if p.kind is p.KEYWORD_ONLY
)


def may_feed(queue: str, operations: list[str], queues: list[str] | None) -> bool:
    """Whether a commit of ``operations`` (its commitInfo's, split at ``; ``) touching
    ``queues`` (None: not recorded) may have made messages of ``queue`` ready: an idle
    consumer wakes for those only, not for every other consumer's lease and ack."""
    if queues is not None and queue not in queues:
        return False
    return any(op.split(" ", 1)[0] not in NOT_FEEDING for op in operations)


def _average(old: float | None, new: float) -> float:
    """A moving average that follows a change within a few samples."""
    return new if old is None else 0.7 * old + 0.3 * new


@dataclass
class _Poll:
    """A consumer's long-polling state, kept by its background thread."""

    idle_since: float | None = None  # when a lease last found nothing; None: not idle
    watched: _LogWatch | None = None  # the log, watched from the version that lease saw
    interval: float = FIRST_POLL_INTERVAL  # the next wait between two log checks
    check_at: float = 0.0  # time.monotonic() of the next log check, while idle


@dataclass
class _Step:
    """What one turn of a consumer's background thread took to send: put back if it
    fails."""

    acks: list[int] = field(default_factory=list)
    renew: list[int] = field(default_factory=list)


class _LogWatch:
    """Whether the table has a version after the one it had when made that may feed
    ``queue`` (:func:`may_feed`): one open of the next log entry per check and one of the
    entry it has read last (local disk: a system call each; object stores: a HEAD each),
    and a read of each new entry."""

    def __init__(self, table: QueueOperations, queue: str, version: int | None) -> None:
        store = table.store
        if version is None:  # a table object that does not say: load the log (no cache,
            # so that this thread holds no delta-rs object the interpreter's exit would meet)
            version = store.location.delta_table().version()
        self.queue = queue
        self.version = version
        self.store = store
        self.fs = store.fs

    def moved(self) -> bool:
        while True:
            entry = self.store.log_entry(self.version + 1)
            try:
                # One request on S3 where the entry is missing (a HEAD), as a rule here;
                # get_file_info would also list, for a folder of that name.
                with self.fs.open_input_stream(entry) as stream:
                    text = stream.read().decode()
            except FileNotFoundError:
                # Not written yet, or deleted by log cleanup after the others committed
                # past the log's bound: the latter where this version's own entry is gone
                # too (QueueStore.is_latest), and then only a lease can tell.
                return not self.store.has_log_entry(self.version)
            except OSError:
                return True  # unreadable: lease and see
            self.version += 1
            if self._feeds(text):
                return True

    def _feeds(self, entry: str) -> bool:
        for line in entry.splitlines():
            if '"commitInfo"' not in line:
                continue
            info = json.loads(line)["commitInfo"]
            summary = info.get("spark_queue")
            if summary is None:
                return True  # not a connector commit: it may be anything
            operation = json.loads(summary)
            return may_feed(
                self.queue,
                str(operation.get("operation", "")).split("; "),
                operation.get("queues"),
            )
        return True


class _Listening:
    def __init__(self, group: Any, callback: Any) -> None:
        self.group, self.callback = group, callback
        group.listen(callback)

    def close(self) -> None:
        self.group.unlisten(self.callback)


def _listen(table: QueueOperations, callback: Any) -> _Listening:
    """Call ``callback`` after every commit this process makes to ``table``."""
    from spark_queue.commit.group import group_of

    return _Listening(group_of(table.store.location), callback)


@dataclass
class _Pending:
    row: dict[str, Any]
    future: Future[int | None]


class Publisher:
    """Single messages of many threads, published to ``queue`` in batches, as Kafka's
    producer: a batch goes when it holds ``max_batch`` messages or its first message has
    waited ``linger_ms``, and the next collects while it commits (the wait for a
    commit batches by itself under load). Once a batch lands, the next goes as soon as its
    senders are back (what was waiting plus the batch's own), within
    :data:`GATHER_SECONDS` or ``linger_ms``, the shorter. Made by :meth:`QueueTable.publisher`.

    :meth:`send` returns a future per message: its seq once the commit holding it has
    landed, None where the queue's reject policy refused it or its ``message_id`` was a
    duplicate within the queue's window; or the batch's error (an argument mismatch, say).
    Messages of one publisher are stored in the order :meth:`send` was called. A future
    cancelled before its batch is taken is not published; after, it cannot be cancelled.

    Thread-safe. :meth:`flush` waits for every message sent before it; :meth:`close`
    flushes and stops.
    """

    def __init__(
        self,
        table: QueueOperations,
        queue: str,
        *,
        linger_ms: str | int = 5,
        max_batch: int = 1000,
        on_reject: str = "drop",
        **arguments: Any,
    ) -> None:
        # Checked now, as publish would check them, so a bad one fails here, not in every
        # future of the first batch.
        parse_queue_name("queue", queue)
        given = parse_given(
            "publisher", {"linger_ms": linger_ms, "max_batch": max_batch, "on_reject": on_reject}
        )
        validate_arguments(arguments)
        self.table = table
        self.queue = queue
        self.linger_s = given["linger_ms"] / 1000
        self.max_batch = given["max_batch"]
        self.on_reject = given["on_reject"]
        self.arguments = arguments
        self.batches = 0  # batches published, for tests and benchmarks
        self._cond = threading.Condition()
        self._pending: deque[_Pending] = deque()
        self._first_at = 0.0  # when the oldest pending message was sent
        # After a batch lands: until when the next one gathers, and for how many.
        self._gather_until = 0.0
        self._expected = 0
        self._in_flight = 0
        self._flushing = 0
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"spark-queue-publisher {queue}", daemon=True
        )
        self._thread.start()

    def send(
        self,
        body: bytes | str,
        *,
        key: str | None = None,
        headers: dict[str, str] | None = None,
        message_id: str | None = None,
        priority: int | None = None,
        deliver_at: datetime | None = None,
        expires_at: datetime | None = None,
    ) -> Future[int | None]:
        """Queue one message for the next batch; returns its future (see the class).

        Raises:
            InvalidInputError: a value of the wrong type (checked here, so it fails alone).
            ClientClosedError: the publisher is closed.
        """
        row: dict[str, Any] = {"body": body.encode() if isinstance(body, str) else body}
        for name, value in (
            ("key", key),
            ("headers", headers),
            ("message_id", message_id),
            ("priority", priority),
            ("deliver_at", deliver_at),
            ("expires_at", expires_at),
        ):
            if value is not None:
                row[name] = value
        if len(row) > 1 or not isinstance(body, bytes | str):
            as_input_table([row])  # its own errors, now, not its batch's
        future: Future[int | None] = Future()
        with self._cond:
            if self._closed:
                raise ClientClosedError(f"publisher of {self.queue!r} is closed")
            if not self._pending:
                self._first_at = time.monotonic()
            self._pending.append(_Pending(row, future))
            if len(self._pending) in (1, self._expected) or len(self._pending) >= self.max_batch:
                self._cond.notify_all()
        return future

    def flush(self) -> None:
        """Publish what is pending now and wait until every message sent so far landed."""
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            while self._pending or self._in_flight:
                self._cond.wait()
            self._flushing -= 1

    def close(self) -> None:
        """Flush and stop. Idempotent."""
        with self._cond:
            if self._closed:
                return
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        try:
            self._send_batches()
        except BaseException as error:  # unexpected: no future may wait for ever
            with self._cond:
                self._closed = True
                while self._pending:
                    future = self._pending.popleft().future
                    if future.set_running_or_notify_cancel():
                        future.set_exception(error)
                self._cond.notify_all()
            raise

    def _send_batches(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed and not self._pending:
                        return
                    if not self._pending:
                        self._cond.wait()
                        continue
                    if len(self._pending) >= self.max_batch or self._flushing or self._closed:
                        break
                    now = time.monotonic()
                    if now < self._gather_until:
                        # A batch just landed and its senders are coming back with their
                        # next messages (each needs the GIL for a moment): the next batch
                        # waits a little for them, else synchronous senders split into
                        # cohorts that take turns, each batch half as full.
                        if len(self._pending) >= self._expected:
                            break
                        self._cond.wait(self._gather_until - now)
                        continue
                    left = self._first_at + self.linger_s - now
                    if left <= 0:
                        break
                    self._cond.wait(left)
                taken = [
                    self._pending.popleft() for _ in range(min(self.max_batch, len(self._pending)))
                ]
                if self._pending:
                    self._first_at = time.monotonic()
                # A future cancelled by its sender is left out: from here on it cannot be.
                batch = [item for item in taken if item.future.set_running_or_notify_cancel()]
                self._in_flight += len(batch)
            try:
                if batch:
                    self._publish(batch)
            finally:
                with self._cond:
                    self._in_flight -= len(batch)
                    self._cond.notify_all()

    def _landing(self, batch: list[_Pending]) -> None:
        """Before ``batch``'s futures are settled: the next batch gathers for what is
        pending now and for the senders of ``batch``."""
        with self._cond:
            self._expected = len(self._pending) + len(batch)
            self._gather_until = time.monotonic() + min(self.linger_s, GATHER_SECONDS)

    def _publish(self, batch: list[_Pending]) -> None:
        rows: list[Any] = [item.row for item in batch]
        if all(len(row) == 1 for row in rows):  # bodies only: the cheaper list to convert
            rows = [row["body"] for row in rows]  # binary: send() encoded and checked them
        try:
            outcome = self.table.publish_outcome(
                self.queue, rows, on_reject=self.on_reject, **self.arguments
            )
        except BaseException as error:  # each message's future holds the batch's error
            self._landing(batch)
            for item in batch:
                item.future.set_exception(error)
            return
        self.batches += 1
        self._landing(batch)
        seqs = iter(outcome.result.seqs)
        stored = np.asarray(outcome.accepted, bool)
        for item, accepted in zip(batch, stored, strict=True):
            item.future.set_result(next(seqs) if accepted else None)
