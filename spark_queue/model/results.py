"""What a queue operation hands back to its caller, as values: the same for a call that
commits in this process and one a broker ran and sent back over the wire."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np


@dataclass(frozen=True)
class PublishResult:
    """What :meth:`~spark_queue.QueueTable.publish` did.

    Attributes:
        queue: the queue published to.
        seqs: the seqs of the messages stored, in the order given.
        rejected: messages a reject policy refused (never stored).
        evicted: other messages removed to make room (a ring's replaced, drop-head's
            dropped).
        dead_lettered: copies this commit sent to the dead-letter queue.
        duplicate: the ``(producer, sequence)`` pair was committed before: nothing was
            enqueued.
        version: the Delta version of the commit (None: nothing was committed).
        attempts: the commit attempts it took; above 1, other writers won earlier ones.
        duplicates: messages not enqueued because their ``message_id`` was enqueued within
            the queue's ``duplicate_window`` (or earlier in the same publish).
    """

    queue: str
    seqs: list[int]
    rejected: int
    evicted: int
    dead_lettered: int
    duplicate: bool = False
    version: int | None = None
    attempts: int = 1
    duplicates: int = 0


@dataclass(frozen=True)
class PublishOutcome:
    """What a publish request did: the caller's result, and which of its rows were stored
    (``accepted[i]``: row ``i``, in the order given)."""

    result: PublishResult
    accepted: np.ndarray


class QueueStats(TypedDict):
    """What :meth:`~spark_queue.QueueTable.stats` returns: a queue's counters and gauges
    (SEMANTICS §4, :data:`~spark_queue.COUNTERS` and :data:`~spark_queue.GAUGES`), and the
    leases and message groups each consumer holds."""

    added: int
    acked: int
    replaced: int
    dropped: int
    rejected: int
    expired: int
    killed: int
    dead_lettered: int
    purged: int
    duplicates: int
    ready: int
    ready_bytes: int
    leased: int
    scheduled: int
    leased_by_consumer: dict[str, int]
    groups_by_consumer: dict[str, int]
