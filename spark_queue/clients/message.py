"""A message a consumer delivered (:class:`Message`), made from the rows a lease returned
(:func:`messages_of`), and the seq an acknowledgement names (:func:`seq_of`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import pyarrow as pa

from spark_queue.errors import InvalidOptionError
from spark_queue.model.arguments import SEQ, parse_seq, shown
from spark_queue.model.keywords import DurationLike


class Settler(Protocol):
    """What a message is acknowledged or returned through: the
    :class:`~spark_queue.clients.consumer.Consumer` that delivered it."""

    def ack(self, message: Message | int) -> None: ...

    def nack(self, message: Message | int, delay: DurationLike | None = None) -> None: ...


# The columns of a lease's rows that a Message carries, in its fields' order.
MESSAGE_COLUMNS = (
    "queue",
    "seq",
    "body",
    "key",
    "headers",
    "message_id",
    "priority",
    "delivery_count",
    "enqueued_at",
)


@dataclass
class Message:
    """A message a :class:`Consumer` delivered: ack it, or nack it, once handled.

    Attributes:
        queue: the queue it came from.
        seq: its sequence number in the queue, what :meth:`QueueTable.ack` takes.
        body: its body.
        key: its key (the group of a queue with ``message_groups``), or None.
        headers: its headers, or None.
        message_id: its id (de-duplication), or None.
        priority: its priority (higher first; 0 by default).
        delivery_count: the deliveries so far, this one included: 1 on the first.
        enqueued_at: when it was enqueued (UTC).
        consumer: the consumer that delivered it.
    """

    queue: str
    seq: int
    body: bytes
    key: str | None
    headers: dict[str, str] | None
    message_id: str | None
    priority: int
    delivery_count: int
    enqueued_at: datetime | None
    consumer: Settler = field(repr=False, compare=False)

    def ack(self) -> None:
        """Acknowledge it (batched: see :class:`Consumer`)."""
        self.consumer.ack(self)

    def nack(self, delay: DurationLike | None = None) -> None:
        """Return it to the queue now, counted as a cancel (see :meth:`Consumer.nack`).

        Args:
            delay: how long before it is ready again, a duration (``30 seconds``, ``5m``,
                a ``timedelta``, milliseconds); None: the queue's redelivery backoff.
        """
        self.consumer.nack(self, delay)


def messages_of(leased: pa.Table, consumer: Settler) -> list[Message]:
    """The messages of the rows a lease of ``consumer`` returned, in their order."""
    columns = leased.select(list(MESSAGE_COLUMNS)).to_pydict()
    return [
        Message(
            queue=columns["queue"][i],
            seq=columns["seq"][i],
            body=columns["body"][i],
            key=columns["key"][i],
            headers=None if columns["headers"][i] is None else dict(columns["headers"][i]),
            message_id=columns["message_id"][i],
            priority=columns["priority"][i],
            delivery_count=columns["delivery_count"][i],
            enqueued_at=columns["enqueued_at"][i],
            consumer=consumer,
        )
        for i in range(leased.num_rows)
    ]


def seq_of(message: Message | int) -> int:
    """The seq of a message given to ``Consumer.ack`` or ``Consumer.nack``: a
    :class:`Message`, or its seq.

    Raises:
        InvalidOptionError: ``message`` is neither.
    """
    if isinstance(message, Message):
        return message.seq
    try:
        return parse_seq("message", message)
    except InvalidOptionError:
        raise InvalidOptionError(
            f"message must be a Message or {SEQ.valid}; got {shown(message)}"
        ) from None
