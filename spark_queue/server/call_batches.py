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
        handed: list[Future[Any] | None] = []
        running: list[Future[bytes] | None] = []
        answers: list[bytes | None] = []
        for method, request in calls:
            taken: list[Future[Any]] = []
            answer: bytes | None = None
            pending: Future[bytes] | None = None
            if method != "publish":
                error = BrokerRequestError(
                    f"malformed request: a batch holds publishes only, not {method!r}; "
                    f"nothing of it was done"
                )
                answer = refusal_frame(self._broker.landed(method, 0.0, error))
            else:
                try:
                    served = self._broker.serve_one(method, request, taken.append)
                    answer = None if taken else answer_frame(served)
                except WouldWait:
                    pending = self._workers.submit(self._alone, method, request)
                except flight.FlightError as refused:
                    answer = refusal_frame(refused.extra_info or b"")
            answers.append(answer)
            handed.append(taken[0] if taken else None)
            running.append(pending)
        wait([f for f in [*handed, *running] if f is not None])
        return [
            answer
            if answer is not None
            else self._landed(calls[k][1], started, handed[k])
            if handed[k] is not None
            else _result(running[k])
            for k, answer in enumerate(answers)
        ]

    def _alone(self, method: str, request: bytes) -> bytes:
        try:
            return answer_frame(self._broker.serve_one(method, request, None))
        except flight.FlightError as refused:
            return refusal_frame(refused.extra_info or b"")

    def _landed(self, request: bytes, started: float, future: Future[Any] | None) -> bytes:
        """The answer frame of a publish handed on, its round landed or failed."""
        assert future is not None
        seconds = time.perf_counter() - started
        error = future.exception()
        if error is None:
            self._broker.landed("publish", seconds, None)
            return answer_frame(encode_result("publish", future.result()))
        if isinstance(error, QueuePartitioned):  # declared partitioned since: by partition
            return self._alone("publish", request)
        return refusal_frame(self._broker.landed("publish", seconds, cast(Exception, error)))


def _result(future: Future[bytes] | None) -> bytes:
    assert future is not None
    return future.result()
