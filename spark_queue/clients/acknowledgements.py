"""Acknowledgements batched before they are committed: :class:`PendingAcknowledgements`,
and the interval a consumer flushes them at (:func:`acknowledgement_interval_ms`)."""

from __future__ import annotations

from spark_queue.errors import InvalidOptionError

DEFAULT_ACK_INTERVAL_MS = 1000  # a quarter of the lease period where that is shorter


def acknowledgement_interval_ms(given_ms: float | None, lease_period_ms: int) -> float:
    """The longest an acknowledgement waits for its flush: ``given_ms``, or None for
    :data:`DEFAULT_ACK_INTERVAL_MS` or a quarter of ``lease_period_ms`` where that is shorter.

    Raises:
        InvalidOptionError: the interval is half the lease period or more. An acknowledged
            message's lease is no longer extended: its flush must land before the lease
            runs out, or the message is delivered again.
    """
    interval_ms = (
        min(DEFAULT_ACK_INTERVAL_MS, lease_period_ms / 4) if given_ms is None else given_ms
    )
    if interval_ms >= lease_period_ms / 2:
        raise InvalidOptionError(
            f"ack_interval ({interval_ms:g} ms) must be below half the "
            f"lease_period ({lease_period_ms} ms)"
        )
    return interval_ms


class PendingAcknowledgements:
    """The seqs acknowledged and not committed yet, in the order they were acknowledged.

    - They are due for a flush (:meth:`due`) once ``batch_size`` are pending, or once the
      oldest has waited ``interval_seconds``; :meth:`wait_seconds` is how long until the
      latter.
    - :meth:`take` hands every pending seq to a flush and leaves none pending. A flush that
      failed puts its seqs back ahead of those acknowledged since: :meth:`put_back` keeps
      them waiting from then on (a caller's :meth:`flush <spark_queue.clients.consumer.
      Consumer.flush>` raised the error), :meth:`retry` makes them due at once (the
      background thread waited out a transient failure).

    Not thread-safe: its consumer calls it under its lock.
    """

    def __init__(self, batch_size: int, interval_seconds: float) -> None:
        self.batch_size = batch_size
        self.interval_seconds = interval_seconds
        self._seqs: list[int] = []
        self._oldest_at = 0.0  # when the oldest pending seq was acknowledged

    def __len__(self) -> int:
        return len(self._seqs)

    def add(self, seq: int, now: float) -> None:
        """``seq`` was acknowledged at ``now``."""
        if not self._seqs:
            self._oldest_at = now
        self._seqs.append(seq)

    def due(self, now: float) -> bool:
        """Whether the pending seqs are flushed now."""
        return bool(self._seqs) and (
            len(self._seqs) >= self.batch_size or now - self._oldest_at >= self.interval_seconds
        )

    def wait_seconds(self, now: float) -> float | None:
        """How long from ``now`` until the oldest pending seq has waited its interval (0 or
        less: it has); None when none is pending."""
        if not self._seqs:
            return None
        return self._oldest_at + self.interval_seconds - now

    def take(self) -> list[int]:
        """Every pending seq, for a flush; none stays pending."""
        seqs, self._seqs = self._seqs, []
        return seqs

    def put_back(self, seqs: list[int], now: float) -> None:
        """A flush of ``seqs`` failed at ``now``: pending again, ahead of the rest."""
        if not self._seqs:
            self._oldest_at = now
        self._seqs[:0] = seqs

    def retry(self, seqs: list[int], now: float) -> None:
        """A flush of ``seqs`` failed at ``now`` with a transient error: pending again, ahead
        of the rest, and due at once (the background thread sends them after its backoff)."""
        self._seqs[:0] = seqs
        self._oldest_at = now - self.interval_seconds
