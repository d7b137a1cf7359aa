"""The consumer client: :class:`Consumer` (SQS, Kafka, pika consumers as models), on a
:class:`~spark_queue.table.QueueTable`.

It runs in the calling process and commits through its group commit
(:mod:`spark_queue.commit.group`), so many clients of one table in one process share
commits. It uses only the table's public operations (``lease``, ``ack``, ``cancel``,
``extend``, ``release``), from threads of its own, so whatever serves those operations
serves it.

Its background thread prefetches (:mod:`~spark_queue.clients.prefetch`), flushes
acknowledgements (:mod:`~spark_queue.clients.acknowledgements`), extends leases
(:mod:`~spark_queue.clients.renewal`) and long-polls (:mod:`~spark_queue.clients.polling`):
each part keeps its own state, and the consumer holds one lock over them. It is
thread-safe and a context manager; it does not survive a fork.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pyarrow as pa

from spark_queue.clients.acknowledgements import (
    PendingAcknowledgements,
    acknowledgement_interval_ms,
)
from spark_queue.clients.message import Message, messages_of, seq_of
from spark_queue.clients.polling import (
    CommitListener,
    LogWatch,
    LongPoll,
    PartitionsWatch,
    longest_poll_interval_ms,
    operations_may_feed,
    partition_location,
)
from spark_queue.clients.prefetch import PrefetchBound
from spark_queue.clients.queue_operations import QueueOperations
from spark_queue.clients.renewal import LeaseRenewals
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
    ARGUMENTS,
    COUNT,
    POSITIVE,
    arguments_of,
    parse_consumer_name,
    parse_duration_ms,
    parse_given,
    parse_queue_name,
)
from spark_queue.model.declarations import check_signature
from spark_queue.model.deprecations import CONSUMER_RENAMES, renamed, warn_deprecated
from spark_queue.model.keywords import DurationLike
from spark_queue.model.schema import LEASE_VERSION_KEY, LEASE_VERSIONS_KEY
from spark_queue.storage.commit_log import Operation

# A consumer's background thread tries again after a transient failure, waiting from the
# first delay, doubled each time up to the last (jittered down by up to half).
FIRST_RETRY_DELAY_SECONDS = 0.1
MAX_RETRY_DELAY_SECONDS = 5.0

log = logging.getLogger(__name__)

Receive = TypeVar("Receive", bound=Callable[..., list[Message]])


def _old_timeout(receive: Receive) -> Receive:
    """``receive(max_messages, timeout)``, the wait in seconds, kept for one release as the
    old spelling of ``wait_time`` (a duration, whose bare number is milliseconds)."""

    @functools.wraps(receive)
    def call(consumer: Consumer, *given: Any, **keywords: Any) -> list[Message]:
        if len(given) < 2 and "timeout" not in keywords:
            return receive(consumer, *given, **keywords)
        if "wait_time" in keywords:
            raise InvalidOptionError(
                "receive: timeout is the old name of wait_time; give wait_time only, not both"
            )
        timeout = given[1] if len(given) >= 2 else keywords.pop("timeout")
        warn_deprecated(
            "receive(timeout=seconds) is deprecated: use wait_time=, a duration ('5s', "
            "a timedelta, or milliseconds)"
        )
        return receive(consumer, *given[:1], *given[2:], wait_time=_ms(timeout), **keywords)

    return cast(Receive, call)


def _ms(seconds: object) -> int | None:
    """The old ``timeout``, seconds (None: no end), as whole milliseconds, rounded up."""
    if seconds is None:
        return None
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 <= seconds < math.inf
    ):
        raise InvalidOptionError(
            f"timeout must be None (wait until a message comes) or seconds >= 0; got {seconds!r}"
        )
    return math.ceil(seconds * 1000)


def transient(error: BaseException) -> bool:
    """Whether a consumer's background thread tries again after ``error``: the store or a
    broker failed, or every commit attempt lost its race; not a missing queue, a bad option
    or a refused token, which trying again would not mend."""
    if isinstance(error, BrokerAuthenticationError | BrokerRequestError):
        return False
    return isinstance(error, StorageError | CommitConflictError | BrokerError | OSError)


class Consumer:
    """Messages of ``queue`` for consumer ``consumer``, one at a time (iterate, or
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
      oldest has waited ``ack_interval`` (None: 1 s, or a quarter of the lease
      period where shorter; it must stay below half of it, since an acknowledged message's
      lease is no longer extended), and on :meth:`flush` and :meth:`close`;
      a flush and a lease go to the table together (one commit, where the group commit can).
    - **Lease extension**: every lease runs for ``lease_period``; the leases of messages
      prefetched or in hand are extended once half of it has passed, so a message is never
      redelivered while it is handled, however slow the handler, as long as this process
      lives. A killed process's leases run out and their messages are delivered again.
    - **Long polling**: a consumer that finds nothing waits for a new table version (a stat
      of the next log entry, every ``idle_check_interval`` at most (None: 25 ms on a
      local disk, 100 ms on an object store, where each check is a request), starting at 5 ms;
      commits of this process wake it at once), and leases again at least every
      ``idle_lease_interval`` (scheduled messages falling due, leases running out
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

    Attributes:
        table: the queue table it leases from (a :class:`QueueTable`).
        queue: the queue it consumes.
        name: the consumer name its leases carry (``consumer``).
        leases: the lease calls it has made.
        retries: the transient failures its background thread has waited out.
    """

    @renamed("Consumer", CONSUMER_RENAMES)
    def __init__(
        self,
        table: QueueOperations,
        queue: str,
        consumer: str,
        *,
        max_prefetch: int = 1000,
        lease_period: DurationLike = "30 seconds",
        ack_batch: int = 1000,
        ack_interval: DurationLike | None = None,
        idle_check_interval: DurationLike | None = None,
        idle_lease_interval: DurationLike = 1000,
        max_deliveries: int | None = None,
        max_cancels: int | None = None,
        filter: str | None = None,
    ) -> None:
        # The options by name, as the signature (the specification's, checked at import)
        # took them.
        options = {n: value for n, value in locals().items() if n in CONSUMER_OPTIONS}
        # Every option is checked here, by the specification's parsers (durations in its
        # one grammar: a whole number of milliseconds, or a number with a unit), so a bad
        # one fails when the consumer is made, never in its background thread. A consumer's
        # leases always run out: its lease period is never None.
        parse_queue_name("queue", queue)
        parse_consumer_name("consumer", consumer)
        lease_period_ms = parse_duration_ms("lease_period", lease_period, minimum_ms=1)
        given = parse_given("consumer", {**options, "lease_period": lease_period_ms})
        interval_ms = acknowledgement_interval_ms(given["ack_interval"], lease_period_ms)
        self.table = table
        self.queue = queue
        self.name = consumer
        # What each lease asks for: the options that are the lease's arguments too.
        self._lease_options: dict[str, Any] = {n: given[n] for n in LEASE_OPTIONS}
        # The parts, each with its own state, all under this one lock.
        self._cond = threading.Condition()
        self._buffer: deque[Message] = deque()  # prefetched, not delivered yet
        self._in_hand: dict[int, Message] = {}  # delivered, not acked or nacked
        self._prefetch = PrefetchBound(given["max_prefetch"])
        self._acks = PendingAcknowledgements(given["ack_batch"], interval_ms / 1000)
        self._renewals = LeaseRenewals(lease_period_ms / 1000)
        self._long_poll = LongPoll(
            longest_poll_interval_ms(given["idle_check_interval"], table) / 1000,
            given["idle_lease_interval"] / 1000,
        )
        self._error: BaseException | None = None
        self._closed = False
        self.leases = 0
        self.retries = 0
        self._calls = ThreadPoolExecutor(max_workers=2, thread_name_prefix="spark-queue-consumer")
        self._listening = [CommitListener(table, self._wake)]  # then each partition's
        self._thread = threading.Thread(
            target=self._run, name=f"spark-queue-consumer {queue} {consumer}", daemon=True
        )
        self._thread.start()

    @property
    def polls(self) -> int:
        """Log checks made while idle, for tests and benchmarks."""
        return self._long_poll.checks

    # -- receiving ---------------------------------------------------------------------------

    @_old_timeout
    def receive(
        self, max_messages: int = 1, *, wait_time: DurationLike | None = None
    ) -> list[Message]:
        """Up to ``max_messages`` messages, waiting for the first; an empty list when none
        came in time.

        Args:
            max_messages: at most this many, a whole number >= 0 (0 receives none and
                returns at once, as ``QueueTable.lease(max_messages=0)`` leases none).
            wait_time: how long to wait for the first message, a duration (``"20s"``,
                ``"1.5 s"``, a ``timedelta``, or milliseconds); 0 takes only what is
                prefetched; None waits until one arrives.

        Returns:
            The messages delivered, in delivery order.

        Raises:
            InvalidOptionError: ``max_messages`` is not a whole number >= 0, or
                ``wait_time`` not None or a duration.
            ClientClosedError: the consumer is closed.
            QueueError: the background thread failed (say, the queue does not exist).
        """
        max_messages = COUNT.parse("max_messages", max_messages)
        wait_ms = ARGUMENTS["wait_time"].parse(wait_time)
        deadline = None if wait_ms is None else time.monotonic() + wait_ms / 1000
        with self._cond:
            if not max_messages:
                self._raise_if_stopped()
                return []
            sizes = self._prefetch.sizes
            self._prefetch.receiver_back(time.monotonic())
            while True:
                self._raise_if_stopped()
                if self._buffer:
                    break
                self._prefetch.grow_if_outrun()
                if self._prefetch.sizes != sizes:
                    # The background thread may lease more now. Only then: a notify on
                    # every pass would have idle receivers wake each other without end.
                    sizes = self._prefetch.sizes
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
            self._prefetch.delivered(len(taken), time.monotonic())
            self._cond.notify_all()  # the fetcher may lease more now
            return taken

    def _raise_if_stopped(self) -> None:
        """Raise the background thread's error, or :class:`ClientClosedError` once closed
        (under the lock)."""
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ClientClosedError(f"consumer {self.name!r} of {self.queue!r} is closed")

    def __iter__(self) -> Iterator[Message]:
        """Messages one at a time, until the consumer is closed."""
        while True:
            try:
                yield self.receive(1)[0]
            except ClientClosedError:
                return

    def batches(self, max_messages: int = 100) -> Iterator[list[Message]]:
        """Lists of messages (what is prefetched, at least one), until the consumer is
        closed.

        Args:
            max_messages: at most this many in a list (a whole number >= 1).
        """
        max_messages = POSITIVE.parse("max_messages", max_messages)
        while True:
            try:
                yield self.receive(max_messages)
            except ClientClosedError:
                return

    # -- settling ----------------------------------------------------------------------------

    def ack(self, message: Message | int) -> None:
        """Acknowledge a delivered message; committed with the next flush.

        Args:
            message: the message, or its seq.

        Raises:
            InvalidOptionError: ``message`` is neither a :class:`Message` nor a seq.
            ClientClosedError: the consumer is closed (its leases were released).
        """
        seq = seq_of(message)
        with self._cond:
            if self._closed:
                raise ClientClosedError(f"consumer {self.name!r} of {self.queue!r} is closed")
            if self._in_hand.pop(seq, None) is None:
                return  # not in hand: acked or nacked before
            self._renewals.forget(seq)
            self._acks.add(seq, time.monotonic())
            self._cond.notify_all()

    def nack(self, message: Message | int, delay: DurationLike | None = None) -> None:
        """Return a delivered message to the queue now, counted as a cancel
        (``max_cancels``). Commits before it returns.

        Args:
            message: the message, or its seq.
            delay: how long before it is ready again, a duration (``30 seconds``, ``5m``,
                a ``timedelta``, milliseconds); None: the queue's redelivery backoff.

        Raises:
            InvalidOptionError: ``message`` is neither a :class:`Message` nor a seq, or
                ``delay`` not a duration.
            ClientClosedError: the consumer is closed.
        """
        seq = seq_of(message)
        with self._cond:
            if self._closed:
                raise ClientClosedError(f"consumer {self.name!r} of {self.queue!r} is closed")
            held = self._in_hand.pop(seq, None)
            if held is None:
                return
            renew_at = self._renewals.forget(seq)
            self._cond.notify_all()
        try:
            self.table.cancel(self.queue, [seq], self.name, delay=delay)
        except BaseException:  # still in hand: nack again, ack it, or close releases it
            with self._cond:
                self._in_hand[seq] = held
                if renew_at is not None:
                    self._renewals.restore(seq, renew_at)
            raise

    def flush(self) -> None:
        """Commit the pending acknowledgements now; where that fails, they stay pending
        (for the background thread's next flush) and the error is raised."""
        with self._cond:
            seqs = self._acks.take()
        if not seqs:
            return
        try:
            self.table.ack(self.queue, seqs, self.name)
        except BaseException:
            with self._cond:
                self._acks.put_back(seqs, time.monotonic())
            raise

    @property
    def idle(self) -> bool:
        """Whether it is long-polling: its last lease found nothing."""
        with self._cond:
            return self._long_poll.idle

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
        for listening in self._listening:
            listening.close()
        try:
            self.flush()
        finally:  # release what is unhandled even where the flush failed
            with self._cond:
                unhandled = [m.seq for m in self._buffer] + list(self._in_hand)
                self._buffer.clear()
                self._in_hand.clear()
            try:
                if unhandled:
                    self.table.release(self.queue, consumer=self.name, seqs=unhandled)
            finally:
                self._calls.shutdown()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the background thread --------------------------------------------------------------

    def _wake(self, operations: list[Operation]) -> None:
        """A commit of this process landed: wake if it may have fed this queue (a commit
        of another queue wakes nothing)."""
        if not operations_may_feed(self.queue, operations):
            return
        with self._cond:
            self._long_poll.wake()
            self._cond.notify_all()

    def _run(self) -> None:
        failures = 0  # transient failures in a row
        try:
            while True:
                step = _Step()
                try:
                    if not self._step(step):
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

    def _step(self, step: _Step) -> bool:
        """One turn of the background thread: wait for work (checking the log when idle),
        or flush, extend and lease (what it takes to send goes in ``step``). False once
        the consumer is closed."""
        watch = None
        with self._cond:
            if self._closed:
                return False
            now = time.monotonic()
            flush_due = self._acks.due(now)
            step.renew = self._renewals.due(now)
            want = 0
            if self._long_poll.lease_due(now):
                held = len(self._buffer) + len(self._in_hand)
                want = self._prefetch.lease_size(len(self._buffer), held)
            if want:
                self._long_poll.leasing()
            if not (want or flush_due or step.renew):
                self._cond.wait(self._next_wait(now))
                watch = self._long_poll.log_check(time.monotonic())
            elif flush_due or want:
                step.acks = self._acks.take()
        if watch is not None:
            self._check_log(watch)
        elif want or flush_due or step.renew:
            leased = self._exchange(want, step.acks, step.renew)
            if leased is not None:
                self._after_lease(leased)
        return True

    def _next_wait(self, now: float) -> float:
        """How long the background thread sleeps when nothing is due (under the lock)."""
        waits = [
            self._long_poll.wait_seconds(now),
            self._acks.wait_seconds(now),
            self._renewals.wait_seconds(now),
        ]
        return max(0.0, min(wait for wait in waits if wait is not None))

    def _check_log(self, watch: LogWatch | PartitionsWatch) -> None:
        """An idle consumer's look at the log for a commit that may feed its queue. I/O (a
        stat; a request on an object store), so outside the lock, which receivers and this
        process's commits (``_wake``) take."""
        moved = watch.moved()
        with self._cond:
            self._long_poll.checked(moved, time.monotonic())

    def _after_lease(self, leased: _Leased) -> None:
        """Start or end the idle wait, as the lease just made found messages or none."""
        now = time.monotonic()
        # From the version the lease planned on: a publish committed while the lease was
        # in flight still wakes the wait. Made outside the lock: it may read the log.
        watch: LogWatch | PartitionsWatch | None = None
        if leased.versions is not None:  # a partitioned queue: listen to and watch each
            for partition in range(len(self._listening), len(leased.versions)):
                where = partition_location(self.table, self.queue, partition)
                self._listening.append(CommitListener(self.table, self._wake, where))
            if not leased.got:
                watch = PartitionsWatch(self.table, self.queue, leased.versions)
        elif not leased.got:
            watch = LogWatch(self.table, self.queue, leased.planned_on)
        with self._cond:
            self._long_poll.lease_found(leased.got, watch, now)
            self._cond.notify_all()

    def _retry_later(self, error: Exception, failures: int, step: _Step) -> None:
        """After a transient failure: put back what ``step`` took (acks and extensions are
        sent again: acking or extending twice ends or extends nothing more), then wait a
        jittered backoff (``close`` cuts it short)."""
        delay = min(MAX_RETRY_DELAY_SECONDS, FIRST_RETRY_DELAY_SECONDS * 2 ** (failures - 1))
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
                self._acks.retry(step.acks, now)
            self._renewals.retry(step.renew, now)
            until = now + delay
            while not self._closed and (left := until - time.monotonic()) > 0:
                self._cond.wait(left)

    def _exchange(self, want: int, acks: list[int], renew: list[int]) -> _Leased | None:
        """Flush ``acks``, extend ``renew`` and lease ``want`` messages, concurrently, so
        the group commit can put them in one commit. A lease that returned is kept before
        the first error of the three is raised. Returns what the lease got, or None where
        none was made."""
        calls: list[Future[Any]] = []
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
                self._renewals.extending(renew, time.monotonic())
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
                now = time.monotonic()
                self._prefetch.lease_took(now - started, now)
        for call in calls:  # every call ends before a failure is raised
            try:
                call.result()
            except Exception as error:
                failure = failure or error
        kept = None if leased is None else self._keep(leased, want)
        if failure is not None:
            raise failure
        return kept

    def _keep(self, leased: pa.Table, want: int) -> _Leased:
        """Buffer the messages a lease of ``want`` returned."""
        messages = messages_of(leased, self)
        version = (leased.schema.metadata or {}).get(LEASE_VERSION_KEY)
        with self._cond:
            # A message whose lease ran out while this consumer held it (an extension that
            # could not land in time) may come back to it: it is leased again, not
            # delivered a second time to a receiver of this consumer.
            held = {m.seq for m in self._buffer} | set(self._in_hand)
            self._buffer.extend(m for m in messages if m.seq not in held)
            self._renewals.track([m.seq for m in messages], time.monotonic())
            self._prefetch.lease_returned(len(messages), want)
            self._cond.notify_all()
        versions = (leased.schema.metadata or {}).get(LEASE_VERSIONS_KEY)
        return _Leased(
            len(messages),
            None if version is None else int(version),
            None if versions is None else json.loads(versions),
        )


@dataclass(frozen=True)
class _Leased:
    """What a lease got: how many messages, and the table version it planned on (None:
    the table object does not say)."""

    got: int
    planned_on: int | None
    versions: list[int | None] | None = None  # each partition's, of a partitioned queue


@dataclass
class _Step:
    """What one turn of a consumer's background thread took to send: put back if it
    fails."""

    acks: list[int] = field(default_factory=list)
    renew: list[int] = field(default_factory=list)


check_signature(Consumer.__init__, "consumer")
# The keyword options of a Consumer, whose names QueueTable.consumer checks.
CONSUMER_OPTIONS = tuple(
    p.name
    for p in inspect.signature(Consumer.__init__).parameters.values()
    if p.kind is p.KEYWORD_ONLY
)
LEASE_OPTIONS = tuple(a.name for a in arguments_of("consumer") if "lease" in a.scopes)
