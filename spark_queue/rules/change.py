"""One commit's change to one queue (:class:`QueueChange`): the mechanics every rule is
written with. It walks a queue's levels from the head through a :class:`HeadReader` (only as
far as the rules need, so no rule's cost grows with the queue's depth), removes, joins,
kills and gives back messages, and ends in a :class:`QueuePlan`: the new state and what was
removed, with which outcome.

"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa

from spark_queue.model.queue_arguments import QueueArguments, effective_limit
from spark_queue.rules.columns import (
    EMPTY_SEQS,
    NEVER,
    NO_TIME,
    Leases,
    MessageIndex,
    ascending,
    distinct,
    later_each,
    member,
)
from spark_queue.rules.state import Level, QueueState, ring_room

# What a HeadReader yields; times are microseconds since the epoch, or null.
HEAD_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("size", pa.int64()),
        ("deliver_at", pa.int64()),
        ("enqueued_at", pa.int64()),
        ("expires_at", pa.int64()),
    ]
)


class HeadReader(Protocol):
    """Reads a queue's stored rows of one priority, ``seq`` ascending, from a position."""

    def read(self, queue: str, priority: int, from_seq: int) -> Iterator[pa.Table]:
        """Yield tables of :data:`HEAD_SCHEMA` rows with ``seq >= from_seq``, in order."""
        ...

    def keys(self, queue: str, seqs: np.ndarray) -> pa.Array:
        """The ``key`` of each stored message of ``seqs`` (strings, aligned with ``seqs``;
        null where a message has none): the message groups of a queue that has them."""
        ...


@dataclass(frozen=True)
class Removal:
    """Messages of one queue removed together, with one outcome."""

    seqs: np.ndarray
    outcome: str  # one of TERMINAL
    death_reason: str | None  # copy them to the dead-letter queue with this reason


@dataclass
class QueuePlan:
    """What one commit does to one queue."""

    state: QueueState  # the queue after the commit
    accepted: np.ndarray  # bool per incoming message; False = rejected, not stored
    rejected_to_dlq: np.ndarray  # bool per incoming message: rejected and dead-lettered
    removals: list[Removal]  # stored or incoming messages this commit removes
    leased: Leases = field(default_factory=Leases)  # delivered by this commit

    def dead_letters(self) -> dict[str, np.ndarray]:
        """Seqs to dead-letter, by death reason."""
        found: dict[str, list[np.ndarray]] = {}
        for removal in self.removals:
            if removal.death_reason is not None:
                found.setdefault(removal.death_reason, []).append(removal.seqs)
        return {reason: np.concatenate(parts) for reason, parts in found.items()}


Chunk = tuple[np.ndarray, np.ndarray, np.ndarray]  # seqs, sizes, expiry times


class LevelCursor:
    """Walks one level's ready messages in head order: extras and stored rows, then arrivals.

    Stored rows that are scheduled, leased, or removed behind the head are passed over.
    """

    def __init__(self, reader: HeadReader, state: QueueState, priority: int, now: int) -> None:
        self._batches = reader.read(state.name, priority, state.levels[priority].head)
        self._state = state
        # Where nothing leaves the level's front and its head stood on ready messages, the
        # head stands and no file is read to confirm it (:meth:`head_stands`): an enqueue
        # that evicts nothing reads no stored row (on an object store, requests saved).
        self._head_was_ready = state.levels[priority].ready > 0
        self._front_moved = False
        # Only what lies at or past the head can be met: usually nothing at all.
        head = state.levels[priority].head
        holes = np.fromiter((h for h in state.holes if h >= head), dtype=np.int64)
        leases = state.leases
        held = leases.seq[(leases.seq >= head) & (leases.priority == priority)]
        self._skip = np.concatenate([holes, held])
        # Scheduled by the index, whatever the row's own deliver_at says: a returned message
        # waiting out its redelivery delay is a stored row at or past the head. Ascending
        # already where nothing was returned with a delay: arrivals are indexed in seq order.
        waiting = state.scheduled
        self._waiting = ascending(
            waiting.seq[(waiting.seq >= head) & (waiting.priority == priority)]
        )
        self._now = now
        self._stored: list[Chunk] = []
        extras = state.extras.take(state.extras.priority == priority)
        if len(extras):  # below the head, so ahead of every stored row
            extras = extras.take(np.argsort(extras.seq, kind="stable"))
            self._stored.append((extras.seq, extras.size, extras.expires))
        self._stored_done = False
        self._incoming: list[Chunk] = []

    def skip(self, seqs: np.ndarray) -> None:
        """Stored rows this cursor has not read yet that are gone: pass them over."""
        self._front_moved = True
        self._skip = np.concatenate([self._skip, seqs])

    def wait(self, seqs: np.ndarray) -> None:
        """Stored rows that are scheduled from now (returned with a delay): pass them over."""
        self._waiting = np.sort(np.concatenate([self._waiting, seqs]))

    def append(self, seqs: np.ndarray, sizes: np.ndarray) -> None:
        self._incoming.append((seqs, sizes, np.full(len(seqs), NEVER, dtype=np.int64)))

    def _read_more(self) -> bool:
        """Buffer the next stored chunk that has ready rows; False once none are left."""
        while not self._stored_done:
            batch = next(self._batches, None)
            if batch is None:
                self._stored_done = True
                break

            def column(name: str, null: int, rows: pa.Table = batch) -> np.ndarray:
                values = rows.column(name).fill_null(null)
                ints: np.ndarray = values.to_numpy(zero_copy_only=False).astype(np.int64)
                return ints

            seqs, sizes = column("seq", 0), column("size", 0)
            due = column("deliver_at", NO_TIME)
            live = ~member(seqs, self._skip) if len(self._skip) else np.ones(len(seqs), bool)
            ready = live & (due <= self._now)  # later ones are scheduled: in the index
            if len(self._waiting) and ready.any():
                ready[ready] = ~member(seqs[ready], self._waiting)
            if ready.any():
                expires = self._state.expiry(
                    column("enqueued_at", NO_TIME)[ready], column("expires_at", NO_TIME)[ready]
                )
                self._stored.append((seqs[ready], sizes[ready], expires))
                return True
        return False

    def _chunk(self, index: int) -> Chunk | None:
        """The ``index``-th buffered chunk in head order: stored rows first, then arrivals."""
        while len(self._stored) <= index and self._read_more():
            pass
        if index < len(self._stored):
            return self._stored[index]
        index -= len(self._stored)
        return self._incoming[index] if index < len(self._incoming) else None

    def _source(self) -> list[Chunk] | None:
        if self._stored or self._read_more():
            return self._stored
        return self._incoming if self._incoming else None

    def pop(self, count: int) -> Chunk:
        """Take up to ``count`` messages from the head."""
        self._front_moved = True
        taken: list[Chunk] = []
        while count > 0:
            source = self._source()
            if source is None:
                break
            seqs, sizes, expires = source[0]
            take = min(count, len(seqs))
            taken.append((seqs[:take], sizes[:take], expires[:take]))
            if take == len(seqs):
                source.pop(0)
            else:
                source[0] = (seqs[take:], sizes[take:], expires[take:])
            count -= take
        if not taken:
            return EMPTY_SEQS, EMPTY_SEQS, EMPTY_SEQS
        return (
            np.concatenate([t[0] for t in taken]),
            np.concatenate([t[1] for t in taken]),
            np.concatenate([t[2] for t in taken]),
        )

    def peek(self) -> tuple[int, int, int] | None:
        """The head message as (seq, size, expiry), without taking it."""
        source = self._source()
        if source is None:
            return None
        seqs, sizes, expires = source[0]
        return int(seqs[0]), int(sizes[0]), int(expires[0])

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

    def chunk_at(self, index: int) -> Chunk | None:
        """The ``index``-th buffered run of head messages, without taking them."""
        return self._chunk(index)

    def take_at(self, index: int, positions: np.ndarray) -> Chunk:
        """Take the messages at ``positions`` of the ``index``-th run; the rest stay."""
        self._front_moved = True
        chunk = self._chunk(index)
        assert chunk is not None and index < len(self._stored)
        keep = np.ones(len(chunk[0]), dtype=bool)
        keep[positions] = False
        taken = (chunk[0][positions], chunk[1][positions], chunk[2][positions])
        if keep.any():
            self._stored[index] = (chunk[0][keep], chunk[1][keep], chunk[2][keep])
        else:
            del self._stored[index]
        return taken

    def first_ready(self) -> int | None:
        """The smallest seq still ready in this level after this commit's evictions."""
        head = self.peek()
        return head[0] if head is not None else None

    def head_stands(self) -> bool:
        """Whether nothing this cursor walked left the front of a level whose head stood on
        ready messages: then the head stays where it is, unread."""
        return self._head_was_ready and not self._front_moved


class QueueChange:
    """One commit's work on one queue: levels, their cursors, and what gets removed."""

    def __init__(self, state: QueueState, reader: HeadReader, now: int) -> None:
        self.state = state
        self.reader = reader
        self.now = now
        self.cursors: dict[int, LevelCursor] = {}
        self.removals: list[Removal] = []
        self.evicted: list[tuple[int, np.ndarray]] = []  # (priority, seqs) removed

    def cursor(self, priority: int) -> LevelCursor:
        if priority not in self.cursors:
            self.cursors[priority] = LevelCursor(self.reader, self.state, priority, self.now)
        return self.cursors[priority]

    def _remove(
        self, priority: int, seqs: np.ndarray, sizes: np.ndarray, outcome: str, dead_letter: bool
    ) -> None:
        level = self.state.levels[priority]
        level.ready -= len(seqs)
        level.ready_bytes -= int(sizes.sum())
        self.state.counters[outcome] += len(seqs)
        if dead_letter:
            self.state.counters["dead_lettered"] += len(seqs)
        self.removals.append(Removal(seqs, outcome, "maxlen" if dead_letter else None))
        self.evicted.append((priority, seqs))

    def evict(self, count: int, outcome: str, dead_letter: bool) -> int:
        """Remove ``count`` messages from the head, highest priority first."""
        removed = 0
        for priority in sorted(self.state.levels, reverse=True):
            level = self.state.levels[priority]
            while removed < count and level.ready > 0:
                seqs, sizes, _ = self.cursor(priority).pop(min(count - removed, level.ready))
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
            if priority not in highest and cursor.head_stands():
                continue
            level = state.levels[priority]
            first = cursor.first_ready()
            if first is not None:
                level.head = max(level.head, first)
            elif priority in highest:
                level.head = max(level.head, highest[priority] + 1)
        for level in state.levels.values():
            if level.ready == 0:
                level.head = max(level.head, state.next_seq)
        for priority, seqs in self.evicted:
            state.holes.update(seqs[seqs >= state.levels[priority].head].tolist())
        removed = np.concatenate([seqs for _, seqs in self.evicted]) if self.evicted else EMPTY_SEQS
        extras = state.extras
        if len(extras):
            keep = ~(member(extras.seq, removed) | member(extras.seq, state.leases.seq))
            for priority in distinct(extras.priority):
                at = extras.priority == priority
                keep[at] &= extras.seq[at] < state.levels[priority].head
            if not keep.all():
                state.extras = extras.take(keep)
        state.redelivered = state.redelivered.without(removed)
        floor = min((lv.head for lv in state.levels.values()), default=state.next_seq)
        state.holes = {h for h in state.holes if h >= floor}

    def plan(
        self, accepted: np.ndarray, rejected_to_dlq: np.ndarray, leased: Leases | None = None
    ) -> QueuePlan:
        self.settle()
        return QueuePlan(self.state, accepted, rejected_to_dlq, self.removals, leased or Leases())

    def note_gone(self, messages: Leases) -> None:
        """Messages that left their queue outside an eviction, grouped by priority."""
        for priority in distinct(messages.priority):
            self.evicted.append((priority, messages.seq[messages.priority == priority]))

    def kill_many(self, priority: int, seqs: np.ndarray, outcome: str, reason: str | None) -> None:
        """End messages of one priority that are not ready (leased, or taken off the head)
        with ``outcome``."""
        state = self.state
        state.counters[outcome] += len(seqs)
        dead = reason is not None and state.arguments.dead_letter_queue is not None
        if dead:
            state.counters["dead_lettered"] += len(seqs)
        self.removals.append(Removal(seqs, outcome, reason if dead else None))
        self.evicted.append((priority, seqs))
        state.redelivered = state.redelivered.without(seqs)
        # A killed lease at or past its level's head is a hole from now on: a cursor that
        # reads past it in this same commit (a lease after a return) must not deliver it.
        level = state.levels.get(priority)
        behind = seqs[seqs >= level.head] if level is not None else EMPTY_SEQS
        if len(behind):
            state.holes.update(behind.tolist())
            if priority in self.cursors:
                self.cursors[priority].skip(behind)

    def give_back(self, leases: Leases, *, cancel: bool, delay: int | None = None) -> None:
        """Return leased messages to their position (SEMANTICS §2 "returned messages").

        A message at its delivery or cancel limit is killed instead (dead-lettered with
        ``delivery_limit`` / ``cancel_limit``). Under ring a return that does not fit is
        removed itself, newest returns first (Artemis); drop-head trims from the head after.
        A return waits ``delay`` microseconds (None: the queue's redelivery backoff) in the
        scheduled index before it is ready again; the ring checks it when it falls due.
        """
        state = self.state
        state.leases = state.leases.take(~member(state.leases.seq, leases.seq))
        leases = leases.take(np.argsort(leases.seq)[::-1])  # newest first
        cancels = leases.cancels + (1 if cancel else 0)

        def limit(name: str) -> np.ndarray:
            """Per lease: the lower of the queue's limit and its consumer's (0: none)."""
            queue_limit = getattr(state.arguments, name)
            per_consumer = [
                effective_limit(queue_limit, state.consumers.get(c, {}).get(name, 0))
                for c in leases.names
            ]
            limits: np.ndarray = np.array(per_consumer or [0], np.int64)[leases.consumer_ids]
            return limits

        max_cancels, max_deliveries = limit("max_cancels"), limit("max_deliveries")
        cancel_limit = (max_cancels > 0) & (cancels >= max_cancels) & cancel
        delivery_limit = (
            ~cancel_limit & (max_deliveries > 0) & (leases.deliveries >= max_deliveries)
        )
        back = ~(cancel_limit | delivery_limit)
        waits = (
            redelivery_delays(state.arguments, leases.deliveries)
            if delay is None
            else np.full(len(leases), min(delay, NEVER), np.int64)
        )
        later = back & (waits > 0)
        back &= ~later
        replaced = np.zeros(len(leases), dtype=bool)
        room = ring_room(state)
        if room is not None:
            replaced[np.flatnonzero(back)[room:]] = True
            back &= ~replaced
        for dead, outcome, reason in (
            (cancel_limit, "killed", "cancel_limit"),
            (delivery_limit, "killed", "delivery_limit"),
            (replaced, "replaced", None),
        ):
            if dead.any():
                for priority in distinct(leases.priority[dead]):
                    at = dead & (leases.priority == priority)
                    self.kill_many(priority, leases.seq[at], outcome, reason)
        returned, extras = leases.take(back), [state.extras]
        for priority in distinct(returned.priority):
            at = returned.priority == priority
            level = state.levels.setdefault(priority, Level(head=state.next_seq))
            level.ready += int(at.sum())
            level.ready_bytes += int(returned.size[at].sum())
            below = at & (returned.seq < level.head)  # at or after the head: among the rows
            extras.append(
                MessageIndex(
                    seq=returned.seq[below],
                    priority=returned.priority[below],
                    size=returned.size[below],
                    deliver_at=np.full(int(below.sum()), NO_TIME, np.int64),
                    expires=returned.expires[below],
                )
            )
        state.extras = MessageIndex.concat(extras)
        if later.any():
            waiting = leases.take(later)
            state.scheduled = MessageIndex.concat(
                [
                    state.scheduled,
                    MessageIndex(
                        seq=waiting.seq,
                        priority=waiting.priority,
                        size=waiting.size,
                        # Below NEVER, which the index stores as no time: due at once.
                        deliver_at=np.minimum(later_each(self.now, waits[later]), NEVER - 1),
                        expires=waiting.expires,
                    ),
                ]
            )
            for cursor in self.cursors.values():  # stored rows a cursor must not deliver now
                cursor.wait(waiting.seq)
        again = back | later
        state.redelivered = state.redelivered.plus(
            leases.seq[again], leases.deliveries[again], cancels[again]
        )

    def catch_up(
        self, returning: Leases | None = None, *, cancel: bool = False, delay: int | None = None
    ) -> None:
        """What happened since the last commit, and ``returning`` leases (waiting ``delay``
        microseconds, None: the queue's backoff): scheduled messages fell due, leases ran out
        (AMPS LeasePeriod) and return for any consumer, after the queue's backoff. All join
        before any cursor reads, then drop-head trims once."""
        _promote_due(self)
        if returning is not None and len(returning):
            self.give_back(returning, cancel=cancel, delay=delay)
        ran_out = self.state.leases.until <= self.now
        if ran_out.any():
            self.give_back(self.state.leases.take(ran_out), cancel=False)
        args = self.state.arguments
        if args.overflow == "drop-head":
            self.trim("dropped", args.dead_letter_queue is not None)


def redelivery_delays(arguments: QueueArguments, deliveries: np.ndarray) -> np.ndarray:
    """Microseconds each returned message waits before it is ready again, by its
    deliveries so far: ``redelivery_delay x redelivery_multiplier^(deliveries - 1)``, at most
    ``max_redelivery_delay`` (10 x the delay where unset), as Artemis computes it."""
    first = arguments.redelivery_delay
    if not first:
        return np.zeros(len(deliveries), np.int64)
    ceiling = arguments.max_redelivery_delay or 10 * first
    growth = np.power(
        arguments.redelivery_multiplier, np.maximum(deliveries - 1, 0).astype(np.float64)
    )
    millis = np.minimum(first * growth, ceiling)
    # A float beyond int64 would cast to int64's minimum, a time long past: 2**62 us (146
    # thousand years) is as good as never, and later_each adds it to now without wrapping.
    delays: np.ndarray = np.minimum(millis * 1000, 2.0**62).astype(np.int64)
    return delays


def _promote_due(queue: QueueChange) -> None:
    """Scheduled messages that are due join at their seq position (§2), in due order; under
    ring those that do not fit are removed themselves. The caller trims (drop-head) after."""
    state = queue.state
    waiting = state.scheduled
    now_due = waiting.deliver_at <= queue.now
    if not now_due.any():
        return
    state.scheduled = waiting.take(~now_due)
    due = waiting.take(now_due)
    due = due.take(np.lexsort((due.seq, due.deliver_at)))  # due order
    for priority in distinct(due.priority):  # a new level starts at its first due message
        if priority not in state.levels:
            first = due.seq[np.flatnonzero(due.priority == priority)[0]]
            state.levels[priority] = Level(head=int(first))
    fits = np.ones(len(due), dtype=bool)
    room = ring_room(state)
    if room is not None:  # Artemis: a due message that does not fit the ring is removed itself
        fits[room:] = False
    replaced = due.take(~fits)
    if len(replaced):
        state.counters["replaced"] += len(replaced)
        queue.removals.append(Removal(replaced.seq, "replaced", None))
        for priority in distinct(replaced.priority):
            seqs = replaced.seq[replaced.priority == priority]
            queue.evicted.append((priority, seqs))
            # At or after the head: a hole before any cursor reads past it.
            state.holes.update(seqs[seqs >= state.levels[priority].head].tolist())
    joined, extras = due.take(fits), [state.extras]
    for priority in distinct(joined.priority):
        at = joined.priority == priority
        level = state.levels[priority]
        level.ready += int(at.sum())
        level.ready_bytes += int(joined.size[at].sum())
        extras.append(joined.take(at & (joined.seq < level.head)))
    state.extras = MessageIndex.concat(extras)
