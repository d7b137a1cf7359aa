"""The keyword arguments of the Python API as types, for type checkers and editors.

:class:`QueueArgumentKeywords` are the queue arguments that ``QueueTable.declare``,
``alter``, ``resolve`` and ``publish`` and a ``Publisher`` take as keywords;
:class:`ConsumerOptions` and :class:`PublisherOptions` are the options of
``QueueTable.consumer`` and ``QueueTable.publisher``. The choices are the specification's
``Literal`` types (:data:`~spark_queue.model.arguments.Overflow` ...).

These types say what a type checker accepts; at run time every value is still parsed by
the specification (:mod:`spark_queue.model.arguments`), which also takes what the types
leave out (text such as ``"true"``, a numpy integer, a choice in capitals) and refuses a
wrong value with one :class:`~spark_queue.InvalidOptionError` naming the argument. Each type
is checked against the specification as this module is imported
(:mod:`spark_queue.model.declarations`): its keys are a scope's arguments, a choice's
``Literal`` has the choice's values, a duration is :data:`DurationLike`, and ``None`` is
admitted only where the argument can be none.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Collection
from typing import TypedDict

import numpy as np
import pyarrow as pa

from spark_queue.model.arguments import ExpirationModel, OnReject, Overflow
from spark_queue.model.declarations import check_keywords

# ``**keywords: Unpack[QueueArgumentKeywords]``: typing's from Python 3.11, and
# typing_extensions' (a dependency there) on 3.10.
if sys.version_info >= (3, 11):
    from typing import Unpack as Unpack
else:
    from typing_extensions import Unpack as Unpack

DurationLike = int | str | dt.timedelta
"""A duration: a whole number of milliseconds, a text in the one grammar (``"30s"``,
``"5 minutes"``, ``"1 week"``), or a ``timedelta`` of whole milliseconds."""
SeqsLike = Collection[int] | np.ndarray | pa.Array | pa.ChunkedArray
"""Seqs to act on (``QueueTable.ack``, ``cancel`` ...): in a list, tuple, range or set, a
numpy integer array, or a pyarrow integer array (a leased table's ``seq`` column)."""


class QueueArgumentKeywords(TypedDict, total=False):
    """The queue arguments as keywords (docs/ARGUMENTS.md), each optional; ``None`` limits
    and durations mean none."""

    max_length: int | None
    max_length_bytes: int | None
    ring_size: int | None
    overflow: Overflow
    dead_letter_queue: str | None
    reject_threshold: float
    expiration: DurationLike | None
    expiration_model: ExpirationModel
    max_deliveries: int | None
    max_cancels: int | None
    exclusive: bool
    redelivery_delay: DurationLike | None
    redelivery_multiplier: float
    max_redelivery_delay: DurationLike | None
    message_groups: bool
    duplicate_window: DurationLike | None
    partitions: int


class ConsumerOptions(TypedDict, total=False):
    """The options of ``QueueTable.consumer`` (a :class:`~spark_queue.Consumer`'s)."""

    max_prefetch: int
    lease_period: DurationLike
    ack_batch: int
    ack_interval: DurationLike | None
    idle_check_interval: DurationLike | None
    idle_lease_interval: DurationLike
    max_deliveries: int | None
    max_cancels: int | None
    filter: str | None


class PublisherOptions(QueueArgumentKeywords, total=False):
    """The options of ``QueueTable.publisher`` (a :class:`~spark_queue.Publisher`'s): its
    own, and the queue arguments of the queue it declares on first use."""

    linger: DurationLike
    max_batch: int
    on_reject: OnReject


check_keywords(QueueArgumentKeywords, "queue")
check_keywords(ConsumerOptions, "consumer")
check_keywords(PublisherOptions, "publisher", "queue")
