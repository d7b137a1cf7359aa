"""Column containers of the pure core: a queue's leases, its index of scheduled messages and
its redelivery counts, each as numpy arrays column by column (never one Python object per
message), and the set operations over sorted ``seq`` arrays they are built with.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NO_TIME = np.iinfo(np.int64).min
NEVER = np.iinfo(np.int64).max
EMPTY_SEQS = np.zeros(0, dtype=np.int64)


def later(at: int, span: int) -> int:
    """``span`` (>= 0) microseconds after ``at``, at most :data:`NEVER`: a lease's or a
    redelivery's end stays in the future whatever the span, never wrapped past int64 into
    the past (a lease that ended at once would let a second consumer take its message)."""
    return int(NEVER) if span >= NEVER - at else at + span


def later_each(at: int | np.ndarray, span: int | np.ndarray) -> np.ndarray:
    """:func:`later` element by element, as int64 (``at`` and ``span`` broadcast)."""
    if isinstance(span, int):
        span = min(span, int(NEVER))  # beyond int64 is as far as NEVER
    at, span = np.asarray(at, dtype=np.int64), np.asarray(span, dtype=np.int64)
    room = NEVER - np.maximum(at, 0)  # cannot overflow; below 0, at + span cannot either
    return np.where(span >= room, NEVER, at + np.minimum(span, room))


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

    Seqs span more than their count (a Spark write numbers each task's rows in a lane), so
    ``np.isin`` falls back to sorting both arrays through ``np.unique``, where a sort of
    ``wanted`` and a binary search are 20 times cheaper.
    """
    values, wanted = np.asarray(values), np.asarray(wanted)
    if not len(values) or not len(wanted):
        return np.zeros(len(values), dtype=bool)
    if np.array_equal(values, wanted):  # an ack of every lease held: one comparison
        return np.ones(len(values), dtype=bool)
    ordered = ascending(wanted)
    at = np.searchsorted(ordered, values)
    at[at == len(ordered)] = 0
    found: np.ndarray = ordered[at] == values
    return found


def is_ascending(values: np.ndarray) -> bool:
    return len(values) < 2 or bool((values[1:] >= values[:-1]).all())


def ascending(values: np.ndarray) -> np.ndarray:
    """``values`` sorted, without sorting when they already are: leases are taken from the
    head in seq order, so most seq arrays here are, and one pass is cheaper than a sort of
    sorted input."""
    return values if is_ascending(values) else np.sort(values)


def distinct(values: np.ndarray) -> list[int]:
    """The distinct values, ascending: most batches hold one priority, found without the
    hashing ``np.unique`` does."""
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

    __slots__ = ("names", "consumer_ids", "keys", *LEASE_INTS)

    names: tuple[str, ...]
    consumer_ids: np.ndarray
    # Each message's group (its ``key``) in a queue with message groups; None elsewhere, so
    # a queue without groups carries nothing more.
    keys: pa.Array | None
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
        keys: pa.Array | None = None,
        **columns: np.ndarray,
    ) -> None:
        self.names = tuple(names)
        self.keys = keys
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
    def of_consumer(
        cls, consumer: str, keys: pa.Array | None = None, **columns: np.ndarray
    ) -> Leases:
        """Leases all held by ``consumer``."""
        count = len(columns["seq"])
        return cls((consumer,), np.zeros(count, np.int32), keys, **columns)

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
        keys = None
        if any(part.keys is not None for part in parts):
            keys = pa.concat_arrays(
                [
                    part.keys if part.keys is not None else pa.nulls(len(part), pa.string())
                    for part in parts
                ]
            )
        return cls(
            names,
            np.concatenate(ids),
            keys,
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
        copies nothing: a batch's ack takes every lease the state holds."""
        if selection.dtype == bool and len(selection) == len(self):
            if selection.all():
                return self
            if not selection.any():
                return Leases(self.names)
        columns = {n: getattr(self, n)[selection] for n in LEASE_INTS}
        keys = None
        if self.keys is not None:
            keys = (
                self.keys.filter(pa.array(selection))
                if selection.dtype == bool
                else self.keys.take(pa.array(selection))
            )
        return Leases(self.names, self.consumer_ids[selection], keys, **columns)

    def held(self, seqs: np.ndarray | None = None, consumer: str | None = None) -> np.ndarray:
        """A mask: leases of these ``seqs`` (all if None) held by ``consumer`` (any if None)."""
        if consumer is not None and consumer not in self.names:
            return np.zeros(len(self), dtype=bool)
        mask = np.ones(len(self), dtype=bool) if seqs is None else member(self.seq, seqs)
        if consumer is not None:
            mask &= self.consumer_ids == self.names.index(consumer)
        return mask

    def in_deliveries(self, seqs: np.ndarray, deliveries: np.ndarray) -> np.ndarray:
        """The ``seqs`` whose lease is in delivery ``deliveries[i]`` (its ``deliveries``
        count): a lease delivered again since, or not leased, drops out."""
        if not len(self):
            return seqs[:0]
        order = np.argsort(self.seq, kind="stable")
        leased = self.seq[order]
        position = np.minimum(np.searchsorted(leased, seqs), len(leased) - 1)
        found = leased[position] == seqs
        held: np.ndarray = seqs[found & (self.deliveries[order][position] == deliveries)]
        return held

    def groups_by_consumer(self) -> dict[str, int]:
        """Message groups held per consumer (distinct keys of its leases), for those holding
        any."""
        if self.keys is None or self.keys.null_count == len(self):
            return {}
        held = pa.table({"consumer": pa.array(self.consumer_ids), "key": self.keys}).filter(
            pc.is_valid(self.keys)
        )
        counts = held.group_by("consumer").aggregate([("key", "count_distinct")])
        return {
            self.names[code]: int(n)
            for code, n in zip(
                counts["consumer"].to_pylist(),
                counts["key_count_distinct"].to_pylist(),
                strict=True,
            )
        }

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
        count = len(columns.get("seq", EMPTY_SEQS))
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
        seq: np.ndarray = EMPTY_SEQS,
        deliveries: np.ndarray = EMPTY_SEQS,
        cancels: np.ndarray = EMPTY_SEQS,
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
            return np.zeros(len(seqs), bool), EMPTY_SEQS, EMPTY_SEQS
        known = member(seqs, self.seq)
        order = np.argsort(self.seq)
        at = order[np.searchsorted(self.seq, seqs[known], sorter=order)]
        return known, self.deliveries[at], self.cancels[at]
