"""Which held messages' leases are due for extension: :class:`LeaseRenewals`."""

from __future__ import annotations

import math


class LeaseRenewals:
    """When the lease of each message a consumer holds (prefetched or in hand) is extended
    next: half a lease period after it was leased (:meth:`track`) or last extended
    (:meth:`extending`), so an extension lands long before the lease runs out.

    - :meth:`due` returns exactly the seqs whose time has come. It scans them only once the
      earliest is due (:attr:`next_at`), not at every wake-up of the background thread;
      :attr:`next_at` is never later than the earliest, and may be earlier after an
      acknowledgement (then the scan finds none and moves it on).
    - A message acknowledged or returned is no longer extended (:meth:`forget`); a nack that
      failed keeps it held and puts its time back (:meth:`restore`); an extension that
      failed with a transient error is due again at once (:meth:`retry`).

    Not thread-safe: its consumer calls it under its lock.
    """

    def __init__(self, lease_period_seconds: float) -> None:
        self.lease_period_seconds = lease_period_seconds
        self._renew_at: dict[int, float] = {}  # seq -> when its lease is extended next
        self.next_at = math.inf  # the earliest of them, or earlier (never later)

    def __len__(self) -> int:
        return len(self._renew_at)

    def track(self, seqs: list[int], now: float) -> None:
        """``seqs`` were leased at ``now`` (again, for any already tracked)."""
        renew_at = now + self.lease_period_seconds / 2
        for seq in seqs:
            self._renew_at[seq] = renew_at
        if seqs:
            self.next_at = min(self.next_at, renew_at)

    def forget(self, seq: int) -> float | None:
        """``seq`` is no longer held: when it was due, or None where it was not tracked."""
        return self._renew_at.pop(seq, None)

    def restore(self, seq: int, renew_at: float) -> None:
        """``seq`` is held again, due at ``renew_at`` (what :meth:`forget` returned)."""
        self._renew_at[seq] = renew_at
        self.next_at = min(self.next_at, renew_at)

    def due(self, now: float) -> list[int]:
        """The seqs whose lease is due for extension at ``now``."""
        if now < self.next_at:
            return []
        due = [seq for seq, at in self._renew_at.items() if at <= now]
        if not due:  # the earliest was acked or nacked since
            self.next_at = min(self._renew_at.values(), default=math.inf)
        return due

    def extending(self, seqs: list[int], now: float) -> None:
        """An extension of ``seqs`` was sent at ``now``: the ones still held are due half a
        lease period later."""
        later = now + self.lease_period_seconds / 2
        for seq in seqs:
            if seq in self._renew_at:
                self._renew_at[seq] = later
        self.next_at = min(self._renew_at.values(), default=math.inf)

    def retry(self, seqs: list[int], now: float) -> None:
        """An extension of ``seqs`` failed with a transient error: the ones still held are
        due again at ``now``."""
        for seq in seqs:
            if seq in self._renew_at:
                self._renew_at[seq] = now
                self.next_at = now

    def wait_seconds(self, now: float) -> float | None:
        """How long from ``now`` until the next extension may be due (0 or less: it may
        be); None when nothing is held."""
        return self.next_at - now if self._renew_at else None
