"""spark-queue: broker-grade bounded (ring) queues for Spark, persisted as Delta tables.

``format("ringqueue")`` enqueues (``writeStream``/``write``) and browses (``read``); register
it with :func:`register` on a session, or build a local one with :func:`local_session`.
:class:`QueueTable` is the Python API of a queue table.
"""

from typing import TYPE_CHECKING, Any

from spark_queue.clients.consumer import Consumer
from spark_queue.clients.message import Message
from spark_queue.clients.publisher import Publisher
from spark_queue.errors import (
    ArgumentMismatchError,
    ClientClosedError,
    CommitConflictError,
    InvalidInputError,
    InvalidOptionError,
    NotAQueueTableError,
    PolicyError,
    QueueError,
    QueueNotFoundError,
    RejectedMessagesError,
    StorageError,
    TableNotFoundError,
    UnsupportedFormatError,
)
from spark_queue.model.queue_arguments import QueueArguments
from spark_queue.model.results import PublishResult
from spark_queue.storage.location import check_exclusive_commits
from spark_queue.table import QueueTable

# Spark is optional (``pip install "spark-queue[spark]"``): QueueTable runs without it, so
# the session helpers are imported only when asked for. Type checkers and the API reference
# read them from their module.
if TYPE_CHECKING:
    from spark_queue.spark.session import local_session, register

_SPARK_HELPERS = ("local_session", "register")


def __getattr__(name: str) -> Any:
    if name in _SPARK_HELPERS:
        try:
            from spark_queue.spark import session
        except ImportError as error:
            raise ImportError(
                f"spark_queue.{name} needs PySpark: pip install 'spark-queue[spark]' "
                f"(QueueTable runs without it): {error}"
            ) from error
        return getattr(session, name)
    raise AttributeError(f"module 'spark_queue' has no attribute {name!r}")


__all__ = [
    "ArgumentMismatchError",
    "ClientClosedError",
    "CommitConflictError",
    "Consumer",
    "InvalidInputError",
    "InvalidOptionError",
    "Message",
    "NotAQueueTableError",
    "PolicyError",
    "PublishResult",
    "Publisher",
    "QueueArguments",
    "QueueError",
    "QueueNotFoundError",
    "QueueTable",
    "RejectedMessagesError",
    "StorageError",
    "TableNotFoundError",
    "UnsupportedFormatError",
    "check_exclusive_commits",
    "local_session",
    "register",
]
