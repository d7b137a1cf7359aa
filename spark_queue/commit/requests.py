"""The queue operations of :class:`~spark_queue.table.QueueTable` as requests that a group
commit (:mod:`spark_queue.commit.group`) applies, many to one :class:`QueueTransaction`.

A request is checked in its caller's thread when it is made (arguments, rows), applied by
the group's leader thread to the round's transaction (:meth:`Request.apply`), and finished
in its caller's thread again once the commit holding it has landed (reading leased rows,
say). ``apply`` changes nothing but the transaction and objects of the request's own, so a
round that loses a request (its error is the caller's alone) or a race is planned again
from a fresh transaction. Pure planning is :mod:`spark_queue.rules`; this module only says
which plan each operation makes and what its caller gets back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar, cast

import numpy as np
import pyarrow as pa

from spark_queue.commit.enqueue import PRODUCER_APP_PREFIX, PendingBatch
from spark_queue.commit.maintenance import Compaction
from spark_queue.commit.transaction import QueueTransaction
from spark_queue.errors import InvalidInputError, RejectedMessagesError
from spark_queue.model.messages import Bodies
from spark_queue.model.policies import Policies
from spark_queue.model.queue_arguments import ConsumerLimits
from spark_queue.model.results import PublishOutcome, PublishResult
from spark_queue.rules import (
    Leases,
    QueuePlan,
    QueueState,
    plan_ack,
    plan_expire,
    plan_extend,
    plan_lease,
    plan_return,
    settles,
)
from spark_queue.storage.commit_log import CommitOperation, Operation
from spark_queue.storage.filters import filter_matcher
from spark_queue.storage.store import QueueStore, Snapshot, require_queue


@dataclass
class Round:
    """What the requests applied so far in one round (one transaction) did together."""

    transaction: QueueTransaction
    published: set[str] = field(default_factory=set)  # queues a publish of this round fed
    app_versions: dict[str, int] = field(default_factory=dict)  # idempotent publishes' ids
    operations: list[Operation] = field(default_factory=list)  # of requests that changed it

    @property
    def changed(self) -> bool:
        return bool(self.operations)


Outcome = TypeVar("Outcome")


class Request(Generic[Outcome]):
    """One caller's queue operation in a group commit, whose caller gets an ``Outcome``."""

    creates = False  # whether it creates the table where there is none
    policies: Policies | None = None  # applied by the declares it makes

    def waits(self, round: Round) -> bool:
        """Whether it must go into the next round because of what this round holds."""
        return False

    def apply(self, round: Round) -> Outcome:
        """Apply it to ``round.transaction``; what the caller gets once the commit landed."""
        raise NotImplementedError

    def forget(self, store: QueueStore) -> None:
        """Its round is planned again without what it staged (another request failed)."""

    def discard(self, store: QueueStore) -> None:
        """It failed or committed nothing: delete the files it staged itself."""


def queue_state(transaction: QueueTransaction, queue: str) -> QueueState:
    return require_queue(transaction.states, queue, transaction.store.uri)


class QueuePartitioned(Exception):
    """A publish routed to a queue of one partition found it partitioned when its commit
    was planned (another process declared or raised its partitions since this one looked):
    nothing of it was committed, and its caller routes it again."""


class PublishRequest(Request[PublishOutcome]):
    """:meth:`QueueTable.publish`: one queue's rows, maybe an idempotent (producer,
    sequence) pair. ``whole``: the rows are the whole queue's, routed as for a queue of
    one partition, which the commit checks against the queue's state."""

    creates = True

    def __init__(
        self,
        queue: str,
        batch: PendingBatch,
        arguments: dict[str, Any],
        *,
        producer: str | None,
        sequence: int | None,
        on_reject: str,
        policies: Policies | None,
        whole: bool = False,
    ) -> None:
        self.queue = queue
        self.whole = whole
        self.batch = batch
        self.arguments = arguments
        self.producer = producer
        self.sequence = sequence
        self.on_reject = on_reject
        self.policies = policies
        self.app_id = None if producer is None else f"{PRODUCER_APP_PREFIX}{producer}"

    def waits(self, round: Round) -> bool:
        # A de-duplicating queue checks ids against its window as committed: a second
        # publish to it in one round would not see the first's ids.
        state = round.transaction.states.get(self.queue)
        return (
            self.queue in round.published
            and state is not None
            and bool(state.arguments.duplicate_window)
        )

    def apply(self, round: Round) -> PublishOutcome:
        transaction = round.transaction
        rows = self.batch.num_rows
        state = transaction.states.get(self.queue)
        if self.whole and state is not None and state.arguments.partitions > 1:
            raise QueuePartitioned(self.queue)
        if self.app_id is not None:
            assert self.sequence is not None
            # This round's own publishes of the producer first; the table's only where none
            # (delta-rs scans the version's application transactions: ~0.7 ms a read).
            committed = round.app_versions.get(self.app_id)
            if committed is None:
                committed = transaction.snapshot.transaction_version(self.app_id)
            if committed is not None and committed >= self.sequence:
                if self.sequence < committed:
                    raise InvalidInputError(
                        f"sequence {self.sequence} is lower than {committed}, the last one "
                        f"committed by producer {self.producer!r}; nothing was committed"
                    )
                result = PublishResult(
                    self.queue, [], 0, 0, 0, duplicate=True, attempts=transaction.attempt
                )
                return PublishOutcome(result, np.zeros(rows, bool))
        if "message_id" in self.batch.rows.column_names and self.queue not in round.published:
            transaction.check_ids_early(self.queue, self.batch.rows["message_id"])
        self.batch.renumber_after(transaction.store, transaction)
        before = {q: dict(s.counters) for q, s in transaction.states.items()}
        rejected = transaction.enqueue(self.batch.files, self.arguments)
        if rejected and self.on_reject == "fail":
            raise RejectedMessagesError(
                f"onReject=fail: the queue's reject policy refused {rejected[self.queue]} "
                f"message(s) of queue {self.queue!r}; nothing of this batch was committed"
            )
        round.published.add(self.queue)
        round.operations.append(CommitOperation.PUBLISH.on(self.queue))
        if self.app_id is not None:
            assert self.sequence is not None
            round.app_versions[self.app_id] = self.sequence
        old = before.get(self.queue, {})
        changes = {c: n - old.get(c, 0) for c, n in transaction.states[self.queue].counters.items()}
        seqs = transaction.accepted[self.queue].to_pylist()
        accepted = np.zeros(rows, bool)
        accepted[np.asarray(seqs, np.int64) - self.batch.base] = True
        result = PublishResult(
            self.queue,
            seqs,
            rejected.get(self.queue, 0),
            changes.get("replaced", 0) + changes.get("dropped", 0),
            changes.get("dead_lettered", 0),
            duplicate=False,
            version=transaction.snapshot.version + 1,
            attempts=transaction.attempt,
            duplicates=changes.get("duplicates", 0),
        )
        return PublishOutcome(result, accepted)

    def forget(self, store: QueueStore) -> None:
        self.batch.discard(store)
        self.batch.written, self.batch.files = [], []  # numbered again when applied again

    def discard(self, store: QueueStore) -> None:
        self.batch.discard(store)


class Unmergeable(Exception):
    """A :class:`PublishRun` did something whose share per publish is not known (it
    evicted, rejected, dead-lettered or cut duplicates): plan the round publish by publish."""


def mergeable(first: Request[Any], other: Request[Any]) -> bool:
    """Whether ``other`` may join ``first``'s :class:`PublishRun`."""
    return (
        isinstance(first, PublishRequest)
        and isinstance(other, PublishRequest)
        and first.app_id is None
        and other.app_id is None
        and first.queue == other.queue
        and first.arguments == other.arguments
        and first.on_reject == other.on_reject
        and first.policies is other.policies
        and first.whole == other.whole
    )


_RESULT_FIELDS = tuple(f.name for f in fields(PublishResult))


class PublishRun(Request[list[PublishOutcome]]):
    """Publishes of one queue with the same arguments, next to each other in a round, as one
    enqueue and one message file (a round of many single-message publishes would otherwise
    write a file each, and compaction would follow). Where every message was stored and
    nothing evicted, each publish's result is its share; otherwise :class:`Unmergeable`."""

    creates = True

    def __init__(self, requests: list[PublishRequest]) -> None:
        first = requests[0]
        self.sizes = [r.batch.num_rows for r in requests]
        bodies = [r.batch.bodies for r in requests if r.batch.bodies is not None]
        if len(bodies) == len(requests):  # shaped once, for the whole run
            batch = PendingBatch(first.queue, Bodies.concat(bodies))
        else:
            # Each publish's rows are numbered from 0 (normalised): the run's, from 0 on.
            rows = pa.concat_tables([r.batch.rows for r in requests])
            seqs = pa.array(np.arange(rows.num_rows, dtype=np.int64))
            rows = rows.set_column(rows.schema.get_field_index("seq"), "seq", seqs)
            batch = PendingBatch(first.queue, rows)
        self.inner = PublishRequest(
            first.queue,
            batch,
            first.arguments,
            producer=None,
            sequence=None,
            on_reject=first.on_reject,
            policies=first.policies,
            whole=first.whole,  # a queue partitioned since its callers looked: each reroutes
        )
        self.policies = first.policies

    def waits(self, round: Round) -> bool:
        return self.inner.waits(round)

    def apply(self, round: Round) -> list[PublishOutcome]:
        try:
            outcome = self.inner.apply(round)
        except RejectedMessagesError:
            raise Unmergeable from None
        whole = outcome.result
        if (
            whole.rejected
            or whole.evicted
            or whole.dead_lettered
            or whole.duplicates
            or not outcome.accepted.all()
        ):
            raise Unmergeable
        # The same result but for the seqs, for each publish: its fields set as they are,
        # without the frozen dataclass's __init__, which sets each through
        # object.__setattr__ (~4 us a call where this takes ~0.5, 32 a round); each one's
        # rows all accepted, a read-only view of one array.
        same = {name: getattr(whole, name) for name in _RESULT_FIELDS}  # in the fields' order
        accepted = np.ones(sum(self.sizes), bool)
        accepted.flags.writeable = False
        shares, start = [], 0
        for size in self.sizes:
            result = object.__new__(PublishResult)
            result.__dict__.update(same)
            result.__dict__["seqs"] = whole.seqs[start : start + size]
            shares.append(PublishOutcome(result, accepted[start : start + size]))
            start += size
        return shares

    def forget(self, store: QueueStore) -> None:
        self.inner.forget(store)

    def discard(self, store: QueueStore) -> None:
        self.inner.discard(store)


@dataclass(frozen=True)
class LeaseOutcome:
    """A lease request's leases, and the table as its round saw it, where their rows are
    (some may be in files of the same commit); ``attempt``: the commit attempt it rode in
    (above 1, another writer won the earlier ones)."""

    leased: Leases
    view: Snapshot
    attempt: int = 1


class LeaseRequest(Request[LeaseOutcome]):
    """:meth:`QueueTable.lease`."""

    def __init__(
        self,
        queue: str,
        limits: ConsumerLimits,
        filter: str | None,
        strict_groups: bool = False,
    ) -> None:
        self.queue = queue
        self.limits = limits
        self.filter = filter
        self.strict_groups = strict_groups

    def waits(self, round: Round) -> bool:
        # A filter runs on the committed version: it would not see this round's arrivals.
        return self.filter is not None and self.queue in round.published

    def apply(self, round: Round) -> LeaseOutcome:
        transaction = round.transaction
        view = transaction.view()  # where the leased rows are (dead letters come after)
        leased, applied = apply_lease(
            transaction,
            self.queue,
            self.limits,
            filter=self.filter,
            strict_groups=self.strict_groups,
        )
        if applied:
            round.operations.append(CommitOperation.LEASE.on(self.queue, self.limits.consumer))
        return LeaseOutcome(leased, view, transaction.attempt)


def apply_lease(
    transaction: QueueTransaction,
    queue: str,
    limits: ConsumerLimits,
    *,
    filter: str | None = None,
    max_backlog: int | None = None,
    below_seq: int | None = None,
    remove: bool = False,
    strict_groups: bool = False,
    settle: bool = True,
) -> tuple[Leases, bool]:
    """The one lease step of :meth:`QueueTable.lease` and the streaming source: lease the
    head of ``queue`` to ``limits.consumer`` within ``limits`` (:func:`plan_lease`), and
    apply the plan to ``transaction`` where it changed the queue. Returns the messages
    delivered and whether the plan was applied (an idle lease changes nothing).

    ``filter``: the consumer's SQL predicate over the message columns. ``max_backlog``,
    ``below_seq``, ``remove`` (at-most-once) and ``strict_groups``: :func:`plan_lease`'s.
    ``settle``: whether a lease that delivers nothing still commits what catching up with
    the clock changed (leases that ran out, scheduled messages that fell due); without it
    only the removals it made (expired messages met at the head) are applied, and the rest
    waits for the next commit to the queue.
    """
    state = queue_state(transaction, queue)
    plan = plan_lease(
        state,
        transaction.head_reader(),
        transaction.now,
        limits,
        max_backlog=max_backlog,
        below_seq=below_seq,
        remove=remove,
        matches=None
        if filter is None
        else filter_matcher(transaction.store, transaction.snapshot, queue, filter),
        strict_groups=strict_groups,
    )
    changed = settles(state, plan.state) if settle else bool(plan.removals)
    if not len(plan.leased) and not changed:
        return plan.leased, False
    transaction.apply_plan(queue, plan)
    return plan.leased, True


Planner = Callable[[QueueTransaction, QueueState, "np.ndarray | None"], QueuePlan]


def ack_planner(consumer: str | None) -> Planner:
    # An ack and an expire always name their seqs (only a release may not).
    return lambda t, s, seqs: plan_ack(s, t.head_reader(), t.now, cast(np.ndarray, seqs), consumer)


def expire_planner(consumer: str | None) -> Planner:
    return lambda t, s, seqs: plan_expire(
        s, t.head_reader(), t.now, cast(np.ndarray, seqs), consumer
    )


def cancel_planner(consumer: str | None, delay_us: int | None) -> Planner:
    return lambda t, s, seqs: plan_return(
        s, t.head_reader(), t.now, seqs=seqs, consumer=consumer, cancel=True, delay=delay_us
    )


def release_planner(consumer: str, delay_us: int | None = 0) -> Planner:
    """Leases returned ready after ``delay_us`` (None: the queue's redelivery backoff)."""
    return lambda t, s, seqs: plan_return(
        s, t.head_reader(), t.now, seqs=seqs, consumer=consumer, delay=delay_us
    )


class ChangeRequest(Request[int]):
    """:meth:`QueueTable.ack`, ``cancel``, ``expire`` and ``release``: end leases. Returns
    how many of the leases it targets (``seqs`` of ``consumer``, any if None) it ended.
    Leases whose period ran out are returned by the same commit but not counted: their
    period ended them, not this call.

    ``queue`` None (a release only): every queue of the table, in one commit.
    ``deliveries`` (with ``seqs``): only the leases in those deliveries, ``deliveries[i]``
    for ``seqs[i]``; a message delivered again since is left alone."""

    def __init__(
        self,
        operation: CommitOperation,
        queue: str | None,
        planner: Planner,
        seqs: np.ndarray | None,
        consumer: str | None,
        deliveries: np.ndarray | None = None,
    ) -> None:
        self.operation = operation
        self.queue = queue
        self.planner = planner
        self.seqs = seqs
        self.consumer = consumer
        self.deliveries = deliveries

    def apply(self, round: Round) -> int:
        transaction = round.transaction
        names = [self.queue] if self.queue is not None else sorted(transaction.states)
        ended = 0
        for name in names:
            leases = queue_state(transaction, name).leases
            seqs = self.seqs
            if seqs is not None and self.deliveries is not None:
                seqs = leases.in_deliveries(seqs, self.deliveries)
            targeted = int(
                (leases.held(seqs, self.consumer) & (leases.until > transaction.now)).sum()
            )
            before = transaction.states[name]
            plan = self.planner(transaction, before, seqs)
            if not settles(before, plan.state) and before.consumers == plan.state.consumers:
                continue  # nothing held, nothing ran out: no commit for it
            transaction.apply_plan(name, plan)
            round.operations.append(self.operation.on(name))
            ended += targeted - int(plan.state.leases.held(seqs, self.consumer).sum())
        return ended


class ExtendRequest(Request[int]):
    """:meth:`QueueTable.extend`."""

    def __init__(
        self,
        queue: str,
        seqs: np.ndarray,
        consumer: str,
        period_us: int,
        deliveries: np.ndarray | None = None,
    ) -> None:
        self.queue = queue
        self.seqs = seqs
        self.consumer = consumer
        self.period_us = period_us
        self.deliveries = deliveries  # as for ChangeRequest

    def apply(self, round: Round) -> int:
        transaction = round.transaction
        state = queue_state(transaction, self.queue)
        seqs = self.seqs
        if self.deliveries is not None:
            seqs = state.leases.in_deliveries(seqs, self.deliveries)
        plan, extended = plan_extend(
            state, transaction.head_reader(), transaction.now, seqs, self.consumer,
            self.period_us,
        )  # fmt: skip
        if not extended and not settles(state, plan.state):
            return 0  # nothing to commit
        transaction.apply_plan(self.queue, plan)
        round.operations.append(CommitOperation.EXTEND.on(self.queue, self.consumer))
        return extended


class CompactRequest(Request[bool]):
    """A compaction the group's upkeep planned and stored
    (:func:`~spark_queue.commit.maintenance.plan_compaction`), made part of a round's
    commit: the leader, this process's one writer of the table, then never races it. Its
    caller gets whether the commit holds it (not where a file it removes is gone by then:
    its caller deletes its files)."""

    def __init__(self, compaction: Compaction) -> None:
        self.compaction = compaction

    def apply(self, round: Round) -> bool:
        planned = self.compaction
        taken = round.transaction.replace_files(planned.adds, planned.removes, planned.details)
        if taken:
            round.operations.append(CommitOperation.COMPACT.on())
        return taken

    def discard(self, store: QueueStore) -> None:
        self.compaction.discard(store.location)
