"""How long a writer that lost a commit race waits before it tries again.

Every writer of a queue table uses it: a transaction planned again (:mod:`spark_queue.
transaction`), a commit group's round (:mod:`spark_queue.commit.group`), the claim of an
automatic vacuum (:mod:`spark_queue.commit.maintenance`). Pure; safe from any thread.
"""

from __future__ import annotations

import random

BACKOFF_BASE = 0.02  # seconds before the second attempt, at most
BACKOFF_CAP = 1.0  # seconds between two attempts, at most


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt`` (2 and up): a random time below a bound
    that doubles from :data:`BACKOFF_BASE` up to :data:`BACKOFF_CAP` ("full jitter"), so
    writers that collided do not collide again in lockstep."""
    return random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 2)))
