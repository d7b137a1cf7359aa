"""How a broker stops (``spark-queue broker``'s SIGTERM, :func:`~spark_queue.server.flight.
run_broker`): its requests drained, then its Flight server shut down, or the process ended
where that cannot finish."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Protocol

log = logging.getLogger("spark_queue.server.flight")


class Stoppable(Protocol):
    """What a stop needs of a broker (:class:`~spark_queue.server.flight.QueueBroker`)."""

    id: str

    def drain(self, deadline: float) -> int: ...

    def shutdown(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


def stop_broker(server: Stoppable, deadline: float, timeout_seconds: float) -> None:
    """Drain ``server`` and shut it down by ``deadline``; past it, cancel what is still
    open by exiting the process (Flight's shutdown waits for every call, a stalled upload's
    too, and cancels none): their clients get no answer, as from a broker killed, and run
    their requests again directly."""
    still_open = server.drain(deadline)
    closing = threading.Thread(target=server.shutdown, name="broker-shutdown", daemon=True)
    closing.start()
    # Streams of calls idle now hold the shutdown for as long as their clients keep them
    # open: with nothing in flight, the exit closes them (their clients' next calls find
    # them ended, and go on a new stream or directly).
    idle_streams = 0 if still_open else server.status()["streams_open"]
    # An idle server's shutdown takes milliseconds: give it a moment past the deadline.
    closing.join(0.5 if idle_streams else max(0.5, deadline - time.monotonic()))
    if idle_streams and closing.is_alive():
        log.info("broker %s stopped: %s (idle streams closed)", server.id, server.status())
        logging.shutdown()
        os._exit(0)
    if still_open or closing.is_alive():
        log.warning(
            "broker %s stopped with requests still open after %g s (--stop-timeout): "
            "cancelled, nothing of them answered: %s",
            server.id,
            timeout_seconds,
            server.status(),
        )
        logging.shutdown()  # flushes the log before the exit skips the interpreter's
        os._exit(0)
