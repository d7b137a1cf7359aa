"""A deliberately simple reference model of one queue (SEMANTICS §2), message by message.

It keeps every message in a dict and finds the head by scanning, so it is obviously right
and hopelessly slow: the property tests check the real core against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spark_queue.core import COUNTERS
from spark_queue.options import QueueArguments


@dataclass
class ModelMessage:
    seq: int
    priority: int
    size: int
    deliver_at: int | None
    status: str = "ready"  # ready | scheduled


@dataclass
class ModelQueue:
    arguments: QueueArguments
    live: dict[int, ModelMessage] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    removed: dict[int, str] = field(default_factory=dict)  # seq -> outcome
    dead_lettered: list[int] = field(default_factory=list)  # seqs, in the order they died

    def ready(self) -> list[ModelMessage]:
        return [m for m in self.live.values() if m.status == "ready"]

    def head(self) -> ModelMessage | None:
        ready = self.ready()
        return min(ready, key=lambda m: (-m.priority, m.seq)) if ready else None

    def over(self) -> bool:
        a = self.arguments
        ready = self.ready()
        if a.max_length is not None and len(ready) > a.max_length:
            return True
        return a.max_length_bytes is not None and sum(m.size for m in ready) > a.max_length_bytes

    def remove(self, message: ModelMessage, outcome: str) -> None:
        del self.live[message.seq]
        self.removed[message.seq] = outcome
        self.counters[outcome] += 1

    def drop_head(self) -> None:
        head = self.head()
        assert head is not None
        self.remove(head, "dropped")
        if self.arguments.dead_letter_queue is not None:
            self.counters["dead_lettered"] += 1
            self.dead_lettered.append(head.seq)

    def trim(self) -> None:
        while self.over():
            self.drop_head()

    def promote(self, now: int) -> None:
        due = sorted(
            (m for m in self.live.values() if m.status == "scheduled" and m.deliver_at <= now),
            key=lambda m: (m.deliver_at, m.seq),
        )
        a = self.arguments
        for message in due:
            ring_full = a.overflow == "ring" and a.max_length is not None
            if ring_full and len(self.ready()) + 1 > a.max_length:
                self.remove(message, "replaced")
                continue
            message.status = "ready"
        # Everything that fell due since the last commit joins at once, then drop-head trims
        # (docs/DESIGN.md: promotion is lazy, at the next commit or read).
        if a.overflow == "drop-head":
            self.trim()

    def enqueue(self, messages: list[ModelMessage], now: int) -> list[bool]:
        """Returns, per message, whether it was accepted."""
        self.promote(now)
        a = self.arguments
        accepted = []
        for message in messages:
            if message.deliver_at is not None and message.deliver_at > now:
                message.status = "scheduled"
                self.live[message.seq] = message
                self.counters["added"] += 1
                accepted.append(True)
                continue
            if a.overflow in ("reject-publish", "reject-publish-dlx"):
                ready = self.ready()
                count_ok = a.max_length is None or len(ready) + 1 <= a.max_length * (
                    a.reject_threshold
                )
                bytes_ok = (
                    a.max_length_bytes is None
                    or sum(m.size for m in ready) + (message.size)
                    <= a.max_length_bytes * a.reject_threshold
                )
                if not (count_ok and bytes_ok):
                    self.counters["rejected"] += 1
                    accepted.append(False)
                    if a.overflow == "reject-publish-dlx" and a.dead_letter_queue is not None:
                        self.counters["dead_lettered"] += 1
                        self.dead_lettered.append(message.seq)
                    continue
                self.live[message.seq] = message
                self.counters["added"] += 1
                accepted.append(True)
                continue
            self.live[message.seq] = message
            self.counters["added"] += 1
            accepted.append(True)
            if a.overflow == "ring":
                if a.max_length is not None and len(self.ready()) > a.max_length:
                    head = self.head()
                    assert head is not None
                    self.remove(head, "replaced")
            else:
                self.trim()
        return accepted

    def settle(self, now: int) -> None:
        """What `plan_settle` does: promote, and trim at once under drop-head."""
        self.promote(now)
        if self.arguments.overflow == "drop-head":
            self.trim()
