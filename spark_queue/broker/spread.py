"""A client's calls on a partitioned queue where the table records several live brokers:
each partition's share of a call goes to the broker that serves the partition
(:func:`~spark_queue.model.assignment.partition_owner` over the live brokers' ids;
docs/BROKER.md "Several brokers").

- ``publish``: the rows routed by the partitioner (keys, the producer) as here, then each
  partition's share to its broker, named as the request's partition; the shares at once,
  their answers put together as one. Rows without a key or a producer go, all of them, to
  the broker of the client's turn (one partition on at each such call), which places them
  by its own turn over the partitions it owns.
- ``lease``: the partitions in turn from the client's lease turn, as here (it stays on a
  partition while that fills the leases, a partition's commits being its broker's alone),
  each asked of its broker for what the ones before left.
- ``ack``, ``cancel``, ``expire``, ``extend`` and ``release`` of seqs: the seqs grouped by
  the partition they name, each group to its partition's broker, at once.

A share whose broker cannot be reached runs here (on its partition), and that broker is
skipped for a while, so its partitions go to the next broker in rendezvous order meanwhile
(:meth:`BrokerRouter.send <spark_queue.broker.client.BrokerRouter.send>`). Everything else
(a queue without partitions, ``stats``, a ``release`` of every lease, arguments this module
cannot split, which the table then refuses) goes the way of one broker.

Correctness rests on no broker owning a partition alone: two brokers serving one partition
at once (clients that see different live brokers for a moment) only race for its commits,
which are optimistic.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from inspect import BoundArguments
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from spark_queue.broker.discovery import BrokerRecord
from spark_queue.broker.wire import bind_arguments
from spark_queue.errors import QueueError
from spark_queue.model.assignment import partition_owner
from spark_queue.model.kinds import parse_seqs
from spark_queue.model.messages import Bodies, as_input_table
from spark_queue.model.operations import deliveries_of, idempotence
from spark_queue.model.partition_calls import (
    lease_in_turn,
    lease_version,
    merged_outcome,
    scoped_partition,
)
from spark_queue.model.partitions import partition_of

# The calls whose shares go to their partitions' brokers.
SEQ_METHODS = ("ack", "cancel", "expire", "extend", "release")
SPREAD_METHODS = ("publish", "lease", *SEQ_METHODS)
# Shares sent at once from one call, at most (each waits on its broker's commit).
SHARE_THREADS = 32


class NotSpread:
    """:func:`spread_call`'s answer for a call it leaves to one broker."""


NOT_SPREAD = NotSpread()


class ShareSender(Protocol):
    """Where a share goes: the router (:class:`~spark_queue.broker.client.BrokerRouter`)."""

    def send_share(
        self,
        record: BrokerRecord,
        method_name: str,
        method: Callable[..., Any],
        table: Any,
        bound: BoundArguments,
        partition: int | None,
    ) -> Any:
        """``method`` with ``bound`` at ``record``'s broker (on ``partition`` where given),
        or here where that broker cannot be reached."""


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _at_once(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Every call's result, the first in this thread and the rest at once beside it; the
    first error raised once all are done (a share that failed leaves the others'
    commits)."""
    global _executor
    if len(calls) == 1:
        return [calls[0]()]
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(SHARE_THREADS, thread_name_prefix="spark-queue-share")
        executor = _executor
    futures: list[Future[Any]] = [executor.submit(call) for call in calls[1:]]
    try:
        first = calls[0]()
    finally:
        for future in futures:
            future.exception()
    return [first, *(future.result() for future in futures)]


def spread_call(
    sender: ShareSender,
    records: Sequence[BrokerRecord],
    method_name: str,
    method: Callable[..., Any],
    table: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``method(table, *args, **kwargs)`` (a routed ``QueueTable`` method, ``method_name``
    on the wire) split over the brokers of ``records`` by partition; :data:`NOT_SPREAD`
    where its queue has one partition, or its arguments are not for splitting."""
    bound = bind_arguments(method, table, *args, **kwargs)
    queue = bound.arguments.get("queue")
    if not isinstance(queue, str):
        return NOT_SPREAD
    try:
        count = table.partitioned.count(queue)
    except Exception:  # no table, a store that fails: the call itself reports it
        return NOT_SPREAD
    if count < 2:
        return NOT_SPREAD
    by_id = {record.id: record for record in records}

    def share(partition: int, scoped: bool) -> Callable[[BoundArguments], Any]:
        owner = by_id[partition_owner(queue, partition, by_id) or ""]
        at = partition if scoped else None
        return lambda part: sender.send_share(owner, method_name, method, table, part, at)

    if method_name == "publish":
        return _publish(table, queue, count, bound, share)
    if method_name == "lease":
        return _lease(table, queue, count, bound, share)
    return _by_seqs(bound, share)


Share = Callable[[int, bool], Callable[[BoundArguments], Any]]


def _copy(bound: BoundArguments, **changes: Any) -> BoundArguments:
    part = BoundArguments(bound.signature, bound.arguments.copy())
    part.arguments.update(changes)
    return part


def _publish(table: Any, queue: str, count: int, bound: BoundArguments, share: Share) -> Any:
    given = bound.arguments
    if given.get("arguments", {}).get("partitions", count) != count:
        return NOT_SPREAD  # a count to declare or refuse
    producer = given.get("producer")
    free = producer is None and given.get("sequence") is None and scoped_partition() is None
    if free and Bodies.of_values(given["rows"], 0) is not None:
        # Bodies alone, free to go to any partition: no table made of them here.
        return _whole(table, queue, count, table.partitioned.publish_turn(queue), bound, share)
    try:
        rows = as_input_table(given["rows"])
        idempotence(producer, given.get("sequence"))
    except (QueueError, TypeError, ValueError):
        return NOT_SPREAD  # the table refuses them, in one place
    if not rows.num_rows:
        return NOT_SPREAD  # nothing to route
    targets, turn = table.partitioned.targets(queue, rows, count, producer)
    if turn is not None and _keyless(rows):
        return _whole(table, queue, count, turn, bound, share)
    positions, calls = [], []
    for partition in np.unique(targets).tolist():
        at = np.flatnonzero(targets == partition)
        positions.append(at)
        calls.append(functools.partial(share(partition, True), _copy(bound, rows=rows.take(at))))
    shares = list(zip(positions, _at_once(calls), strict=True))
    table.partitioned.took_turn(queue, turn, count, targets, shares)
    return merged_outcome(queue, rows.num_rows, shares)


def _whole(
    table: Any, queue: str, count: int, turn: int, bound: BoundArguments, share: Share
) -> Any:
    """A publish of rows free to go to any partition, whole to one broker: the owner of the
    client's ``turn``'s partition, which places them by its own turn over the partitions it
    owns, as one broker does every client's. The turn then moves on by one, so each
    client's calls go to the brokers in proportion to the partitions they own. Routed here
    by partition, the calls of many small clients would spread over every partition, a
    round of a few a commit."""
    try:
        return share(turn % count, False)(bound)
    finally:
        table.partitioned.passed_on(queue, turn)


def _keyless(rows: pa.Table) -> bool:
    return "key" not in rows.column_names or rows["key"].null_count == rows.num_rows


def _lease(table: Any, queue: str, count: int, bound: BoundArguments, share: Share) -> Any:
    parameters = bound.signature.parameters
    given = {
        name: bound.arguments.get(name, parameters[name].default)
        for name in ("max_messages", "max_bytes")
    }
    if not all(value is None or (type(value) is int and value >= 0) for value in given.values()):
        return NOT_SPREAD  # the table refuses them, in one place
    turn = table.partitioned.lease_turn(queue)
    order = [(turn.start + step) % count for step in range(count)]
    asked: list[int] = []

    def lease_share(
        partition: int, messages: int | None, body_bytes: int | None
    ) -> tuple[pa.Table, int | None]:
        part = _copy(bound, max_messages=messages, max_bytes=body_bytes)
        asked.append(partition)
        rows = share(partition, True)(part)
        return rows, lease_version(rows, partition)

    leased = lease_in_turn(count, order, given["max_messages"], given["max_bytes"], lease_share)
    # Each partition's commits are its broker's alone: a lease there races nobody.
    table.partitioned.leased(queue, turn, count, filled=len(asked) == 1, raced=False)
    return leased


def _by_seqs(bound: BoundArguments, share: Share) -> Any:
    given = bound.arguments
    if given.get("seqs") is None:
        return NOT_SPREAD  # a release of every lease: the first broker releases them all
    try:
        seqs = parse_seqs("seqs", given["seqs"])
        deliveries = deliveries_of(seqs, given.get("deliveries"))
    except QueueError:
        return NOT_SPREAD  # the table refuses them, in one place
    if not len(seqs):
        return NOT_SPREAD
    owners = partition_of(seqs)
    calls = []
    for partition in np.unique(owners).tolist():
        mask = owners == partition
        changes: dict[str, Any] = {"seqs": seqs[mask].tolist()}
        if deliveries is not None:
            changes["deliveries"] = deliveries[mask].tolist()
        calls.append(functools.partial(share(partition, False), _copy(bound, **changes)))
    return sum(_at_once(calls))
