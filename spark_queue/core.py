"""The pure core: queue limits and overflow (SEMANTICS §2) as plain functions.

Nothing here touches Spark or Delta. A queue is a :class:`QueueState` (arguments, counters,
per-priority *levels*, the index of scheduled messages); the messages already stored are
reached through a :class:`HeadReader`, which yields one level's rows in ``seq`` order from a
position, so the caller decides how they are fetched (Delta file statistics in the store, a
list in the tests). Only the head of a queue is read, and only as far as evictions need: the
cost of an enqueue does not grow with the queue's depth.

Head order is ``priority`` descending, then ``seq`` ascending. Every level keeps ``head``, a
position at or below its first ready message. A queue's live messages are:

- its rows at or after their level's ``head`` that are not in ``holes`` (removed out of order);
- ``extras``: messages below their level's head that became ready again (a scheduled message
  that fell due joins at its seq position, SEMANTICS §2);
- ``scheduled``: the index of messages whose ``deliver_at`` is in the future. A head may pass
  them: they are found through the index, and counted once they are due.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa

from spark_queue.options import REJECT_POLICIES, QueueArguments

COUNTERS = (
    "added",
    "acked",
    "replaced",
    "dropped",
    "rejected",
    "expired",
    "killed",
    "dead_lettered",
    "purged",
)
# Outcomes that end a message's life in its queue; `rejected` is not one (never added).
TERMINAL = ("acked", "replaced", "dropped", "expired", "killed", "purged")
# What a HeadReader yields; deliver_at is microseconds since the epoch, or null.
HEAD_SCHEMA = pa.schema([("seq", pa.int64()), ("size", pa.int64()), ("deliver_at", pa.int64())])
NO_TIME = np.iinfo(np.int64).min
_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class Level:
    """The messages of one priority in one queue."""

    head: int = 0  # no live message of this level has a smaller seq
    ready: int = 0
    ready_bytes: int = 0


@dataclass(frozen=True)
class Scheduled:
    """A message that was not due at the last commit: it counts once it is due."""

    seq: int
    priority: int
    size: int
    deliver_at: int  # microseconds since the epoch


@dataclass
class QueueState:
    """Everything a commit needs to know about a queue without reading its messages."""

    name: str
    arguments: QueueArguments = field(default_factory=QueueArguments)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    levels: dict[int, Level] = field(default_factory=dict)
    holes: set[int] = field(default_factory=set)
    extras: list[Scheduled] = field(default_factory=list)  # ready, below their level's head
    scheduled: list[Scheduled] = field(default_factory=list)
    next_seq: int = 0  # above every seq this queue has used

    @property
    def ready(self) -> int:
        return sum(level.ready for level in self.levels.values())

    @property
    def ready_bytes(self) -> int:
        return sum(level.ready_bytes for level in self.levels.values())

    def to_json(self) -> str:
        """The state without the scheduled index, which is stored as rows of its own."""
        return json.dumps(
            {
                "arguments": json.loads(self.arguments.to_json()),
                "counters": self.counters,
                "levels": {
                    str(p): [v.head, v.ready, v.ready_bytes] for p, v in self.levels.items()
                },
                "holes": sorted(self.holes),
                "extras": [[e.seq, e.priority, e.size, e.deliver_at] for e in self.extras],
                "next_seq": self.next_seq,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, name: str, text: str, scheduled: list[Scheduled]) -> QueueState:
        data = json.loads(text)
        counters = dict.fromkeys(COUNTERS, 0)
        counters.update(data["counters"])
        return cls(
            name=name,
            arguments=QueueArguments(**data["arguments"]),
            counters=counters,
            levels={int(p): Level(*values) for p, values in data["levels"].items()},
            holes=set(data["holes"]),
            extras=[Scheduled(*values) for values in data.get("extras", [])],
            scheduled=sorted(scheduled, key=lambda s: s.seq),
            next_seq=data["next_seq"],
        )

    def copy(self) -> QueueState:
        return QueueState.from_json(self.name, self.to_json(), list(self.scheduled))


class HeadReader(Protocol):
    """Reads a queue's stored rows of one priority, ``seq`` ascending, from a position."""

    def read(self, queue: str, priority: int, from_seq: int) -> Iterator[pa.Table]:
        """Yield tables of :data:`HEAD_SCHEMA` rows with ``seq >= from_seq``, in order."""
        ...


@dataclass(frozen=True)
class Removal:
    """Messages of one queue removed together, with one outcome."""

    seqs: np.ndarray
    outcome: str  # one of TERMINAL
    dead_letter: bool  # copy them to the dead-letter queue, reason `maxlen`


@dataclass
class EnqueuePlan:
    """What one commit does to one queue."""

    state: QueueState  # the queue after the commit
    accepted: np.ndarray  # bool per incoming message; False = rejected, not stored
    rejected_to_dlq: np.ndarray  # bool per incoming message: rejected and dead-lettered
    removals: list[Removal]  # stored or incoming messages this commit removes

    def removed_seqs(self, outcome: str | None = None) -> np.ndarray:
        parts = [r.seqs for r in self.removals if outcome in (None, r.outcome)]
        return np.concatenate(parts) if parts else _EMPTY

    def dead_letter_seqs(self) -> np.ndarray:
        parts = [r.seqs for r in self.removals if r.dead_letter]
        return np.concatenate(parts) if parts else _EMPTY


class _LevelCursor:
    """Walks one level's ready messages in head order: stored ones, then this batch's."""

    def __init__(self, reader: HeadReader, state: QueueState, priority: int, now: int) -> None:
        self._batches = reader.read(state.name, priority, state.levels[priority].head)
        self._holes = np.fromiter(state.holes, dtype=np.int64, count=len(state.holes))
        self._now = now
        self._stored: list[tuple[np.ndarray, np.ndarray]] = []  # (seqs, sizes) chunks
        extras = sorted((e for e in state.extras if e.priority == priority), key=lambda e: e.seq)
        if extras:  # below the head, so ahead of every stored row
            self._stored.append(
                (
                    np.array([e.seq for e in extras], dtype=np.int64),
                    np.array([e.size for e in extras], dtype=np.int64),
                )
            )
        self._stored_done = False
        self._incoming: list[tuple[np.ndarray, np.ndarray]] = []

    def append(self, seqs: np.ndarray, sizes: np.ndarray) -> None:
        self._incoming.append((seqs, sizes))

    def _read_more(self) -> bool:
        """Buffer the next stored chunk that has ready rows; False once none are left."""
        while not self._stored_done:
            batch = next(self._batches, None)
            if batch is None:
                self._stored_done = True
                break
            seqs = batch.column("seq").to_numpy(zero_copy_only=False).astype(np.int64)
            sizes = batch.column("size").to_numpy(zero_copy_only=False).astype(np.int64)
            due = batch.column("deliver_at").fill_null(NO_TIME).to_numpy(zero_copy_only=False)
            live = ~np.isin(seqs, self._holes) if len(self._holes) else np.ones(len(seqs), bool)
            ready = live & (due <= self._now)  # later ones are scheduled: in the index
            if ready.any():
                self._stored.append((seqs[ready], sizes[ready]))
                return True
        return False

    def _chunk(self, index: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The ``index``-th buffered chunk in head order: stored rows first, then arrivals."""
        while len(self._stored) <= index and self._read_more():
            pass
        if index < len(self._stored):
            return self._stored[index]
        index -= len(self._stored)
        return self._incoming[index] if index < len(self._incoming) else None

    def _source(self) -> list[tuple[np.ndarray, np.ndarray]] | None:
        if self._stored or self._read_more():
            return self._stored
        return self._incoming if self._incoming else None

    def pop(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Take up to ``count`` messages from the head."""
        taken_seqs, taken_sizes = [], []
        while count > 0:
            source = self._source()
            if source is None:
                break
            seqs, sizes = source[0]
            take = min(count, len(seqs))
            taken_seqs.append(seqs[:take])
            taken_sizes.append(sizes[:take])
            if take == len(seqs):
                source.pop(0)
            else:
                source[0] = (seqs[take:], sizes[take:])
            count -= take
        if not taken_seqs:
            return _EMPTY, _EMPTY
        return np.concatenate(taken_seqs), np.concatenate(taken_sizes)

    def count_for_bytes(self, excess: int, limit: int) -> int:
        """How many head messages (at most ``limit``) hold at least ``excess`` bytes."""
        counted, total, index = 0, 0, 0
        while total < excess and counted < limit:
            chunk = self._chunk(index)
            if chunk is None:
                break
            cumulative = np.cumsum(chunk[1])
            reach = int(np.searchsorted(cumulative, excess - total))  # first prefix that does
            if reach < len(cumulative):
                return min(limit, counted + reach + 1)
            counted += len(cumulative)
            total += int(cumulative[-1]) if len(cumulative) else 0
            index += 1
        return min(limit, counted)

    def first_ready(self) -> int | None:
        """The smallest seq still ready in this level after this commit's evictions."""
        source = self._source()
        return int(source[0][0][0]) if source is not None else None


class _Queue:
    """One commit's work on one queue: levels, their cursors, and what gets removed."""

    def __init__(self, state: QueueState, reader: HeadReader, now: int) -> None:
        self.state = state
        self.reader = reader
        self.now = now
        self.cursors: dict[int, _LevelCursor] = {}
        self.removals: list[Removal] = []
        self.evicted: list[tuple[int, np.ndarray]] = []  # (priority, seqs) removed

    def cursor(self, priority: int) -> _LevelCursor:
        if priority not in self.cursors:
            self.cursors[priority] = _LevelCursor(self.reader, self.state, priority, self.now)
        return self.cursors[priority]

    def over_limit(self) -> bool:
        args = self.state.arguments
        if args.max_length is not None and self.state.ready > args.max_length:
            return True
        return args.max_length_bytes is not None and self.state.ready_bytes > args.max_length_bytes

    def _remove(
        self, priority: int, seqs: np.ndarray, sizes: np.ndarray, outcome: str, dead_letter: bool
    ) -> None:
        level = self.state.levels[priority]
        level.ready -= len(seqs)
        level.ready_bytes -= int(sizes.sum())
        self.state.counters[outcome] += len(seqs)
        if dead_letter:
            self.state.counters["dead_lettered"] += len(seqs)
        self.removals.append(Removal(seqs, outcome, dead_letter))
        self.evicted.append((priority, seqs))

    def evict(self, count: int, outcome: str, dead_letter: bool) -> int:
        """Remove ``count`` messages from the head, highest priority first."""
        removed = 0
        for priority in sorted(self.state.levels, reverse=True):
            level = self.state.levels[priority]
            while removed < count and level.ready > 0:
                seqs, sizes = self.cursor(priority).pop(min(count - removed, level.ready))
                if not len(seqs):
                    raise AssertionError(
                        f"queue {self.state.name!r} priority {priority}: {level.ready} ready "
                        "messages counted but none stored"
                    )
                self._remove(priority, seqs, sizes, outcome, dead_letter)
                removed += len(seqs)
        return removed

    def trim(self, outcome: str, dead_letter: bool) -> None:
        """drop-head: remove from the head until the queue is within both limits."""
        args = self.state.arguments
        if args.max_length is not None and self.state.ready > args.max_length:
            self.evict(self.state.ready - args.max_length, outcome, dead_letter)
        while args.max_length_bytes is not None and self.state.ready_bytes > args.max_length_bytes:
            priority = max(p for p, lv in self.state.levels.items() if lv.ready > 0)
            level = self.state.levels[priority]
            excess = self.state.ready_bytes - args.max_length_bytes
            count = self.cursor(priority).count_for_bytes(excess, level.ready)
            self.evict(max(1, count), outcome, dead_letter)

    def join(self, priority: int, seqs: np.ndarray, sizes: np.ndarray) -> None:
        """Newly enqueued ready messages take their place at the tail of their level."""
        level = self.state.levels.setdefault(priority, Level(head=int(seqs[0])))
        # Between seqs[0] and a higher head lie only this batch's messages: all live.
        level.head = min(level.head, int(seqs[0]))
        self.cursor(priority).append(seqs, sizes)
        level.ready += len(seqs)
        level.ready_bytes += int(sizes.sum())
        self.state.counters["added"] += len(seqs)

    def settle(self) -> None:
        """Move each level's ``head`` past what was removed from its front; what was removed
        behind a head becomes a hole, and holes below every head are forgotten."""
        state = self.state
        highest: dict[int, int] = {}
        for priority, seqs in self.evicted:
            highest[priority] = max(highest.get(priority, -1), int(seqs.max()))
        for priority, cursor in self.cursors.items():
            level = state.levels[priority]
            first = cursor.first_ready()
            if first is not None:
                level.head = max(level.head, first)
            elif priority in highest:
                level.head = max(level.head, highest[priority] + 1)
        for level in state.levels.values():
            if level.ready == 0:
                level.head = max(level.head, state.next_seq)
        removed = set()
        for priority, seqs in self.evicted:
            removed.update(seqs.tolist())
            state.holes.update(seqs[seqs >= state.levels[priority].head].tolist())
        state.extras = [
            e
            for e in state.extras
            if e.seq not in removed and e.seq < state.levels[e.priority].head
        ]
        floor = min((lv.head for lv in state.levels.values()), default=state.next_seq)
        state.holes = {h for h in state.holes if h >= floor}

    def plan(self, accepted: np.ndarray, rejected_to_dlq: np.ndarray) -> EnqueuePlan:
        self.settle()
        return EnqueuePlan(self.state, accepted, rejected_to_dlq, self.removals)


def _promote_due(queue: _Queue) -> None:
    """Scheduled messages that are due join at their seq position (§2), in due order.

    All are counted first and the queue trimmed once after: drop-head keeps the same
    messages either way, and no cursor reads before every promoted message is in place.
    """
    state, args = queue.state, queue.state.arguments
    due = sorted(
        (s for s in state.scheduled if s.deliver_at <= queue.now),
        key=lambda s: (s.deliver_at, s.seq),
    )
    if not due:
        return
    state.scheduled = [s for s in state.scheduled if s.deliver_at > queue.now]
    for message in due:
        level = state.levels.setdefault(message.priority, Level(head=message.seq))
        ring = args.overflow == "ring" and args.max_length is not None
        if ring and state.ready + 1 > args.max_length:
            # Artemis: a due message that does not fit the ring is removed itself.
            state.counters["replaced"] += 1
            queue.removals.append(Removal(np.array([message.seq]), "replaced", False))
            queue.evicted.append((message.priority, np.array([message.seq])))
            if message.seq >= level.head:
                state.holes.add(message.seq)  # before any cursor reads past it
            continue
        level.ready += 1
        level.ready_bytes += message.size
        if message.seq < level.head:
            state.extras.append(message)
    if args.overflow == "drop-head":
        queue.trim("dropped", args.dead_letter_queue is not None)


def plan_enqueue(
    state: QueueState, incoming: pa.Table, reader: HeadReader, now: int
) -> EnqueuePlan:
    """Apply one commit's incoming messages to a queue; the input state is left unchanged.

    ``incoming`` holds ``seq``, ``size``, ``priority`` and ``deliver_at`` (microseconds or
    null) in arrival order. Scheduled messages that fell due before the batch are promoted
    first.
    """
    queue = _Queue(state.copy(), reader, now)
    state, args = queue.state, queue.state.arguments
    _promote_due(queue)

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
    for i in np.flatnonzero(waiting).tolist():
        message = Scheduled(int(seqs[i]), int(priorities[i]), int(sizes[i]), int(deliver[i]))
        state.scheduled.append(message)
        state.levels.setdefault(message.priority, Level(head=message.seq))
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


def _single_level_after(queue: _Queue, priority: int) -> bool:
    """No ready message outranks ``priority``: evictions come from this level's head, so a
    whole run can join before trimming (the outcome equals trimming after each message)."""
    return all(p <= priority or lv.ready == 0 for p, lv in queue.state.levels.items())


def _ring_append(queue: _Queue, priority: int, seqs: np.ndarray, sizes: np.ndarray) -> None:
    """ring: each appended message evicts at most one head message (Artemis ring-size)."""
    limit = queue.state.arguments.max_length
    before = queue.state.ready
    if limit is None:
        queue.join(priority, seqs, sizes)
        return
    fits = max(0, min(len(seqs), limit - before))
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
    queue: _Queue,
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


def plan_settle(state: QueueState, reader: HeadReader, now: int) -> EnqueuePlan:
    """Apply a queue's rules with nothing arriving: promote due scheduled messages and, under
    drop-head, trim to the limits at once (after ``alter`` lowered one). ring and the reject
    policies remove nothing here (§2 "changing limits")."""
    queue = _Queue(state.copy(), reader, now)
    _promote_due(queue)
    args = queue.state.arguments
    if args.overflow == "drop-head":
        queue.trim("dropped", args.dead_letter_queue is not None)
    empty = np.zeros(0, dtype=bool)
    return queue.plan(empty, empty)


def gauges(state: QueueState) -> dict[str, int]:
    """A queue's gauges (``leased`` comes with consumers)."""
    return {
        "ready": state.ready,
        "ready_bytes": state.ready_bytes,
        "leased": 0,
        "scheduled": len(state.scheduled),
    }


def identity_holds(stats: dict[str, int]) -> bool:
    """SEMANTICS §4: added = every terminal outcome + ready + leased + scheduled."""
    accounted = sum(stats[c] for c in TERMINAL)
    return stats["added"] == accounted + stats["ready"] + stats["leased"] + stats["scheduled"]
