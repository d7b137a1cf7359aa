"""Limits and overflow (SEMANTICS §2): what an enqueue does to a queue when its limits are
reached (``drop-head``, ``ring``, ``reject-publish``, ``reject-publish-dlx``), and the trim
after a limit is lowered.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from spark_queue.model.queue_arguments import REJECT_POLICIES
from spark_queue.rules.change import (
    HeadReader,
    QueueChange,
    QueuePlan,
)
from spark_queue.rules.columns import (
    NEVER,
    NO_TIME,
    MessageIndex,
    distinct,
)
from spark_queue.rules.state import Level, QueueState, ring_room


def plan_enqueue(state: QueueState, incoming: pa.Table, reader: HeadReader, now: int) -> QueuePlan:
    """Apply one commit's incoming messages to a queue; the input state is left unchanged.

    ``incoming`` holds ``seq``, ``size``, ``priority`` and ``deliver_at`` (microseconds or
    null) in arrival order, and optionally ``enqueued_at``/``expires_at`` (for when a
    scheduled message expires). Scheduled messages that fell due before the batch are promoted
    first.
    """
    queue = QueueChange(state.copy(), reader, now)
    state, args = queue.state, queue.state.arguments
    queue.catch_up()

    n = incoming.num_rows
    seqs = incoming.column("seq").to_numpy(zero_copy_only=False).astype(np.int64)
    sizes = incoming.column("size").to_numpy(zero_copy_only=False).astype(np.int64)
    priorities = incoming.column("priority").fill_null(0).to_numpy(zero_copy_only=False)
    deliver = incoming.column("deliver_at").fill_null(NO_TIME).to_numpy(zero_copy_only=False)
    accepted = np.ones(n, dtype=bool)
    rejected_to_dlq = np.zeros(n, dtype=bool)
    if n:
        state.next_seq = max(state.next_seq, int(seqs.max()) + 1)

    waiting = deliver > now
    if waiting.any() and "expires_at" in incoming.column_names:
        expiry = state.expiry(
            incoming.column("enqueued_at").fill_null(NO_TIME).to_numpy(zero_copy_only=False),
            incoming.column("expires_at").fill_null(NO_TIME).to_numpy(zero_copy_only=False),
        )
    else:
        expiry = np.full(n, NEVER, dtype=np.int64)
    if waiting.any():
        arriving = MessageIndex(
            seq=seqs[waiting],
            priority=priorities[waiting],
            size=sizes[waiting],
            deliver_at=deliver[waiting],
            expires=expiry[waiting],
        )
        state.scheduled = MessageIndex.concat([state.scheduled, arriving])
        for priority in distinct(arriving.priority):
            if priority not in state.levels:  # a new level starts at its first message
                first = arriving.seq[np.flatnonzero(arriving.priority == priority)[0]]
                state.levels[priority] = Level(head=int(first))
    state.counters["added"] += int(waiting.sum())

    ready = np.flatnonzero(~waiting)
    if not len(ready):
        return queue.plan(accepted, rejected_to_dlq)
    if args.overflow in REJECT_POLICIES:
        _pre_check(queue, seqs, sizes, priorities, ready, accepted, rejected_to_dlq)
        return queue.plan(accepted, rejected_to_dlq)

    # Runs of equal priority join together; between runs the limits are applied, which is
    # the per-message rule because a run only ever evicts from the head.
    run_starts = np.flatnonzero(np.diff(priorities[ready], prepend=np.nan) != 0)
    run_ends = [*run_starts[1:].tolist(), len(ready)]
    dead_letter = args.overflow == "drop-head" and args.dead_letter_queue is not None
    for start, end in zip(run_starts.tolist(), run_ends, strict=True):
        index = ready[start:end]
        priority = int(priorities[index[0]])
        if args.overflow == "ring":
            _ring_append(queue, priority, seqs[index], sizes[index])
        else:
            if not _single_level_after(queue, priority):
                for i in index.tolist():  # mixed priorities: message by message
                    queue.join(priority, seqs[i : i + 1], sizes[i : i + 1])
                    queue.trim("dropped", dead_letter)
                continue
            queue.join(priority, seqs[index], sizes[index])
            queue.trim("dropped", dead_letter)
    return queue.plan(accepted, rejected_to_dlq)


def _single_level_after(queue: QueueChange, priority: int) -> bool:
    """No ready message outranks ``priority``: evictions come from this level's head, so a
    whole run can join before trimming (the outcome equals trimming after each message)."""
    return all(p <= priority or lv.ready == 0 for p, lv in queue.state.levels.items())


def _ring_append(queue: QueueChange, priority: int, seqs: np.ndarray, sizes: np.ndarray) -> None:
    """ring: each appended message evicts at most one head message (Artemis ring-size)."""
    room = ring_room(queue.state)
    if room is None:
        queue.join(priority, seqs, sizes)
        return
    fits = min(len(seqs), room)
    if fits:
        queue.join(priority, seqs[:fits], sizes[:fits])
    rest = len(seqs) - fits
    if not rest:
        return
    if _single_level_after(queue, priority):
        # Evicting one head per append equals appending all, then evicting as many.
        queue.join(priority, seqs[fits:], sizes[fits:])
        queue.evict(rest, "replaced", False)
        return
    for i in range(fits, len(seqs)):
        queue.join(priority, seqs[i : i + 1], sizes[i : i + 1])
        queue.evict(1, "replaced", False)


def _pre_check(
    queue: QueueChange,
    seqs: np.ndarray,
    sizes: np.ndarray,
    priorities: np.ndarray,
    ready: np.ndarray,
    accepted: np.ndarray,
    rejected_to_dlq: np.ndarray,
) -> None:
    """reject-publish(-dlx): an exact check per message, in arrival order (§2)."""
    state, args = queue.state, queue.state.arguments
    count_cap = None if args.max_length is None else args.max_length * args.reject_threshold
    bytes_cap = (
        None if args.max_length_bytes is None else args.max_length_bytes * args.reject_threshold
    )
    count, total = state.ready, state.ready_bytes
    for i in ready.tolist():
        size = int(sizes[i])
        if (count_cap is None or count + 1 <= count_cap) and (
            bytes_cap is None or total + size <= bytes_cap
        ):
            count += 1
            total += size
        else:
            accepted[i] = False
    to_dlq = args.overflow == "reject-publish-dlx" and args.dead_letter_queue is not None
    rejected = ready[~accepted[ready]]
    rejected_to_dlq[rejected] = to_dlq
    state.counters["rejected"] += len(rejected)
    if to_dlq:
        state.counters["dead_lettered"] += len(rejected)
    kept = ready[accepted[ready]]
    if len(kept):
        run_starts = np.flatnonzero(np.diff(priorities[kept], prepend=np.nan) != 0)
        for start, end in zip(
            run_starts.tolist(), [*run_starts[1:].tolist(), len(kept)], strict=True
        ):
            index = kept[start:end]
            queue.join(int(priorities[index[0]]), seqs[index], sizes[index])


def plan_settle(state: QueueState, reader: HeadReader, now: int) -> QueuePlan:
    """Apply a queue's rules with nothing arriving: promote due scheduled messages and, under
    drop-head, trim to the limits at once (after ``alter`` lowered one). ring and the reject
    policies remove nothing here (§2 "changing limits")."""
    queue = QueueChange(state.copy(), reader, now)
    queue.catch_up()
    empty = np.zeros(0, dtype=bool)
    return queue.plan(empty, empty)
