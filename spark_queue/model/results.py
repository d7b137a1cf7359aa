"""What a queue operation hands back to its caller, as values: the same for a call that
commits in this process and one a broker ran and sent back over the wire."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PublishResult:
    """What :meth:`QueueTable.publish` did."""

    queue: str
    seqs: list[int]  # of the messages stored, in the order given
    rejected: int  # refused by a reject policy (never stored)
    evicted: int  # other messages removed to make room (ring: replaced; drop-head: dropped)
    dead_lettered: int  # copies this commit sent to the dead-letter queue
    duplicate: bool = False  # (producer, sequence) was committed before: nothing enqueued
    version: int | None = None  # the Delta version of the commit (None: nothing committed)
    attempts: int = 1  # commit attempts it took; above 1, other writers won earlier ones
    # Messages not enqueued because their message_id was enqueued within the queue's
    # duplicate_window (or earlier in this same publish).
    duplicates: int = 0


@dataclass(frozen=True)
class PublishOutcome:
    """What a publish request did: the caller's result, and which of its rows were stored
    (``accepted[i]``: row ``i``, in the order given)."""

    result: PublishResult
    accepted: np.ndarray
