"""What the clients use of a queue table: :class:`QueueOperations`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from spark_queue.model.declarations import check_signature

if TYPE_CHECKING:
    from spark_queue.model.keywords import DurationLike, SeqsLike
    from spark_queue.model.results import PublishOutcome
    from spark_queue.storage.store import QueueStore


class QueueOperations(Protocol):
    """What the clients use of a table: :class:`~spark_queue.table.QueueTable`'s
    operations, with their signatures (anything serving them, a broker's stub say, serves
    the clients); ``store`` is read for long polling. ``publish_outcome``'s signature is
    declared once, by ``QueueTable.publish_outcome``."""

    store: QueueStore

    def lease(
        self,
        queue: str,
        consumer: str = ...,
        *,
        max_messages: int | None = ...,
        max_bytes: int | None = ...,
        lease_period: DurationLike | None = ...,
        max_deliveries: int | None = ...,
        max_cancels: int | None = ...,
        filter: str | None = ...,
    ) -> pa.Table: ...

    def ack(self, queue: str, seqs: SeqsLike, consumer: str | None = ...) -> int: ...

    def cancel(
        self,
        queue: str,
        seqs: SeqsLike,
        consumer: str | None = ...,
        *,
        delay: DurationLike | None = ...,
    ) -> int: ...

    def extend(self, queue: str, seqs: SeqsLike, consumer: str, period: DurationLike) -> int: ...

    def release(
        self, queue: str | None = ..., *, consumer: str, seqs: SeqsLike | None = ...
    ) -> int: ...

    @property
    def publish_outcome(self) -> Callable[..., PublishOutcome]:
        """``QueueTable.publish_outcome``, whose signature its definition declares."""
        ...


# Its lease's keywords are the specification's (a stub's types name what only type checkers
# import).
check_signature(QueueOperations.lease, "lease", typed=False)
