"""Publishes handed on to whoever answers their callers, so that no thread waits for each
one's round.

A broker serves a batch of publishes (:mod:`spark_queue.server.call_batches`) in one
handler thread: within :func:`handing_on`, each publish of a queue without partitions that
this thread submits to its group commit is not waited for: its future goes to the function
given, and the call returns :data:`HANDED_ON`. A publish that would wait on its own path (a
partitioned queue's, by partition) raises :class:`WouldWait` before any of its messages is
stored, so that the broker runs it on a thread of its own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Final


class HandedOn:
    """What a call returns whose publish was handed on (:func:`handing_on`)."""

    def __repr__(self) -> str:
        return "HANDED_ON"


HANDED_ON: Final = HandedOn()


class WouldWait(Exception):
    """Within :func:`handing_on`: a call that would wait for its commit other than by one
    future to hand on. Raised before any of its messages is stored."""


_taker = threading.local()


@contextlib.contextmanager
def handing_on(take: Callable[[Future[Any]], None]) -> Iterator[None]:
    """While active, the next publish this thread submits whole goes to ``take`` (its
    future, once submitted; ``take`` must not block) instead of being waited for."""
    _taker.take = take
    try:
        yield
    finally:
        _taker.take = None


def hand_on(future: Future[Any]) -> bool:
    """Give ``future``, a whole publish's, to the ``take`` :func:`handing_on` set on this
    thread, if any (once); whether it was given (its caller then returns
    :data:`HANDED_ON`)."""
    take: Callable[[Future[Any]], None] | None = getattr(_taker, "take", None)
    if take is None:
        return False
    _taker.take = None
    take(future)
    return True


def must_not_hand_on() -> None:
    """Raise :class:`WouldWait` within :func:`handing_on` (before the caller does
    anything): its call waits on a path of its own."""
    if getattr(_taker, "take", None) is not None:
        raise WouldWait
