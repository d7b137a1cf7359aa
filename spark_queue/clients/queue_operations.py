"""What the clients use of a queue table: :class:`QueueOperations`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

if TYPE_CHECKING:
    from spark_queue.model.results import PublishOutcome
    from spark_queue.storage.store import QueueStore


class QueueOperations(Protocol):
    """What the clients use of a table: :class:`~spark_queue.table.QueueTable`'s
    operations, with their signatures (anything serving them, a broker's stub say, serves
    the clients); ``store`` is read for long polling."""

    store: QueueStore

    def lease(self, queue: str, consumer: str = ..., **options: Any) -> pa.Table: ...

    def ack(self, queue: str, seqs: list[int], consumer: str | None = ...) -> int: ...

    def cancel(
        self,
        queue: str,
        seqs: list[int],
        consumer: str | None = ...,
        *,
        delay: str | int | None = ...,
    ) -> int: ...

    def extend(self, queue: str, seqs: list[int], consumer: str, period: str | int) -> int: ...

    def release(
        self, consumer: str, queue: str | None = ..., *, seqs: list[int] | None = ...
    ) -> int: ...

    def publish_outcome(self, queue: str, rows: Any, **options: Any) -> PublishOutcome: ...
