"""The publisher client: :class:`Publisher` (Kafka's producer as the model: linger and
batch size), on a :class:`~spark_queue.table.QueueTable`."""

from __future__ import annotations

import inspect
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from spark_queue.clients.queue_operations import QueueOperations
from spark_queue.errors import ClientClosedError, InvalidOptionError
from spark_queue.model.arguments import OnReject, arguments_of, parse_given, parse_queue_name
from spark_queue.model.declarations import check_signature
from spark_queue.model.deprecations import PUBLISHER_RENAMES, renamed
from spark_queue.model.keywords import DurationLike, QueueArgumentKeywords, Unpack
from spark_queue.model.messages import as_input_table
from spark_queue.model.queue_arguments import validate_arguments

GATHER_SECONDS = 0.002  # a publisher waits this long at most for a landed batch's senders


@dataclass
class _Pending:
    row: dict[str, Any]
    future: Future[int | None]


class Publisher:
    """Single messages of many threads, published to ``queue`` in batches, as Kafka's
    producer: a batch goes when it holds ``max_batch`` messages or its first message has
    waited ``linger``, and the next collects while it commits (the wait for a
    commit batches by itself under load). Once a batch lands, the next goes as soon as its
    senders are back (what was waiting plus the batch's own), within
    :data:`GATHER_SECONDS` or ``linger``, the shorter. Made by :meth:`QueueTable.publisher`.

    :meth:`send` returns a future per message: its seq once the commit holding it has
    landed, None where the queue's reject policy refused it or its ``message_id`` was a
    duplicate within the queue's window; or the batch's error (an argument mismatch, say).
    Messages of one publisher are stored in the order :meth:`send` was called. A future
    cancelled before its batch is taken is not published; after, it cannot be cancelled.

    Thread-safe. :meth:`flush` waits for every message sent before it; :meth:`close`
    flushes and stops.

    Attributes:
        table: the queue table it publishes to (a :class:`QueueTable`).
        queue: the queue it publishes to.
        linger_s: ``linger`` in seconds.
        max_batch: the most messages one commit publishes.
        on_reject: ``drop`` or ``fail``, as for :meth:`QueueTable.publish`.
        arguments: the queue arguments each batch publishes with.
        batches: the batches it has published.
    """

    @renamed("Publisher", PUBLISHER_RENAMES)
    def __init__(
        self,
        table: QueueOperations,
        queue: str,
        *,
        linger: DurationLike = 5,
        max_batch: int = 1000,
        on_reject: OnReject = "drop",
        **arguments: Unpack[QueueArgumentKeywords],
    ) -> None:
        # Checked now, as publish would check them, so a bad one fails here, not in every
        # future of the first batch.
        parse_queue_name("queue", queue)
        unknown = sorted(set(arguments) - {a.name for a in arguments_of("queue")})
        if unknown:  # else named as an unknown queue argument, listing those alone
            raise InvalidOptionError(
                f"unknown publisher option {unknown[0]!r}; valid: {', '.join(PUBLISHER_OPTIONS)}, "
                "and the queue arguments publish takes (max_length, ring_size, ...: "
                "docs/ARGUMENTS.md)"
            )
        given = parse_given(
            "publisher", {"linger": linger, "max_batch": max_batch, "on_reject": on_reject}
        )
        validate_arguments(arguments)
        self.table = table
        self.queue = queue
        self.linger_s = given["linger"] / 1000
        self.max_batch = given["max_batch"]
        self.on_reject = given["on_reject"]
        self.arguments = arguments
        self.batches = 0
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
        """Queue one message for the next batch.

        Args:
            body: the message's body (a ``str`` is stored as UTF-8).
            key: its key (its group, where the queue has ``message_groups``).
            headers: its headers, strings to strings.
            message_id: its id, for de-duplication within the queue's
                ``duplicate_window``.
            priority: its priority, a whole number in the int32 range (None: 0).
            deliver_at: not delivered before this time (a naive one is UTC).
            expires_at: expires at this time (a naive one is UTC).

        Returns:
            Its future: its seq once the commit holding it has landed, None where the
            queue refused it or it was a duplicate, or the batch's error (see the class).

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


check_signature(Publisher.__init__, "publisher")
# A Publisher's own keyword options (the others are queue arguments).
PUBLISHER_OPTIONS = tuple(
    p.name
    for p in inspect.signature(Publisher.__init__).parameters.values()
    if p.kind is p.KEYWORD_ONLY
)
