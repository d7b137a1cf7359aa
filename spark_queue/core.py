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
  them: they are found through the index, and counted once they are due;
- ``leases``: messages delivered to a consumer and not yet acknowledged (SEMANTICS §3). A
  lease is taken from the head, so the head passes it; a returned message becomes an extra.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
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
NO_TIME = np.iinfo(np.int64).min
NEVER = np.iinfo(np.int64).max
_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class Level:
    """The messages of one priority in one queue."""

    head: int = 0  # no live message of this level has a smaller seq
    ready: int = 0
    ready_bytes: int = 0


@dataclass(frozen=True)
class Scheduled:
    """An indexed message: not due yet (``scheduled``), or ready below its head (``extras``)."""

    seq: int
    priority: int
    size: int
    deliver_at: int  # microseconds since the epoch
    expires: int = NEVER  # when it expires (the queue's expiration model applied)


@dataclass(frozen=True)
class Lease:
    """A message delivered to ``consumer`` and not acknowledged yet."""

    seq: int
    priority: int
    size: int
    consumer: str
    lease_id: int  # the consumer's lease call (a streaming micro-batch) that took it
    until: int  # when the lease runs out; NEVER without a lease period
    deliveries: int  # times delivered, this time included
    cancels: int
    expires: int = NEVER


def member(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """A mask over ``values``: which are in ``wanted`` (``np.isin`` by sorting).

    Seqs span far more than their count (a task's rows start at ``partition * 2**32``), so
    ``np.isin`` falls back to sorting both arrays through ``np.unique``: 0.8 s for a million
    leases, where a sort of ``wanted`` and a binary search cost 40 ms.
    """
    values, wanted = np.asarray(values), np.asarray(wanted)
    if not len(values) or not len(wanted):
        return np.zeros(len(values), dtype=bool)
    if np.array_equal(values, wanted):  # an ack of every lease held: 1 ms, not 25
        return np.ones(len(values), dtype=bool)
    ordered = ascending(wanted)
    at = np.searchsorted(ordered, values)
    at[at == len(ordered)] = 0
    return ordered[at] == values


def is_ascending(values: np.ndarray) -> bool:
    return len(values) < 2 or bool((values[1:] >= values[:-1]).all())


def ascending(values: np.ndarray) -> np.ndarray:
    """``values`` sorted, without sorting when they already are: leases are taken from the
    head in seq order, so most seq arrays here are, and one pass (2 ms for a million) is
    cheaper than a sort of sorted input (50 ms)."""
    return values if is_ascending(values) else np.sort(values)


def distinct(values: np.ndarray) -> list[int]:
    """The distinct values, ascending: most batches hold one priority, found without the
    hashing ``np.unique`` does (25 ms for a million)."""
    if not len(values):
        return []
    low, high = int(values.min()), int(values.max())
    return [low] if low == high else np.unique(values).tolist()


LEASE_INTS = ("seq", "priority", "size", "lease_id", "until", "deliveries", "cancels", "expires")


class Leases:
    """A queue's leased messages, column by column: one numpy array per :class:`Lease` field.
    Consumers are codes (``consumer_ids``, int32) into ``names``: a batch of 200,000 leases
    of one consumer costs a fill of small ints, where names as Python strings cost tens of
    milliseconds to fill, compare and hand to Arrow. A lease batch costs a few array
    operations whatever its size; nothing here changes an array in place, so states may
    share them."""

    __slots__ = ("names", "consumer_ids", *LEASE_INTS)

    names: tuple[str, ...]
    consumer_ids: np.ndarray
    seq: np.ndarray
    priority: np.ndarray
    size: np.ndarray
    lease_id: np.ndarray
    until: np.ndarray
    deliveries: np.ndarray
    cancels: np.ndarray
    expires: np.ndarray

    def __init__(
        self,
        names: tuple[str, ...] = (),
        consumer_ids: np.ndarray | None = None,
        **columns: np.ndarray,
    ) -> None:
        self.names = tuple(names)
        self.consumer_ids = (
            np.zeros(0, np.int32) if consumer_ids is None else np.asarray(consumer_ids, np.int32)
        )
        count = len(self.consumer_ids)
        for name in LEASE_INTS:
            values = columns.get(name)
            setattr(
                self,
                name,
                np.zeros(count, np.int64) if values is None else np.asarray(values, np.int64),
            )

    @classmethod
    def of_consumer(cls, consumer: str, **columns: np.ndarray) -> Leases:
        """Leases all held by ``consumer``."""
        count = len(columns["seq"])
        return cls((consumer,), np.zeros(count, np.int32), **columns)

    @classmethod
    def concat(cls, parts: list[Leases]) -> Leases:
        parts = [part for part in parts if len(part)]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls()
        names = tuple(dict.fromkeys(name for part in parts for name in part.names))
        code = {name: i for i, name in enumerate(names)}
        ids = [
            part.consumer_ids
            if part.names == names[: len(part.names)]
            else np.array([code[n] for n in part.names], np.int32)[part.consumer_ids]
            for part in parts
        ]
        return cls(
            names,
            np.concatenate(ids),
            **{n: np.concatenate([getattr(p, n) for p in parts]) for n in LEASE_INTS},
        )

    def __len__(self) -> int:
        return len(self.seq)

    @property
    def consumer(self) -> np.ndarray:
        """Each lease's consumer name (an object array): for the rare paths and display."""
        return (
            np.array(self.names, dtype=object)[self.consumer_ids]
            if self.names
            else (np.zeros(len(self), dtype=object))
        )

    def __iter__(self) -> Iterator[Lease]:
        """One :class:`Lease` per message: for display and tests, never per batch."""
        columns = {n: getattr(self, n).tolist() for n in LEASE_INTS}
        for position, consumer in enumerate(self.consumer.tolist()):
            yield Lease(consumer=consumer, **{n: values[position] for n, values in columns.items()})

    def take(self, selection: np.ndarray) -> Leases:
        """The leases at ``selection`` (a boolean mask or positions). A mask of all or none
        copies nothing: a batch's ack takes every lease the state holds (a million leases'
        nine arrays cost 20 ms to copy)."""
        if selection.dtype == bool and len(selection) == len(self):
            if selection.all():
                return self
            if not selection.any():
                return Leases(self.names)
        columns = {n: getattr(self, n)[selection] for n in LEASE_INTS}
        return Leases(self.names, self.consumer_ids[selection], **columns)

    def held(self, seqs: np.ndarray | None = None, consumer: str | None = None) -> np.ndarray:
        """A mask: leases of these ``seqs`` (all if None) held by ``consumer`` (any if None)."""
        if consumer is not None and consumer not in self.names:
            return np.zeros(len(self), dtype=bool)
        mask = np.ones(len(self), dtype=bool) if seqs is None else member(self.seq, seqs)
        if consumer is not None:
            mask &= self.consumer_ids == self.names.index(consumer)
        return mask

    def count_by_consumer(self) -> dict[str, int]:
        """Leases per consumer name, for those holding any."""
        counts = np.bincount(self.consumer_ids, minlength=len(self.names))
        return {name: int(n) for name, n in zip(self.names, counts.tolist(), strict=True) if n}


INDEX_INTS = ("seq", "priority", "size", "deliver_at", "expires")


class MessageIndex:
    """Messages a queue state indexes, column by column as :class:`Leases`: the scheduled
    ones (not due yet), and the extras (ready below their level's head: returned leases,
    scheduled messages that fell due). Returning a million leases, or scheduling a million
    messages, costs array operations, not a Python object per message. Arrays are never
    changed in place, so states share them."""

    __slots__ = INDEX_INTS

    seq: np.ndarray
    priority: np.ndarray
    size: np.ndarray
    deliver_at: np.ndarray
    expires: np.ndarray

    def __init__(self, **columns: np.ndarray) -> None:
        count = len(columns.get("seq", _EMPTY))
        for name in INDEX_INTS:
            values = columns.get(name)
            if values is None:  # no time: never expires, no delivery time
                unset = {"expires": NEVER, "deliver_at": NO_TIME}.get(name, 0)
                values = np.full(count, unset, np.int64)
            setattr(self, name, np.asarray(values, np.int64))

    @classmethod
    def of(cls, messages: list[Scheduled]) -> MessageIndex:
        return cls(
            **{
                name: np.array([getattr(m, name) for m in messages], np.int64)
                for name in INDEX_INTS
            }
        )

    @classmethod
    def concat(cls, parts: list[MessageIndex]) -> MessageIndex:
        parts = [part for part in parts if len(part)]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls()
        return cls(**{n: np.concatenate([getattr(p, n) for p in parts]) for n in INDEX_INTS})

    def __len__(self) -> int:
        return len(self.seq)

    def __iter__(self) -> Iterator[Scheduled]:
        columns = [getattr(self, n).tolist() for n in INDEX_INTS]
        return (Scheduled(*values) for values in zip(*columns, strict=True))

    def take(self, selection: np.ndarray) -> MessageIndex:
        return MessageIndex(**{n: getattr(self, n)[selection] for n in INDEX_INTS})


class Redelivered:
    """Messages delivered before and back in their queue, with the delivery and cancel
    counts their next lease carries on; one entry per seq, column by column."""

    __slots__ = ("cancels", "deliveries", "seq")

    def __init__(
        self,
        seq: np.ndarray = _EMPTY,
        deliveries: np.ndarray = _EMPTY,
        cancels: np.ndarray = _EMPTY,
    ) -> None:
        self.seq = np.asarray(seq, np.int64)
        self.deliveries = np.asarray(deliveries, np.int64)
        self.cancels = np.asarray(cancels, np.int64)

    def __len__(self) -> int:
        return len(self.seq)

    def without(self, seqs: np.ndarray) -> Redelivered:
        """These entries but those of ``seqs``."""
        if not len(self) or not len(seqs):
            return self
        keep = ~member(self.seq, seqs)
        if keep.all():
            return self
        return Redelivered(self.seq[keep], self.deliveries[keep], self.cancels[keep])

    def plus(self, seqs: np.ndarray, deliveries: np.ndarray, cancels: np.ndarray) -> Redelivered:
        """These entries, with ``seqs`` set to the given counts."""
        if not len(seqs):
            return self
        rest = self.without(seqs)
        return Redelivered(
            np.concatenate([rest.seq, seqs]),
            np.concatenate([rest.deliveries, deliveries]),
            np.concatenate([rest.cancels, cancels]),
        )

    def find(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(a mask over ``seqs``: which have an entry, their deliveries, their cancels)."""
        if not len(self) or not len(seqs):
            return np.zeros(len(seqs), bool), _EMPTY, _EMPTY
        known = member(seqs, self.seq)
        order = np.argsort(self.seq)
        at = order[np.searchsorted(self.seq, seqs[known], sorter=order)]
        return known, self.deliveries[at], self.cancels[at]


@dataclass
class QueueState:
    """Everything a commit needs to know about a queue without reading its messages."""

    name: str
    arguments: QueueArguments = field(default_factory=QueueArguments)  # effective
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    levels: dict[int, Level] = field(default_factory=dict)
    holes: set[int] = field(default_factory=set)
    extras: MessageIndex = field(default_factory=MessageIndex)  # ready, below their head
    scheduled: MessageIndex = field(default_factory=MessageIndex)  # not due yet
    leases: Leases = field(default_factory=Leases)
    redelivered: Redelivered = field(default_factory=Redelivered)
    # Per consumer: the last lease id, and the limits it leased with.
    consumers: dict[str, dict[str, int]] = field(default_factory=dict)
    next_seq: int = 0  # above every seq this queue has used
    # The arguments given explicitly (snake_case -> value), which policy defaults never
    # override; None for a state stored before policies: all its arguments count as given.
    explicit: dict[str, object] | None = None
    policy: str | None = None  # the policy that shaped ``arguments`` when last resolved

    @property
    def ready(self) -> int:
        return sum(level.ready for level in self.levels.values())

    @property
    def ready_bytes(self) -> int:
        return sum(level.ready_bytes for level in self.levels.values())

    def to_json(self) -> str:
        """The state without its indexes (scheduled, extras, redelivered, leases), which are
        stored as rows of their own."""
        return json.dumps(
            {
                "arguments": json.loads(self.arguments.to_json()),
                "explicit": self.explicit,
                "policy": self.policy,
                "counters": self.counters,
                "levels": {
                    str(p): [v.head, v.ready, v.ready_bytes] for p, v in self.levels.items()
                },
                "holes": sorted(self.holes),
                "consumers": self.consumers,
                "next_seq": self.next_seq,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(
        cls,
        name: str,
        text: str,
        scheduled: MessageIndex | None = None,
        leases: Leases | None = None,
        extras: MessageIndex | None = None,
        redelivered: Redelivered | None = None,
    ) -> QueueState:
        """The state from :meth:`to_json` and its indexes. Tables written before extras and
        redelivered counts had index rows of their own hold them in the JSON."""
        data = json.loads(text)
        if extras is None:
            extras = MessageIndex.of([Scheduled(*values) for values in data.get("extras", [])])
        if redelivered is None:
            known = data.get("redelivered", {})
            counts = np.array(list(known.values()), np.int64).reshape(-1, 2)
            redelivered = Redelivered(
                np.array([int(k) for k in known], np.int64), counts[:, 0], counts[:, 1]
            )
        counters = dict.fromkeys(COUNTERS, 0)
        counters.update(data["counters"])
        return cls(
            name=name,
            arguments=QueueArguments(**data["arguments"]),
            explicit=data.get("explicit"),
            policy=data.get("policy"),
            counters=counters,
            levels={int(p): Level(*values) for p, values in data["levels"].items()},
            holes=set(data["holes"]),
            extras=extras,
            scheduled=scheduled if scheduled is not None else MessageIndex(),
            leases=leases if leases is not None else Leases(),
            redelivered=redelivered,
            consumers=data.get("consumers", {}),
            next_seq=data["next_seq"],
        )

    def copy(self) -> QueueState:
        return QueueState.from_json(
            self.name,
            self.to_json(),
            self.scheduled,
            self.leases,
            self.extras,
            self.redelivered,
        )

    def expiry(self, enqueued_at: np.ndarray, expires_at: np.ndarray) -> np.ndarray:
        """When messages expire, by the queue's ``expiration`` and ``expiration_model``
        (AMPS): ``default`` the message's own time if set, else the queue's; ``queue`` the
        queue's; ``earliest``/``latest`` the earlier/later of the two that are set."""
        ttl = self.arguments.expiration
        own = np.where(expires_at == NO_TIME, NEVER, expires_at)
        if ttl is None:
            by_queue = np.full(len(own), NEVER, dtype=np.int64)
        else:
            by_queue = np.where(enqueued_at == NO_TIME, NEVER, enqueued_at + ttl * 1000)
        model = self.arguments.expiration_model
        if model == "queue":
            return by_queue
        if model == "earliest":
            return np.minimum(own, by_queue)
        if model == "latest":
            both = np.maximum(
                np.where(own == NEVER, NO_TIME, own), np.where(by_queue == NEVER, NO_TIME, by_queue)
            )
            return np.where(both == NO_TIME, NEVER, both)
        return np.where(own != NEVER, own, by_queue)


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
    death_reason: str | None  # copy them to the dead-letter queue with this reason


@dataclass
class EnqueuePlan:
    """What one commit does to one queue."""

    state: QueueState  # the queue after the commit
    accepted: np.ndarray  # bool per incoming message; False = rejected, not stored
    rejected_to_dlq: np.ndarray  # bool per incoming message: rejected and dead-lettered
    removals: list[Removal]  # stored or incoming messages this commit removes
    leased: Leases = field(default_factory=Leases)  # delivered by this commit

    def removed_seqs(self, outcome: str | None = None) -> np.ndarray:
        parts = [r.seqs for r in self.removals if outcome in (None, r.outcome)]
        return np.concatenate(parts) if parts else _EMPTY

    def dead_letters(self) -> dict[str, np.ndarray]:
        """Seqs to dead-letter, by death reason."""
        found: dict[str, list[np.ndarray]] = {}
        for removal in self.removals:
            if removal.death_reason is not None:
                found.setdefault(removal.death_reason, []).append(removal.seqs)
        return {reason: np.concatenate(parts) for reason, parts in found.items()}

    def dead_letter_seqs(self) -> np.ndarray:
        parts = list(self.dead_letters().values())
        return np.concatenate(parts) if parts else _EMPTY


Chunk = tuple[np.ndarray, np.ndarray, np.ndarray]  # seqs, sizes, expiry times


class _LevelCursor:
    """Walks one level's ready messages in head order: extras and stored rows, then arrivals.

    Stored rows that are scheduled, leased, or removed behind the head are passed over.
    """

    def __init__(self, reader: HeadReader, state: QueueState, priority: int, now: int) -> None:
        self._batches = reader.read(state.name, priority, state.levels[priority].head)
        self._state = state
        # Only what lies at or past the head can be met: usually nothing at all.
        head = state.levels[priority].head
        holes = np.fromiter((h for h in state.holes if h >= head), dtype=np.int64)
        leases = state.leases
        held = leases.seq[(leases.seq >= head) & (leases.priority == priority)]
        self._skip = np.concatenate([holes, held])
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
        self._skip = np.concatenate([self._skip, seqs])

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
                return values.to_numpy(zero_copy_only=False).astype(np.int64)

            seqs, sizes = column("seq", 0), column("size", 0)
            due = column("deliver_at", NO_TIME)
            live = ~member(seqs, self._skip) if len(self._skip) else np.ones(len(seqs), bool)
            ready = live & (due <= self._now)  # later ones are scheduled: in the index
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
            return _EMPTY, _EMPTY, _EMPTY
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
        removed = np.concatenate([seqs for _, seqs in self.evicted]) if self.evicted else _EMPTY
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
    ) -> EnqueuePlan:
        self.settle()
        return EnqueuePlan(self.state, accepted, rejected_to_dlq, self.removals, leased or Leases())

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
        behind = seqs[seqs >= level.head] if level is not None else _EMPTY
        if len(behind):
            state.holes.update(behind.tolist())
            if priority in self.cursors:
                self.cursors[priority].skip(behind)

    def give_back(self, leases: Leases, *, cancel: bool) -> None:
        """Return leased messages to their position (SEMANTICS §2 "returned messages").

        A message at its delivery or cancel limit is killed instead (dead-lettered with
        ``delivery_limit`` / ``cancel_limit``). Under ring a return that does not fit is
        removed itself, newest returns first (Artemis); drop-head trims from the head after.
        """
        state, args = self.state, self.state.arguments
        state.leases = state.leases.take(~member(state.leases.seq, leases.seq))
        leases = leases.take(np.argsort(leases.seq)[::-1])  # newest first
        cancels = leases.cancels + (1 if cancel else 0)

        def limit(name: str) -> np.ndarray:
            per_consumer = [state.consumers.get(c, {}).get(name, 0) for c in leases.names]
            return np.array(per_consumer or [0], np.int64)[leases.consumer_ids]

        max_cancels, max_deliveries = limit("max_cancels"), limit("max_deliveries")
        cancel_limit = (max_cancels > 0) & (cancels >= max_cancels) & cancel
        delivery_limit = (
            ~cancel_limit & (max_deliveries > 0) & (leases.deliveries >= max_deliveries)
        )
        back = ~(cancel_limit | delivery_limit)
        replaced = np.zeros(len(leases), dtype=bool)
        if args.overflow == "ring" and args.max_length is not None:
            room = max(0, args.max_length - state.ready)
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
        state.redelivered = state.redelivered.plus(returned.seq, returned.deliveries, cancels[back])

    def catch_up(self, returning: Leases | None = None, *, cancel: bool = False) -> None:
        """What happened since the last commit, and ``returning`` leases: scheduled messages
        fell due, leases ran out (AMPS LeasePeriod) and return for any consumer. All join
        before any cursor reads, then drop-head trims once."""
        _promote_due(self)
        if returning is not None and len(returning):
            self.give_back(returning, cancel=cancel)
        ran_out = self.state.leases.until <= self.now
        if ran_out.any():
            self.give_back(self.state.leases.take(ran_out), cancel=False)
        args = self.state.arguments
        if args.overflow == "drop-head":
            self.trim("dropped", args.dead_letter_queue is not None)


def _promote_due(queue: _Queue) -> None:
    """Scheduled messages that are due join at their seq position (§2), in due order; under
    ring those that do not fit are removed themselves. The caller trims (drop-head) after."""
    state, args = queue.state, queue.state.arguments
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
    if args.overflow == "ring" and args.max_length is not None:
        # Artemis: a due message that does not fit the ring is removed itself.
        fits[max(0, args.max_length - state.ready) :] = False
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


def plan_enqueue(
    state: QueueState, incoming: pa.Table, reader: HeadReader, now: int
) -> EnqueuePlan:
    """Apply one commit's incoming messages to a queue; the input state is left unchanged.

    ``incoming`` holds ``seq``, ``size``, ``priority`` and ``deliver_at`` (microseconds or
    null) in arrival order, and optionally ``enqueued_at``/``expires_at`` (for when a
    scheduled message expires). Scheduled messages that fell due before the batch are promoted
    first.
    """
    queue = _Queue(state.copy(), reader, now)
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
    queue.catch_up()
    empty = np.zeros(0, dtype=bool)
    return queue.plan(empty, empty)


def plan_lease(
    state: QueueState,
    reader: HeadReader,
    now: int,
    consumer: str,
    *,
    max_messages: int | None = None,
    max_bytes: int | None = None,
    lease_period: int | None = None,
    max_deliveries: int = 0,
    max_cancels: int = 0,
    max_backlog: int | None = None,
    below_seq: int | None = None,
    remove: bool = False,
    matches: Callable[[np.ndarray], np.ndarray] | None = None,
) -> EnqueuePlan:
    """Deliver head messages to ``consumer`` (SEMANTICS §3): lease them, or with ``remove``
    (at-most-once) take them out at once, counted as ``acked``.

    Bounds: ``max_messages`` and ``max_bytes`` for this call (at least one message is always
    taken, as Delta's ``maxBytesPerTrigger`` admits one file), ``max_backlog`` for the leases
    of all consumers, ``below_seq`` for what existed when an AvailableNow query started.
    Expired messages met on the way are removed (``expired``), never delivered. Due scheduled
    messages and expired leases are settled first. ``lease_period`` is in microseconds.
    ``matches`` (a consumer's filter) says which of some seqs this consumer may take; the
    others stay, in place, for other consumers.
    """
    queue = _Queue(state.copy(), reader, now)
    queue.catch_up()
    state = queue.state
    limits = state.consumers.setdefault(consumer, {"last_lease": 0})
    limits.update(max_deliveries=max_deliveries, max_cancels=max_cancels)
    limits["last_lease"] += 1
    lease_id = limits["last_lease"]
    until = NEVER if lease_period is None else now + lease_period
    budget = max_messages if max_messages is not None else NEVER
    if max_backlog is not None:
        budget = min(budget, max(0, max_backlog - len(state.leases)))
    bytes_left = max_bytes if max_bytes is not None else NEVER
    leased: list[Leases] = []
    for priority in sorted(state.levels, reverse=True):
        level = state.levels[priority]
        cursor = queue.cursor(priority) if level.ready else None
        index = 0  # chunks before it hold only messages this consumer's filter refused
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # seqs, sizes, expiries
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
            if not chosen.all():  # expired: never delivered
                queue.kill_many(priority, seqs[~chosen], "expired", "expired")
            if not chosen.all():
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
        if parts:  # one lease array per level: joining chunk by chunk cost 0.05 s a million
            leased.append(
                _new_leases(
                    state,
                    *(np.concatenate(column) for column in zip(*parts, strict=True)),
                    priority,
                    consumer,
                    lease_id,
                    until,
                )
            )
        if budget <= 0:
            break
    delivered = Leases.concat(leased)
    if remove:
        state.counters["acked"] += len(delivered)
        if len(delivered):
            queue.removals.append(Removal(delivered.seq, "acked", None))
            queue.note_gone(delivered)
    else:
        state.leases = Leases.concat([state.leases, delivered])
    return queue.plan(np.zeros(0, bool), np.zeros(0, bool), delivered)


def _new_leases(
    state: QueueState,
    seqs: np.ndarray,
    sizes: np.ndarray,
    expires: np.ndarray,
    priority: int,
    consumer: str,
    lease_id: int,
    until: int,
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
) -> EnqueuePlan:
    """Acknowledge leased messages (of ``consumer``, if given); other seqs are ignored, so an
    ack that arrives after the lease ran out and the message went elsewhere does nothing."""
    queue = _Queue(state.copy(), reader, now)
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


def _leases_of(state: QueueState, seqs: np.ndarray | None, consumer: str | None) -> Leases:
    wanted = None if seqs is None else np.asarray(seqs, dtype=np.int64)
    return state.leases.take(state.leases.held(wanted, consumer))


def plan_return(
    state: QueueState,
    reader: HeadReader,
    now: int,
    *,
    seqs: np.ndarray | None = None,
    consumer: str | None = None,
    cancel: bool = False,
) -> EnqueuePlan:
    """Return leased messages now: ``cancel`` (counts toward ``maxCancels``), or a release
    of everything ``consumer`` holds, as a closed Artemis consumer does."""
    queue = _Queue(state.copy(), reader, now)
    queue.catch_up(_leases_of(queue.state, seqs, consumer), cancel=cancel)
    return queue.plan(np.zeros(0, bool), np.zeros(0, bool))


def plan_expire(
    state: QueueState, reader: HeadReader, now: int, seqs: np.ndarray, consumer: str | None = None
) -> EnqueuePlan:
    """Remove leased messages now with reason ``expired`` (AMPS ``expire``)."""
    queue = _Queue(state.copy(), reader, now)
    queue.catch_up()
    ending = _leases_of(queue.state, seqs, consumer)
    queue.state.leases = queue.state.leases.take(~member(queue.state.leases.seq, ending.seq))
    for priority in distinct(ending.priority):
        queue.kill_many(priority, ending.seq[ending.priority == priority], "expired", "expired")
    return queue.plan(np.zeros(0, bool), np.zeros(0, bool))


def below_heads(state: QueueState, priority: int | None = None) -> np.ndarray:
    """Live messages a head may have passed: extras, scheduled and leased (seq order)."""
    extras, scheduled, leases = state.extras, state.scheduled, state.leases
    if priority is not None:
        extras = extras.take(extras.priority == priority)
        scheduled = scheduled.take(scheduled.priority == priority)
        leases = leases.take(leases.priority == priority)
    return np.sort(np.concatenate([extras.seq, scheduled.seq, leases.seq]))


def settles(before: QueueState, after: QueueState) -> bool:
    """Whether catching up with the clock changed the queue from ``before`` to ``after`` (a
    plan's state): a lease ran out and returned, a scheduled message fell due, a message
    expired or was trimmed. A lease that leased nothing and changed none of these has
    nothing to commit."""
    return (
        before.counters != after.counters
        or len(before.leases) != len(after.leases)
        or len(before.extras) != len(after.extras)
        or len(before.scheduled) != len(after.scheduled)
        or {p: level.head for p, level in before.levels.items()}
        != {p: level.head for p, level in after.levels.items()}
    )


def gauges(state: QueueState) -> dict[str, int]:
    """A queue's gauges."""
    return {
        "ready": state.ready,
        "ready_bytes": state.ready_bytes,
        "leased": len(state.leases),
        "scheduled": len(state.scheduled),
    }


def leased_by_consumer(state: QueueState) -> dict[str, int]:
    return state.leases.count_by_consumer()


def identity_holds(stats: dict[str, int]) -> bool:
    """SEMANTICS §4: added = every terminal outcome + ready + leased + scheduled."""
    accounted = sum(stats[c] for c in TERMINAL)
    return stats["added"] == accounted + stats["ready"] + stats["leased"] + stats["scheduled"]
