"""Leases (SEMANTICS §3): which messages a consumer is given (``plan_lease``), and what
acknowledging, returning (cancel, release) and expiring them does to the queue.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.model.queue_arguments import ConsumerLimits
from spark_queue.rules.change import (
    HeadReader,
    QueueChange,
    QueuePlan,
    Removal,
)
from spark_queue.rules.columns import (
    LEASE_INTS,
    NEVER,
    Leases,
    ascending,
    distinct,
    later,
    member,
)
from spark_queue.rules.state import QueueState


def plan_lease(
    state: QueueState,
    reader: HeadReader,
    now: int,
    limits: ConsumerLimits,
    *,
    max_backlog: int | None = None,
    below_seq: int | None = None,
    remove: bool = False,
    matches: Callable[[np.ndarray], np.ndarray] | None = None,
    strict_groups: bool = False,
) -> QueuePlan:
    """Deliver head messages to ``limits.consumer`` (SEMANTICS §3): lease them, or with
    ``remove`` (at-most-once) take them out at once, counted as ``acked``.

    Bounds: the consumer's ``limits`` for this call (``max_messages`` and ``max_bytes``: at
    least one message is always taken, as Delta's ``maxBytesPerTrigger`` admits one file;
    ``lease_period_us``: how long a lease lasts; its delivery and cancel limits, 0 for
    none), ``max_backlog`` for the leases of all consumers, ``below_seq`` for what existed
    when an AvailableNow query started. Expired messages met on the way are removed
    (``expired``), never delivered. Due scheduled messages and expired leases are settled
    first.
    ``matches`` (a consumer's filter) says which of some seqs this consumer may take; the
    others stay, in place, for other consumers. ``strict_groups``: a message group with a
    message leased is passed over by this consumer too (SQS FIFO queues: a group's next
    message is delivered once the one in flight is deleted or visible again).
    """
    consumer = limits.consumer
    queue = QueueChange(state.copy(), reader, now)
    queue.catch_up()
    state = queue.state
    if state.arguments.exclusive and exclusive_holder(state, now) not in (None, consumer):
        return queue.plan(np.zeros(0, bool), np.zeros(0, bool))  # another holds the queue
    groups = (
        _GroupGate(state, reader, None if strict_groups else consumer)
        if state.arguments.message_groups
        else None
    )
    max_bytes = limits.max_bytes
    mine = state.consumers.setdefault(consumer, {"last_lease": 0})
    mine.update(max_deliveries=limits.max_deliveries, max_cancels=limits.max_cancels)
    mine["last_lease"] += 1
    lease_id = mine["last_lease"]
    until = NEVER if limits.lease_period_us is None else later(now, limits.lease_period_us)
    budget = limits.max_messages if limits.max_messages is not None else NEVER
    if max_backlog is not None:
        budget = min(budget, max(0, max_backlog - len(state.leases)))
    bytes_left = max_bytes if max_bytes is not None else NEVER
    leased: list[Leases] = []
    for priority in sorted(state.levels, reverse=True):
        level = state.levels[priority]
        cursor = queue.cursor(priority) if level.ready else None
        index = 0  # chunks before it hold only messages this consumer's filter refused
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # seqs, sizes, expiries
        part_keys: list[pa.Array] = []  # their groups, in a queue with message groups
        while cursor is not None and budget > 0 and level.ready > 0:
            chunk = cursor.chunk_at(index)
            if chunk is None:
                break
            seqs, sizes, expires = chunk
            window = len(seqs) if below_seq is None else int(np.searchsorted(seqs, below_seq))
            if window == 0:
                break
            expired = expires[:window] <= now
            wanted = ~expired
            if matches is not None:
                wanted &= matches(seqs[:window])
            keys = None
            if groups is not None:
                keys = groups.keys(seqs[:window])
                wanted &= groups.free(keys)
            picks = np.flatnonzero(wanted)[:budget]
            full = False
            if max_bytes is not None and len(picks):
                fit = int(np.searchsorted(np.cumsum(sizes[picks]), bytes_left, side="right"))
                fit = fit if (leased or parts or fit) else 1  # at least one message per batch
                full = fit < len(picks) or fit == 0
                picks = picks[:fit]
            picked = np.zeros(window, dtype=bool)
            picked[picks] = True
            taken = np.flatnonzero(expired | picked)
            seqs, sizes, expires = cursor.take_at(index, taken)
            level.ready -= len(taken)
            level.ready_bytes -= int(sizes.sum())
            chosen = picked[taken]
            if keys is not None:
                part_keys.append(keys.take(pa.array(taken[chosen])))
            if not chosen.all():  # expired: never delivered
                queue.kill_many(priority, seqs[~chosen], "expired", "expired")
                seqs, sizes, expires = seqs[chosen], sizes[chosen], expires[chosen]
            if len(seqs):
                parts.append((seqs, sizes, expires))
                budget -= len(seqs)
                bytes_left -= int(sizes.sum())
            if full:
                budget = 0
            elif len(taken) < window:
                index += 1  # what is left of this chunk is not for this consumer
            if window < len(chunk[0]):
                break  # reached what arrived after an AvailableNow query started
        if parts:  # one lease array per level: joining chunk by chunk copies quadratically
            level_seqs, level_sizes, level_expires = (
                np.concatenate(column) for column in zip(*parts, strict=True)
            )
            leased.append(
                _new_leases(
                    state,
                    level_seqs,
                    level_sizes,
                    level_expires,
                    priority,
                    consumer,
                    lease_id,
                    until,
                    pa.concat_arrays(part_keys) if groups is not None else None,
                )
            )
        if budget <= 0:
            break
    delivered = Leases.concat(leased)
    if state.arguments.exclusive and len(delivered):
        # This consumer holds the queue until its last lease runs out, or it releases.
        for entry in state.consumers.values():
            entry.pop(HOLDS_UNTIL, None)
        mine[HOLDS_UNTIL] = until
    if remove:
        state.counters["acked"] += len(delivered)
        if len(delivered):
            queue.removals.append(Removal(delivered.seq, "acked", None))
            queue.note_gone(delivered)
    else:
        state.leases = Leases.concat([state.leases, delivered])
    return queue.plan(np.zeros(0, bool), np.zeros(0, bool), delivered)


class _GroupGate:
    """Which message groups a consumer may lease from (SEMANTICS §3 "Message groups"): not
    those another consumer holds a lease of, nor those with a returned message waiting out
    its redelivery delay (its group waits with it, so the group keeps its order)."""

    def __init__(self, state: QueueState, reader: HeadReader, consumer: str | None) -> None:
        """``consumer`` None: every lease blocks its group, the leasing consumer's too."""
        self._reader, self._queue = reader, state.name
        others = (
            state.leases
            if consumer is None
            else state.leases.take(~state.leases.held(consumer=consumer))
        )
        blocked = [others.keys] if others.keys is not None else []
        waiting = state.scheduled.seq[member(state.scheduled.seq, state.redelivered.seq)]
        if len(waiting):
            blocked.append(reader.keys(state.name, waiting))
        self._blocked = (
            pc.unique(pa.concat_arrays(blocked).drop_null())
            if blocked
            else pa.array([], pa.string())
        )

    def keys(self, seqs: np.ndarray) -> pa.Array:
        return self._reader.keys(self._queue, seqs)

    def free(self, keys: pa.Array) -> np.ndarray:
        """Per message: whether its group is free for this consumer (no key: always)."""
        if not len(self._blocked):
            return np.ones(len(keys), dtype=bool)
        held = pc.is_in(keys, value_set=self._blocked)
        free: np.ndarray = ~held.to_numpy(zero_copy_only=False)
        return free


def _new_leases(
    state: QueueState,
    seqs: np.ndarray,
    sizes: np.ndarray,
    expires: np.ndarray,
    priority: int,
    consumer: str,
    lease_id: int,
    until: int,
    keys: pa.Array | None,
) -> Leases:
    """Leases of messages just taken from one level's head; a message delivered before
    carries its delivery and cancel counts on (and leaves ``redelivered``)."""
    count = len(seqs)
    deliveries = np.ones(count, dtype=np.int64)
    cancels = np.zeros(count, dtype=np.int64)
    known, before, cancelled = state.redelivered.find(seqs)
    if known.any():
        deliveries[known] += before
        cancels[known] = cancelled
        state.redelivered = state.redelivered.without(seqs[known])
    return Leases.of_consumer(
        consumer,
        keys,
        seq=seqs,
        priority=np.full(count, priority),
        size=sizes,
        lease_id=np.full(count, lease_id),
        until=np.full(count, until),
        deliveries=deliveries,
        cancels=cancels,
        expires=expires,
    )


def plan_ack(
    state: QueueState, reader: HeadReader, now: int, seqs: np.ndarray, consumer: str | None = None
) -> QueuePlan:
    """Acknowledge leased messages (of ``consumer``, if given); other seqs are ignored, so an
    ack that arrives after the lease ran out and the message went elsewhere does nothing."""
    queue = QueueChange(state.copy(), reader, now)
    queue.catch_up()
    state = queue.state
    done = state.leases.held(np.asarray(seqs, dtype=np.int64), consumer)
    if done.any():
        acked = state.leases.take(done)
        state.leases = state.leases.take(~done)
        state.counters["acked"] += len(acked)
        queue.removals.append(Removal(ascending(acked.seq), "acked", None))
        queue.note_gone(acked)  # behind a head held back by a filter, an ack leaves a hole
    return queue.plan(np.zeros(0, bool), np.zeros(0, bool))


def plan_extend(
    state: QueueState,
    reader: HeadReader,
    now: int,
    seqs: np.ndarray,
    consumer: str,
    period: int,
) -> tuple[QueuePlan, int]:
    """Extend ``consumer``'s leases of ``seqs``: each now runs out ``period`` microseconds
    from ``now`` (JetStream ``AckProgress``, SQS ``ChangeMessageVisibility``). A lease that
    has already run out is returned first, as at any commit, and is not extended: the
    message may be another consumer's by now. Returns the plan and how many were extended."""
    queue = QueueChange(state.copy(), reader, now)
    queue.catch_up()
    leases = queue.state.leases
    extended = leases.held(np.asarray(seqs, dtype=np.int64), consumer)
    if extended.any():  # a new Leases: the state before this plan shares the old one
        until = leases.until.copy()
        until[extended] = later(now, period)
        queue.state.leases = Leases(
            leases.names,
            leases.consumer_ids,
            leases.keys,
            **{name: until if name == "until" else getattr(leases, name) for name in LEASE_INTS},
        )
    return queue.plan(np.zeros(0, bool), np.zeros(0, bool)), int(extended.sum())


def _leases_of(state: QueueState, seqs: np.ndarray | None, consumer: str | None) -> Leases:
    wanted = None if seqs is None else np.asarray(seqs, dtype=np.int64)
    return state.leases.take(state.leases.held(wanted, consumer))


HOLDS_UNTIL = "holds_until"  # in a consumer's state entry: its hold of an exclusive queue


def exclusive_holder(state: QueueState, now: int) -> str | None:
    """The consumer holding an exclusive queue now: the last one that leased there, until it
    releases or its last lease period runs out (never, for leases without one)."""
    for name, entry in state.consumers.items():
        if entry.get(HOLDS_UNTIL, 0) > now:
            return name
    return None


def plan_return(
    state: QueueState,
    reader: HeadReader,
    now: int,
    *,
    seqs: np.ndarray | None = None,
    consumer: str | None = None,
    cancel: bool = False,
    delay: int | None = None,
) -> QueuePlan:
    """Return leased messages: ``cancel`` (counts toward ``maxCancels``), or a release
    of everything ``consumer`` holds, as a closed Artemis consumer does. They are ready
    again after ``delay`` microseconds (a nack with a delay: JetStream ``NakWithDelay``);
    None applies the queue's redelivery backoff."""
    queue = QueueChange(state.copy(), reader, now)
    queue.catch_up(_leases_of(queue.state, seqs, consumer), cancel=cancel, delay=delay)
    if seqs is None and consumer is not None:  # a release ends its hold of an exclusive queue
        queue.state.consumers.get(consumer, {}).pop(HOLDS_UNTIL, None)
    return queue.plan(np.zeros(0, bool), np.zeros(0, bool))


def plan_expire(
    state: QueueState, reader: HeadReader, now: int, seqs: np.ndarray, consumer: str | None = None
) -> QueuePlan:
    """Remove leased messages now with reason ``expired`` (AMPS ``expire``)."""
    queue = QueueChange(state.copy(), reader, now)
    queue.catch_up()
    ending = _leases_of(queue.state, seqs, consumer)
    queue.state.leases = queue.state.leases.take(~member(queue.state.leases.seq, ending.seq))
    for priority in distinct(ending.priority):
        queue.kill_many(priority, ending.seq[ending.priority == priority], "expired", "expired")
    return queue.plan(np.zeros(0, bool), np.zeros(0, bool))
