"""A deliberately simple reference model of one queue (SEMANTICS §2), message by message.

It keeps every message in a dict and finds the head by scanning, so it is obviously right
and hopelessly slow: the property tests check the real core against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from spark_queue.model.queue_arguments import QueueArguments
from spark_queue.rules import COUNTERS


@dataclass
class ModelMessage:
    seq: int
    priority: int
    size: int
    deliver_at: int | None
    status: str = "ready"  # ready | scheduled
    key: str | None = None  # its group, in a queue with message groups


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


@dataclass
class ModelLease:
    consumer: str
    until: int
    deliveries: int
    cancels: int


@dataclass
class ModelConsumers(ModelQueue):
    """The reference queue with consumers (SEMANTICS §3): leases, acks, returns."""

    leases: dict[int, ModelLease] = field(default_factory=dict)
    redelivered: dict[int, tuple[int, int]] = field(default_factory=dict)
    parked: dict[int, ModelMessage] = field(default_factory=dict)  # leased messages
    limits: dict[str, tuple[int, int]] = field(default_factory=dict)
    # An exclusive queue's holder and until when: the last consumer that leased something,
    # until its last lease period ends or it releases.
    holder: tuple[str, int] | None = None

    def release(self, consumer: str, now: int) -> None:
        held = [s for s, lease in self.leases.items() if lease.consumer == consumer]
        self.catch_up(now, held, delay=0)
        if self.holder is not None and self.holder[0] == consumer:
            self.holder = None

    def kill(self, seq: int, outcome: str, reason: str | None) -> None:
        self.removed[seq] = outcome
        self.counters[outcome] += 1
        if reason is not None and self.arguments.dead_letter_queue is not None:
            self.counters["dead_lettered"] += 1
            self.dead_lettered.append(seq)
        self.redelivered.pop(seq, None)

    def backoff(self, deliveries: int) -> int:
        """Artemis: redelivery-delay x multiplier^(deliveries - 1), at most the maximum (10 x
        the delay by default); in microseconds."""
        a = self.arguments
        if not a.redelivery_delay:
            return 0
        ceiling = a.max_redelivery_delay or 10 * a.redelivery_delay
        wait = a.redelivery_delay * a.redelivery_multiplier ** (deliveries - 1)
        return int(min(wait, ceiling) * 1000)

    def give_back(self, seqs: list[int], cancel: bool, now: int, delay: int | None) -> None:
        a = self.arguments
        for seq in sorted(seqs, reverse=True):
            lease = self.leases.pop(seq)
            message = self.parked.pop(seq)
            cancels = lease.cancels + (1 if cancel else 0)
            # The lower of the queue's limit and the consumer's (0/None: none).
            consumer_deliveries, consumer_cancels = self.limits[lease.consumer]
            max_deliveries = min(
                [n for n in (a.max_deliveries, consumer_deliveries) if n], default=0
            )
            max_cancels = min([n for n in (a.max_cancels, consumer_cancels) if n], default=0)
            if cancel and max_cancels and cancels >= max_cancels:
                self.kill(seq, "killed", "cancel_limit")
                continue
            if max_deliveries and lease.deliveries >= max_deliveries:
                self.kill(seq, "killed", "delivery_limit")
                continue
            wait = self.backoff(lease.deliveries) if delay is None else delay
            if wait > 0:  # scheduled until then; the ring checks it when it falls due
                message.status, message.deliver_at = "scheduled", now + wait
                self.live[seq] = message
                self.redelivered[seq] = (lease.deliveries, cancels)
                continue
            if (
                a.overflow == "ring"
                and a.max_length is not None
                and (len(self.ready()) + 1 > a.max_length)
            ):
                self.kill(seq, "replaced", None)
                continue
            message.status = "ready"
            self.live[seq] = message
            self.redelivered[seq] = (lease.deliveries, cancels)

    def catch_up(
        self,
        now: int,
        returning: list[int] = (),
        cancel: bool = False,
        delay: int | None = None,
    ) -> None:
        a = self.arguments
        due = sorted(
            (m for m in self.live.values() if m.status == "scheduled" and m.deliver_at <= now),
            key=lambda m: (m.deliver_at, m.seq),
        )
        for message in due:
            if (
                a.overflow == "ring"
                and a.max_length is not None
                and (len(self.ready()) + 1 > a.max_length)
            ):
                self.remove(message, "replaced")
                continue
            message.status = "ready"
        if returning:
            self.give_back(list(returning), cancel, now, delay)
        expired = [seq for seq, lease in self.leases.items() if lease.until <= now]
        if expired:
            self.give_back(expired, False, now, None)
        if a.overflow == "drop-head":
            self.trim()

    def lease(
        self,
        consumer: str,
        now: int,
        count: int,
        period: int | None,
        max_deliveries: int,
        max_cancels: int,
        accept: Callable[[int], bool] = lambda seq: True,
    ) -> list[tuple[int, int]]:
        """Returns (seq, delivery_count) of what was leased, in delivery order; ``accept`` is
        the consumer's filter."""
        self.catch_up(now)
        if self.arguments.exclusive and self.holder is not None:
            name, until = self.holder
            if name != consumer and until > now:
                return []
        self.limits[consumer] = (max_deliveries, max_cancels)
        blocked: set[str | None] = set()
        if self.arguments.message_groups:  # groups another consumer holds, or that wait
            blocked = {
                self.parked[s].key for s, lease in self.leases.items() if lease.consumer != consumer
            } | {
                m.key
                for m in self.live.values()
                if m.status == "scheduled" and m.seq in self.redelivered
            }
            blocked.discard(None)
        taken = []
        while len(taken) < count:
            ready = [m for m in self.ready() if accept(m.seq) and m.key not in blocked]
            head = min(ready, key=lambda m: (-m.priority, m.seq)) if ready else None
            if head is None:
                break
            del self.live[head.seq]
            deliveries, cancels = self.redelivered.pop(head.seq, (0, 0))
            self.leases[head.seq] = ModelLease(
                consumer, 2**63 - 1 if period is None else now + period, deliveries + 1, cancels
            )
            self.parked[head.seq] = head
            taken.append((head.seq, deliveries + 1))
        if self.arguments.exclusive and taken:
            self.holder = (consumer, 2**63 - 1 if period is None else now + period)
        return taken

    def extend(self, seqs: list[int], consumer: str, now: int, period: int) -> int:
        """``consumer``'s leases of ``seqs`` run out ``period`` after ``now``; run-out leases
        are returned first and not extended. Returns how many were extended."""
        self.catch_up(now)
        extended = 0
        for seq in seqs:
            lease = self.leases.get(seq)
            if lease is not None and lease.consumer == consumer:
                lease.until = now + period
                extended += 1
        return extended

    def ack(self, seqs: list[int], consumer: str) -> None:
        for seq in seqs:
            lease = self.leases.get(seq)
            if lease is not None and lease.consumer == consumer:
                del self.leases[seq]
                del self.parked[seq]
                self.removed[seq] = "acked"
                self.counters["acked"] += 1


@dataclass
class ModelWindow:
    """De-duplication by message id (SEMANTICS §2), id by id: when each id was enqueued."""

    window: int
    recorded: dict[str, int] = field(default_factory=dict)

    def enqueue(self, ids: list[str | None], now: int) -> list[bool]:
        """Per id: whether it is a duplicate; the others are recorded at ``now``."""
        duplicates = []
        for message_id in ids:
            seen_at = self.recorded.get(message_id) if message_id is not None else None
            duplicate = seen_at is not None and seen_at >= now - self.window
            duplicates.append(duplicate)
            if message_id is not None and not duplicate:
                self.recorded[message_id] = now
        return duplicates
