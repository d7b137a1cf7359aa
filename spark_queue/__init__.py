"""spark-queue: broker-grade bounded (ring) queues for Spark, persisted as Delta tables.

``format("ringqueue")`` enqueues (``writeStream``/``write``) and browses (``read``); register
it with :func:`register` on a session, or build a local one with :func:`local_session`.
:class:`QueueTable` is the Python API of a queue table.

Every public name is here (``__all__``): the table, its clients and results, the queue
arguments (their typed keywords and choices), policies, the columns and counters a queue
reports, storage locations and their check, every error and the warning of an old spelling.
The subpackages are the implementation; code that uses spark-queue imports from
``spark_queue`` alone. The argument specification and the helpers of the command line and
the jobs are theirs (:mod:`spark_queue.model.arguments`, ...), not the package's API.

The subpackages are layers by role, each importing only from those before it
(``tests/test_layout.py`` holds the map):

- :mod:`~spark_queue.errors`: the named errors;
- :mod:`~spark_queue.model`: what the values are: the argument specification, queue
  arguments, consumer limits, policies, schemas, messages, results;
- :mod:`~spark_queue.rules`: the queue rules, pure: limits and overflow, leases,
  de-duplication, each queue's state;
- :mod:`~spark_queue.storage`: the table on storage: location, files, the log and its
  snapshots, reads, history;
- :mod:`~spark_queue.commit`: the commit engine: transactions, enqueue, requests and group
  commit, maintenance;
- :mod:`~spark_queue.broker`: the broker's client side: how calls reach a broker, how
  brokers are found and trusted;
- :mod:`~spark_queue.clients`: the consumer and the publisher;
- :mod:`~spark_queue.table`: :class:`QueueTable`;
- :mod:`~spark_queue.server`: the broker's servers (Arrow Flight, Amazon SQS's API,
  Prometheus metrics), and :mod:`~spark_queue.spark`: the data source (the only importer of
  PySpark);
- :mod:`~spark_queue.cli`: the ``spark-queue`` command.
"""

import importlib
from typing import TYPE_CHECKING, Any

from spark_queue.clients.consumer import Consumer
from spark_queue.clients.message import Message
from spark_queue.clients.publisher import Publisher
from spark_queue.errors import (
    ArgumentMismatchError,
    BrokerAuthenticationError,
    BrokerError,
    BrokerRequestError,
    ClientClosedError,
    CommitConflictError,
    CommitUnknownError,
    InvalidInputError,
    InvalidOptionError,
    NotAQueueTableError,
    PartitionedQueueError,
    PolicyError,
    QueueError,
    QueueNotFoundError,
    RejectedMessagesError,
    StorageError,
    TableNotFoundError,
    UnsupportedFormatError,
)
from spark_queue.model.arguments import (
    AckMode,
    ExpirationModel,
    OnReject,
    Overflow,
    ReadMode,
    Semantics,
)
from spark_queue.model.deprecations import SparkQueueDeprecationWarning, warn_deprecated
from spark_queue.model.keywords import (
    ConsumerOptions,
    DurationLike,
    PublisherOptions,
    QueueArgumentKeywords,
    SeqsLike,
)
from spark_queue.model.messages import DataFrameLike, Rows
from spark_queue.model.policies import Origin, Policies, Policy, Resolution
from spark_queue.model.queue_arguments import QueueArguments
from spark_queue.model.results import PublishOutcome, PublishResult, QueueStats
from spark_queue.model.schema import BROWSE_ARROW_SCHEMA, BROWSE_COLUMNS
from spark_queue.rules import COUNTERS
from spark_queue.storage.history import GAUGES
from spark_queue.storage.location import Location, check_exclusive_commits
from spark_queue.table import QueueTable

# Spark is optional (``pip install "spark-queue[spark]"``): QueueTable runs without it, so
# the session helpers are imported only when asked for. Type checkers and the API reference
# read them from their module.
if TYPE_CHECKING:
    from spark_queue.spark.session import configure_s3a, local_session, register, s3a_conf

_SPARK_HELPERS = ("configure_s3a", "local_session", "register", "s3a_conf")
# Names the package exported that only its command line and jobs use: still here for one
# release, each with a warning naming the module it comes from.
_MOVED = {
    "ARGUMENTS": "spark_queue.model.arguments",
    "Argument": "spark_queue.model.arguments",
    "flag_type": "spark_queue.model.arguments",
    "validate_arguments": "spark_queue.model.queue_arguments",
    "parse_storage_flags": "spark_queue.storage.location",
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warn_deprecated(
            f"spark_queue.{name} is deprecated: it is not part of the API; import it from "
            f"{_MOVED[name]}"
        )
        return getattr(importlib.import_module(_MOVED[name]), name)
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
    "BROWSE_ARROW_SCHEMA",
    "BROWSE_COLUMNS",
    "COUNTERS",
    "GAUGES",
    "AckMode",
    "ArgumentMismatchError",
    "BrokerAuthenticationError",
    "BrokerError",
    "BrokerRequestError",
    "ClientClosedError",
    "CommitConflictError",
    "CommitUnknownError",
    "Consumer",
    "ConsumerOptions",
    "DataFrameLike",
    "DurationLike",
    "ExpirationModel",
    "InvalidInputError",
    "InvalidOptionError",
    "Location",
    "Message",
    "NotAQueueTableError",
    "OnReject",
    "Origin",
    "Overflow",
    "PartitionedQueueError",
    "Policies",
    "Policy",
    "PolicyError",
    "PublishOutcome",
    "PublishResult",
    "Publisher",
    "PublisherOptions",
    "QueueArgumentKeywords",
    "QueueArguments",
    "QueueError",
    "QueueNotFoundError",
    "QueueStats",
    "QueueTable",
    "ReadMode",
    "RejectedMessagesError",
    "Resolution",
    "Rows",
    "Semantics",
    "SeqsLike",
    "SparkQueueDeprecationWarning",
    "StorageError",
    "TableNotFoundError",
    "UnsupportedFormatError",
    "check_exclusive_commits",
    "configure_s3a",
    "local_session",
    "register",
    "s3a_conf",
]
