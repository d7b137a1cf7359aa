"""How many messages a consumer holds prefetched: :class:`PrefetchBound`, sized from how
long a lease takes and how long its receivers take a message."""

from __future__ import annotations

import math
import threading

RECEIVERS_SEEN_SECONDS = 5.0  # threads that received within this long share the handling
GROWTH = 32  # a prefetch that ran dry grows this many times: a fast handler is fed soon


class PrefetchBound:
    """How many messages a consumer keeps prefetched (:attr:`target`) and how few it lets
    the prefetch run down to before it leases again (:attr:`low_water`).

    - The bound is measured: ``r``, how long a lease takes (:meth:`lease_took`), and ``h``,
      how long a receiver takes a message (from a delivery, :meth:`delivered`, to the same
      thread's return for more, :meth:`receiver_back`), shared by the threads that received
      within :data:`RECEIVERS_SEEN_SECONDS`. While a lease is in flight ``need = ceil(r /
      (h / receivers))`` messages are handled, so ``target = min(max_prefetch, need + need
      // 2)`` and ``low_water = min(need - 1, target // 2)``. Both times are moving averages
      that follow a change within a few samples.
    - Before both are measured, ``target`` starts at 1 and ``low_water`` at 0; whenever the
      last lease got all it asked for and a receiver then found nothing prefetched
      (:meth:`grow_if_outrun`), ``target`` grows :data:`GROWTH`-fold, up to
      ``max_prefetch``, and ``low_water`` is half of it.
    - :meth:`lease_size` is what the next lease asks for: nothing while more than
      ``low_water`` are prefetched or ``max_prefetch`` are held (prefetched and in hand);
      else up to ``target`` prefetched, never more than ``max_prefetch`` held.

    A receiver is a thread: what it was last delivered is remembered per thread. Not
    thread-safe otherwise: its consumer calls it under its lock.
    """

    def __init__(self, max_prefetch: int) -> None:
        self.max_prefetch = max_prefetch
        self.target = 1
        self.low_water = 0
        self.lease_seconds: float | None = None  # how long a lease takes (moving average)
        self.handling_seconds: float | None = None  # how long a thread takes a message
        self.last_lease_full = False  # the last lease got all it asked: the queue may have more
        self._receivers_seen: dict[int, float] = {}  # thread id -> when it last received
        self._delivered = threading.local()  # this thread's last delivery: when, how many

    @property
    def sizes(self) -> tuple[int, int]:
        """``(target, low_water)``: a change lets the consumer lease more."""
        return self.target, self.low_water

    def lease_size(self, prefetched: int, held: int) -> int:
        """How many messages the next lease asks for, with ``prefetched`` waiting and
        ``held`` prefetched or in hand: 0 when no lease is wanted."""
        room = self.max_prefetch - held
        if room <= 0 or prefetched > self.low_water:
            return 0
        return min(room, max(1, self.target - prefetched))

    def delivered(self, count: int, now: float) -> None:
        """This thread was handed ``count`` messages at ``now``."""
        self._delivered.at, self._delivered.count = now, count

    def receiver_back(self, now: float) -> None:
        """This thread is back for more at ``now``: measure how long it took each message it
        was last delivered, and size the bound again."""
        self._receivers_seen[threading.get_ident()] = now
        at = getattr(self._delivered, "at", None)
        if at is None:
            return
        self._delivered.at = None
        per_message = (now - at) / max(1, self._delivered.count)
        self.handling_seconds = moving_average(self.handling_seconds, per_message)
        self._resize(now)

    def lease_took(self, seconds: float, now: float) -> None:
        """A lease took ``seconds``: measure it, and size the bound again."""
        self.lease_seconds = moving_average(self.lease_seconds, seconds)
        self._resize(now)

    def lease_returned(self, got: int, wanted: int) -> None:
        """A lease asked for ``wanted`` messages and got ``got``."""
        self.last_lease_full = got == wanted

    def grow_if_outrun(self) -> None:
        """A receiver found nothing prefetched: before the handling is measured, a last
        lease that got all it asked for was too small; grow the bound."""
        if self.last_lease_full and self.handling_seconds is None:
            self.target = min(self.max_prefetch, self.target * GROWTH)
            self.low_water = self.target // 2
            self.last_lease_full = False

    def receivers(self, now: float) -> int:
        """The threads that received within :data:`RECEIVERS_SEEN_SECONDS` of ``now``."""
        return sum(
            1 for seen in self._receivers_seen.values() if now - seen < RECEIVERS_SEEN_SECONDS
        )

    def _resize(self, now: float) -> None:
        if self.handling_seconds is None or self.lease_seconds is None:
            return
        between_deliveries = max(self.handling_seconds, 1e-6) / max(1, self.receivers(now))
        need = max(1, math.ceil(self.lease_seconds / between_deliveries))
        self.target = min(self.max_prefetch, need + need // 2)
        self.low_water = min(need - 1, self.target // 2)


def moving_average(old: float | None, new: float) -> float:
    """A moving average that follows a change within a few samples."""
    return new if old is None else 0.7 * old + 0.3 * new
