"""A broker's side of a batch of publishes (:mod:`spark_queue.broker.batching`): one
message of a client's stream holding the publishes of several of its threads.

The handler thread submits each publish of a queue without partitions to the table's group
commit without waiting for it (:mod:`spark_queue.commit.landing`), so that all go into the
same round; one of a partitioned queue waits on a thread of the batch's pool. Once every
publish is answered, the batch is answered in one message, each publish with its own
result or its own error, as it would be alone: one handler wakes for the round where each
publish alone would wake one.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Protocol, cast

import pyarrow.flight as flight

from spark_queue.broker.streams import answer_frame, refusal_frame
from spark_queue.broker.wire import encode_result
from spark_queue.commit.landing import WouldWait
from spark_queue.commit.requests import QueuePartitioned
from spark_queue.errors import BrokerRequestError

# Threads that serve a batch's publishes of partitioned queues, each waiting on its share's
# rounds; started as needed.
BATCH_WORKERS = 32


class Served(Protocol):
    """What a batch is served by: the broker (:class:`~spark_queue.server.flight.QueueBroker`)."""

    def serve_one(
        self, kind: str, body: bytes, take: Callable[[Future[Any]], None] | None
    ) -> bytes:
        """As the broker serves a call alone (``take``: see :meth:`QueueBroker._serve`)."""

    def landed(self, kind: str, seconds: float, error: Exception | None) -> bytes:
        """Count and observe a call that ended after ``seconds``: the error's payload where
        it failed, else empty."""


class BatchServer:
    """Serves batches for ``broker``. Thread-safe."""

    def __init__(self, broker: Served) -> None:
        self._broker = broker
        self._workers = ThreadPoolExecutor(BATCH_WORKERS, thread_name_prefix="broker-batch")

    def serve(self, calls: list[tuple[str, bytes]]) -> list[bytes]:
        """Each call's answer frame, in order, once every one is answered."""
        started = time.perf_counter()
        pending: list[Future[Any]] = []
        answers = [self._start(method, request, started, pending) for method, request in calls]
        wait(pending)
        return [answer() for answer in answers]

    def _start(
        self, method: str, request: bytes, started: float, pending: list[Future[Any]]
    ) -> Callable[[], bytes]:
        """Start one call of a batch (what it waits for joins ``pending``): what gives its
        answer frame once ``pending`` is done."""
        if method != "publish":
            error = BrokerRequestError(
                f"malformed request: a batch holds publishes only, not {method!r}; "
                f"nothing of it was done"
            )
            refused = refusal_frame(self._broker.landed(method, 0.0, error))
            return lambda: refused
        taken: list[Future[Any]] = []
        try:
            served = self._broker.serve_one(method, request, taken.append)
        except WouldWait:
            running = self._workers.submit(self._alone, method, request)
            pending.append(running)
            return running.result
        except flight.FlightError as error:
            refused = refusal_frame(error.extra_info or b"")
            return lambda: refused
        if not taken:  # served in this thread
            answer = answer_frame(served)
            return lambda: answer
        pending.append(taken[0])
        return functools.partial(self._landed, request, started, taken[0])

    def _alone(self, method: str, request: bytes) -> bytes:
        try:
            return answer_frame(self._broker.serve_one(method, request, None))
        except flight.FlightError as refused:
            return refusal_frame(refused.extra_info or b"")

    def _landed(self, request: bytes, started: float, future: Future[Any]) -> bytes:
        """The answer frame of a publish handed on, its round landed or failed."""
        seconds = time.perf_counter() - started
        error = future.exception()
        if error is None:
            self._broker.landed("publish", seconds, None)
            return answer_frame(encode_result("publish", future.result()))
        if isinstance(error, QueuePartitioned):  # declared partitioned since: by partition
            return self._alone("publish", request)
        return refusal_frame(self._broker.landed("publish", seconds, cast(Exception, error)))
