"""The wall clock as the product reads it (``spark_queue.storage.store.now_micros``), for tests
whose checks depend on time.

A test may wait for an instant the product stored (a lease's ``until``, a message's due
time) to pass: that is a lower bound, true however slow the machine. What a test must not
do is assume that something has *not* happened yet because little time went by: a loaded
2-core CI machine can take seconds over a commit or a Spark query. Such checks use windows
of minutes, and the "later" part is brought forward by the test itself (``extend`` a lease
to a millisecond, a short nack delay) and then waited for with :func:`wait_past`.
"""

from __future__ import annotations

import time

from spark_queue.storage.store import now_micros

__all__ = ["now_micros", "wait_past"]


def wait_past(instant: int, timeout: float = 120) -> None:
    """Poll the clock until it is past ``instant`` (microseconds since the epoch)."""
    deadline = time.monotonic() + timeout
    while now_micros() <= instant:
        assert time.monotonic() < deadline, f"the clock did not pass {instant}"
        time.sleep(min(0.02, max(0.001, (instant - now_micros()) / 1e6)))
