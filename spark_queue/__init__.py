"""spark-queue: broker-grade bounded (ring) queues for Spark, persisted as Delta tables.

``format("ringqueue")`` enqueues (``writeStream``/``write``) and browses (``read``); register
it with :func:`register` on a session, or build a local one with :func:`local_session`.
:class:`QueueTable` is the Python API of a queue table.
"""

from spark_queue.enqueue import PublishResult
from spark_queue.errors import (
    ArgumentMismatchError,
    CommitConflictError,
    InvalidInputError,
    InvalidOptionError,
    NotAQueueTableError,
    PolicyError,
    QueueError,
    QueueNotFoundError,
    RejectedMessagesError,
    StorageError,
)
from spark_queue.options import QueueArguments
from spark_queue.session import local_session, register
from spark_queue.storage import check_exclusive_commits
from spark_queue.table import QueueTable

__all__ = [
    "ArgumentMismatchError",
    "CommitConflictError",
    "InvalidInputError",
    "InvalidOptionError",
    "NotAQueueTableError",
    "PolicyError",
    "PublishResult",
    "QueueArguments",
    "QueueError",
    "QueueNotFoundError",
    "QueueTable",
    "RejectedMessagesError",
    "StorageError",
    "check_exclusive_commits",
    "local_session",
    "register",
]
