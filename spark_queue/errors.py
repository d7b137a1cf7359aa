"""Named exceptions. Every message names the option, argument or column at fault.

Every one of them pickles and unpickles to its class and message (Spark sends errors raised
in its Python workers across processes), whatever its constructor takes: the pickle holds
the class, ``args`` and the attributes, never the chained cause (a delta-rs or pyarrow
object may not pickle).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def _restored(
    cls: type[QueueError], args: tuple[Any, ...], attributes: dict[str, Any]
) -> QueueError:
    """An error unpickled: its class, ``args`` and attributes, its ``__init__`` not run."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(attributes)
    return error


class QueueError(Exception):
    """Base class of every spark-queue error."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restored, (type(self), self.args, dict(self.__dict__)))


class InvalidOptionError(QueueError, ValueError):
    """An option or queue argument has an unknown name or an invalid value."""


class InvalidInputError(QueueError, ValueError):
    """The DataFrame handed to the sink has a missing, unknown or wrongly typed column."""


class ArgumentMismatchError(QueueError):
    """A write or ``declare`` gave an existing queue an argument with another value.

    As RabbitMQ's ``PRECONDITION_FAILED`` on re-declare: nothing is written; use ``alter``.
    """


class NotAQueueTableError(QueueError):
    """The path holds no queue table and cannot become one: another Delta table, a folder
    holding files of its own, or a folder inside a Delta table."""


class TableNotFoundError(QueueError):
    """No queue table at the path (nor any Delta table) where one must exist.

    Args:
        table: the queue table's path or URI, named in the message.

    Attributes:
        table: the queue table's path or URI.
    """

    def __init__(self, table: str) -> None:
        super().__init__(f"no queue table at {table}")
        self.table = table


class QueueNotFoundError(QueueError, KeyError):
    """The named queue was never declared in this queue table.

    Args:
        queue: the name asked for.
        table: the queue table's path or URI.
        queues: the queues the table has, listed in the message.

    Attributes:
        queue: the name asked for.
    """

    def __init__(self, queue: str, table: str, queues: Iterable[str]) -> None:
        super().__init__(f"queue {queue!r} does not exist in {table}; queues: {sorted(queues)}")
        self.queue = queue

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class RejectedMessagesError(QueueError):
    """``onReject=fail``: a reject policy refused messages, so the batch was not committed."""


class CommitConflictError(QueueError):
    """Every attempt to commit lost the race to another writer of the queue table.

    Writers commit optimistically: on a conflict the work is planned again on the new
    version, after a jittered backoff, up to a bound; only when the bound is spent does the
    operation fail, with nothing written.
    """


class UnsupportedFormatError(QueueError):
    """A streaming checkpoint's offset or a table's queue state is in a format version this
    spark-queue does not read; the message names the version found and the one it reads."""


class PartitionedQueueError(QueueError):
    """A partitioned queue (``partitions`` above 1) given to what serves one partition
    only: the Spark source and sink and the SQS API read and write the queue table they are
    given, which holds partition 0 alone (docs/PARTITIONS.md)."""


class PolicyError(InvalidOptionError):
    """A policies file is missing or invalid, or its policy makes a queue's arguments invalid.

    The message names the file, the line and the key at fault (``file:line: key 'k': ...``).
    """


class StorageError(QueueError):
    """The queue table's store cannot be reached, or cannot keep two writers' commits apart.

    The message names the table's URI and the storage option keys given, never their values.
    """


class CommitUnknownError(StorageError):
    """The store failed while a commit's log entry was being created, so the commit may
    have landed or not. Nothing it wrote was deleted (files no version names are vacuumed);
    a publish with ``producer`` and ``sequence``, or a streaming micro-batch (by its
    transaction), is safe to repeat."""


class BrokerError(QueueError):
    """A queue broker (``spark-queue broker``, docs/BROKER.md) could not serve a request.

    Raised where the broker fails in a way the table itself would not (an internal error of
    the broker); an unreachable or stopped broker raises nothing, as the client commits
    directly instead. Messages name the broker's address, never its token.
    """


class BrokerAuthenticationError(BrokerError):
    """The broker refused the client's token (missing or wrong): nothing was done."""


class BrokerRequestError(BrokerError, ValueError):
    """The broker refused a request as malformed or larger than its limit (its
    ``--max-request-bytes``): nothing was done."""


class ClientClosedError(QueueError):
    """A :class:`~spark_queue.Consumer` or :class:`~spark_queue.Publisher`
    was used after :meth:`close`."""
