"""A queue's state: its arguments, counters, per-priority levels, index of scheduled
messages and leases (:class:`QueueState`), its JSON form in the table, and what is derived
from it (gauges, the counter identity).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from spark_queue.errors import UnsupportedFormatError
from spark_queue.model.queue_arguments import QueueArguments
from spark_queue.rules.columns import (
    NEVER,
    NO_TIME,
    Leases,
    MessageIndex,
    Redelivered,
    later_each,
    member,
)

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
    "duplicates",
)
"""A queue's counters (SEMANTICS §4), as ``QueueTable.stats`` and the history report them."""
# Outcomes that end a message's life in its queue; `rejected` and `duplicates` are not
# (never added).
TERMINAL = ("acked", "replaced", "dropped", "expired", "killed", "purged")
# The format of the state JSON, stored in it as ``format``; the only one read. A state
# without the key is format 1 (development builds: extras and delivery counts in the JSON,
# no explicit arguments).
STATE_FORMAT = 2


@dataclass
class Level:
    """The messages of one priority in one queue."""

    head: int = 0  # no live message of this level has a smaller seq
    ready: int = 0
    ready_bytes: int = 0


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
    # override.
    explicit: dict[str, object] = field(default_factory=dict)
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
                "format": STATE_FORMAT,
                "arguments": self.arguments.to_dict(),
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
        """The state from :meth:`to_json` and its indexes (none given: empty).

        Raises:
            UnsupportedFormatError: the JSON is not in :data:`STATE_FORMAT`.
        """
        data = json.loads(text)
        found = data.get("format", 1)
        if found != STATE_FORMAT:
            raise UnsupportedFormatError(
                f"queue {name!r} has a state of format version {found}; this spark-queue "
                f"reads version {STATE_FORMAT} only: the table was written by a development "
                "build, make it again"
            )
        counters = dict.fromkeys(COUNTERS, 0)
        counters.update(data["counters"])
        return cls(
            name=name,
            arguments=QueueArguments(**data["arguments"]),
            explicit=data["explicit"],
            policy=data["policy"],
            counters=counters,
            levels={int(p): Level(*values) for p, values in data["levels"].items()},
            holes=set(data["holes"]),
            extras=extras if extras is not None else MessageIndex(),
            scheduled=scheduled if scheduled is not None else MessageIndex(),
            leases=leases if leases is not None else Leases(),
            redelivered=redelivered if redelivered is not None else Redelivered(),
            consumers=data["consumers"],
            next_seq=data["next_seq"],
        )

    def copy(self) -> QueueState:
        """A copy whose changes leave this state as it is; the indexes, which are never
        changed in place, are shared. Built field by field: a commit copies every state of
        the table a few times, and a round trip through :meth:`to_json` costs ~0.1 ms a
        queue."""
        return QueueState(
            name=self.name,
            arguments=self.arguments,  # frozen
            counters=dict(self.counters),
            levels={p: Level(v.head, v.ready, v.ready_bytes) for p, v in self.levels.items()},
            holes=set(self.holes),
            extras=self.extras,
            scheduled=self.scheduled,
            leases=self.leases,
            redelivered=self.redelivered,
            consumers={c: dict(entry) for c, entry in self.consumers.items()},
            next_seq=self.next_seq,
            explicit=dict(self.explicit),  # scalars
            policy=self.policy,
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
            by_queue = np.where(enqueued_at == NO_TIME, NEVER, later_each(enqueued_at, ttl * 1000))
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


def below_heads(state: QueueState, priority: int | None = None) -> np.ndarray:
    """Live messages a head may have passed: extras, scheduled and leased (seq order)."""
    extras, scheduled, leases = state.extras, state.scheduled, state.leases
    if priority is not None:
        extras = extras.take(extras.priority == priority)
        scheduled = scheduled.take(scheduled.priority == priority)
        leases = leases.take(leases.priority == priority)
    return np.sort(np.concatenate([extras.seq, scheduled.seq, leases.seq]))


def ring_room(state: QueueState) -> int | None:
    """How many more messages a ring queue takes before each one replaces the head (Artemis
    ring-size: ready messages only); None unless the queue is a bounded ring."""
    args = state.arguments
    if args.overflow != "ring" or args.max_length is None:
        return None
    return max(0, args.max_length - state.ready)


def live_mask(
    seqs: np.ndarray, heads: np.ndarray | int, holes: np.ndarray, below: np.ndarray
) -> np.ndarray:
    """Which stored ``seqs`` are live messages (ready, scheduled or leased): at or after
    their level's head (``heads``: one per seq, or one for all) and not a hole, or passed by
    their head while still live (``below``: :func:`below_heads`). The one rule for a
    browse, a compaction and anything else that reads stored rows."""
    live = np.asarray(seqs) >= heads
    if len(holes):
        live &= ~member(seqs, holes)
    if len(below):
        live |= member(seqs, below)
    return live


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


def counters_and_gauges(state: QueueState) -> dict[str, int]:
    """A queue's counters and gauges by name, as ``stats`` reports them."""
    return {**{counter: state.counters[counter] for counter in COUNTERS}, **gauges(state)}


def leased_by_consumer(state: QueueState) -> dict[str, int]:
    return state.leases.count_by_consumer()


def identity_holds(stats: dict[str, int]) -> bool:
    """SEMANTICS §4: added = every terminal outcome + ready + leased + scheduled."""
    accounted = sum(stats[c] for c in TERMINAL)
    return stats["added"] == accounted + stats["ready"] + stats["leased"] + stats["scheduled"]
