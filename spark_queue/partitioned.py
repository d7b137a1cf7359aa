"""A ``QueueTable``'s calls on partitioned queues (``partitions`` above 1; the layout, seqs
and routing are :mod:`spark_queue.model.partitions`'s): :class:`Partitions` routes each call
to the partition tables it concerns, commits each partition that a call touches (through
that table's group commit, the partitions at once) and puts their answers together.

A queue of one partition never gets here beyond a look at its count: every call on it
runs as on a queue table without partitions.
"""

from __future__ import annotations

import copy
import functools
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, TypeVar, cast

import numpy as np
import pyarrow as pa

from spark_queue.commit.enqueue import PRODUCER_APP_PREFIX, PendingBatch
from spark_queue.commit.group import group_of
from spark_queue.commit.landing import HANDED_ON, hand_on, must_not_hand_on
from spark_queue.commit.maintenance import Progress
from spark_queue.commit.requests import (
    ChangeRequest,
    ExtendRequest,
    LeaseRequest,
    PublishRequest,
    Request,
)
from spark_queue.commit.transaction import QueueTransaction, declaration, run
from spark_queue.errors import PartitionedQueueError, QueueError, TableNotFoundError
from spark_queue.model.messages import Bodies, Rows, as_input_table, normalise
from spark_queue.model.partition_calls import lease_in_turn, merged_outcome, scoped_partition
from spark_queue.model.partition_turns import (
    LeaseTurn,
    PublishTurn,
    next_lease_turn,
    next_publish_turn,
)
from spark_queue.model.partitions import (
    ROOT_SEQ_LIMIT,
    first_seq,
    key_partition,
    partition_of,
    partition_uri,
    refuse_lowering,
    row_partitions,
)
from spark_queue.model.policies import Policies
from spark_queue.model.queue_arguments import ConsumerLimits, QueueArguments
from spark_queue.model.results import PublishOutcome, QueueStats
from spark_queue.rules import counters_and_gauges, identity_holds, leased_by_consumer
from spark_queue.storage.browse import (
    delivered_rows,
    peek_rows,
    purgeable_seqs,
    settled_states,
)
from spark_queue.storage.commit_log import CommitOperation
from spark_queue.storage.location import Location
from spark_queue.storage.store import QueueStore, Snapshot, now_micros, require_queue

COUNT_SECONDS = 1.0
"""How long a queue's partition count, once read, is taken as it is: raising it reaches a
producer or consumer of this process within this long and the view's ``TRUSTED_SECONDS``
(a count is never lowered)."""

FIRST_TURNS = 2**32
"""A queue's first turn is drawn from this many: every partition is as likely a start, to
one part in four million (1024 partitions at most)."""

# Each process's keyless publish turn of each partitioned queue, by (process, root table,
# queue): every QueueTable and thread of a process shares it, as every thread of a Kafka
# producer shares its sticky partition (spark_queue.model.partition_turns).
_PUBLISH_TURNS: dict[tuple[int, str, str], PublishTurn] = {}
_PUBLISH_TURNS_LOCK = threading.Lock()
_DRAWS = random.Random()

T = TypeVar("T")

KeylessPlaces = Callable[[str, int], list[int]]
"""The partitions where a process places a queue's rows free to go anywhere (given the
queue and its count): a broker's own (:func:`~spark_queue.model.assignment.keyless_partitions`);
without one, every partition."""


def publish_request(
    queue: str,
    rows: Bodies | pa.Table,
    enqueued_at: int,
    given: dict[str, Any],
    producer: str | None,
    sequence: int | None,
    on_reject: str,
    policies: Policies | None,
    *,
    whole: bool = False,
) -> PublishRequest:
    """A publish of ``rows`` (:func:`~spark_queue.model.messages.publish_input`'s, or a
    table of input columns) to one table's ``queue``: bodies only are shaped by the group's
    leader, with the round's other publishes."""
    if isinstance(rows, pa.Table):
        rows = Bodies.of(rows, enqueued_at) or normalise(rows, 0, enqueued_at, queue)
    batch = PendingBatch(queue, rows)
    return PublishRequest(
        queue,
        batch,
        given,
        producer=producer,
        sequence=sequence,
        on_reject=on_reject,
        policies=policies,
        whole=whole,
    )


def table_stats(store: QueueStore, queue: str, snapshot: Snapshot | None = None) -> QueueStats:
    """One table's ``stats`` of ``queue`` (``QueueTable.stats``), from ``snapshot`` where
    given (the present, just read), else from the present."""
    snapshot = snapshot or store.snapshot()
    if snapshot is None:
        raise TableNotFoundError(store.uri)
    require_queue(snapshot.states, queue, store.uri)
    state = settled_states(store, snapshot, now_micros(), [queue])[queue]
    stats: dict[str, Any] = counters_and_gauges(state)
    if not identity_holds(stats):
        raise QueueError(f"queue {queue!r}: counters break the stats identity: {stats}")
    stats["leased_by_consumer"] = leased_by_consumer(state)
    stats["groups_by_consumer"] = state.leases.groups_by_consumer()
    return cast(QueueStats, stats)  # every counter and gauge, by name


def partitions_in(root: Snapshot, queue: str) -> int:
    """``queue``'s partitions as ``root`` (the root table's snapshot) records them."""
    state = root.states.get(queue)
    return state.arguments.partitions if state is not None else 1


def partition_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """A partitioned queue's given arguments as its partition tables take them: each holds
    one partition (the root records the count)."""
    return {name: value for name, value in arguments.items() if name != "partitions"}


def summed(parts: list[QueueStats]) -> QueueStats:
    """Partitions' stats as the queue's: counts and gauges added up, and each consumer's
    leases and groups added up over the partitions."""
    total: dict[str, Any] = {}
    for part in parts:
        for name, value in part.items():
            if isinstance(value, dict):
                into = total.setdefault(name, {})
                for consumer, count in value.items():
                    into[consumer] = into.get(consumer, 0) + count
            else:
                total[name] = total.get(name, 0) + value
    return cast(QueueStats, total)


class Partitions:
    """The partitioned queues of the queue table at ``store`` (the root), for its
    ``QueueTable``. Thread-safe."""

    def __init__(self, store: QueueStore) -> None:
        self.store = store
        self.keyless_places: KeylessPlaces | None = None
        self._fresh_caches()

    def _fresh_caches(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[int, float]] = {}  # queue -> (count, when read)
        self._stores: dict[tuple[str, int], QueueStore] = {}
        self._lease_turns: dict[str, LeaseTurn] = {}  # queue -> where its next lease starts

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store}  # a QueueTable pickles; its copy reads counts anew

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.store = state["store"]
        self.keyless_places = None
        self._fresh_caches()

    # -- where -----------------------------------------------------------------------------

    def store_of(self, queue: str, partition: int) -> QueueStore:
        """The table of ``queue``'s partition ``partition`` (0: the root)."""
        if partition == 0:
            return self.store
        with self._lock:
            found = self._stores.get((queue, partition))
            if found is None:
                root = self.store.location
                uri = partition_uri(root.uri, queue, partition)
                found = QueueStore(Location(uri, root.options))
                self._stores[(queue, partition)] = found
            return found

    def count(self, queue: str, *, fresh: bool = False) -> int:
        """``queue``'s partitions as the root table says (1 where it has no such queue, or
        no table): read again after :data:`COUNT_SECONDS` from the root as this process
        knows it, or from the present where ``fresh``."""
        now = time.monotonic()
        counted = None if fresh else self.counted(queue)
        if counted is not None:
            return counted
        # The process's view of the root, which the root's next commit reads anyway: no
        # request of its own on a warm table. A publish routed as for one partition is
        # checked by its commit (QueuePartitioned), so a count another process just
        # declared is never missed; a raise reaches routing within TRUSTED_SECONDS.
        snapshot = self.store.snapshot(probe=fresh)
        found = partitions_in(snapshot, queue) if snapshot is not None else 1
        with self._lock:
            self._counts[queue] = (found, now)
        return found

    def counted(self, queue: str) -> int | None:
        """``queue``'s partitions where :meth:`count` read them within
        :data:`COUNT_SECONDS`; else None (it reads them again)."""
        with self._lock:
            known = self._counts.get(queue)
        if known is not None and time.monotonic() - known[1] < COUNT_SECONDS:
            return known[0]
        return None

    def require_partition(self, queue: str, partition: int) -> None:
        """That ``queue`` has a partition ``partition`` (its count read again where the one
        known says no: a count raised elsewhere a moment ago).

        Raises:
            PartitionedQueueError: it has not.
        """
        if partition < self.count(queue) or partition < self.count(queue, fresh=True):
            return
        raise PartitionedQueueError(
            f"queue {queue!r} has partitions={self.count(queue)}: it has no partition "
            f"{partition}; nothing was done"
        )

    def partitioned(self, snapshot_states: dict[str, Any]) -> dict[str, int]:
        """The partitioned queues of a root's states, with their counts."""
        return {
            name: state.arguments.partitions
            for name, state in snapshot_states.items()
            if state.arguments.partitions > 1
        }

    def lease_turn(self, queue: str) -> LeaseTurn:
        """Where this ``QueueTable``'s next lease of ``queue`` starts (its partition: the
        turn's ``start`` modulo the count). The first is random, as Kafka's sticky
        partitioner's first partition is: clients that start together would otherwise all
        begin at partition 0."""
        with self._lock:
            turn = self._lease_turns.get(queue)
            if turn is None:
                turn = self._lease_turns[queue] = LeaseTurn(random.randrange(FIRST_TURNS))
            return turn

    def leased(self, queue: str, turn: LeaseTurn, count: int, filled: bool, raced: bool) -> None:
        """A lease that started at ``turn`` came back (:func:`next_lease_turn`'s
        ``filled`` and ``raced``): the next one's turn. Of leases of this table that
        started at one turn together, the first back moves it."""
        with self._lock:
            if self._lease_turns.get(queue) == turn:
                self._lease_turns[queue] = next_lease_turn(turn, count, filled, raced, _DRAWS)

    def publish_turn(self, queue: str) -> int:
        """This process's keyless publish turn of ``queue`` (its partition: modulo the
        count), shared by its tables and threads, so that calls made together ride one
        commit. The first is random: processes start at partitions apart."""
        key = (os.getpid(), self.store.uri, queue)
        with _PUBLISH_TURNS_LOCK:
            turn = _PUBLISH_TURNS.get(key)
            if turn is None:
                turn = _PUBLISH_TURNS[key] = PublishTurn(random.randrange(FIRST_TURNS))
            return turn.start

    def keyless_partition(self, queue: str, turn: int, count: int) -> tuple[int, int]:
        """The partition where the keyless ``turn`` places rows of ``queue`` (of ``count``
        partitions), and how many partitions the turn goes over: every one, or those
        :attr:`keyless_places` gives (a broker's own, so that two brokers' keyless rounds
        never race for one table)."""
        places = None if self.keyless_places is None else self.keyless_places(queue, count)
        if not places:
            return turn % count, count
        return places[turn % len(places)], len(places)

    def passed_on(self, queue: str, turn: int) -> None:
        """A keyless call at ``turn`` went whole to a broker (the owner of the turn's
        partition, which places its rows): the process's next keyless call goes to the next
        partition's, so that a client's calls go to each broker in proportion to the
        partitions it owns."""
        key = (os.getpid(), self.store.uri, queue)
        with _PUBLISH_TURNS_LOCK:
            known = _PUBLISH_TURNS.get(key)
            if known is not None and known.start == turn:
                _PUBLISH_TURNS[key] = PublishTurn(turn + 1)

    def published(self, queue: str, turn: int, count: int, version: int, raced: bool) -> None:
        """A keyless publish's commit of ``version`` at ``turn`` landed (``raced``: after
        losing a race; ``count``: the partitions the turn goes over): the process's turn
        after it (:func:`next_publish_turn`); a caller that comes back after the turn moved
        on changes nothing."""
        key = (os.getpid(), self.store.uri, queue)
        with _PUBLISH_TURNS_LOCK:
            known = _PUBLISH_TURNS.get(key)
            if known is not None and known.start == turn:
                _PUBLISH_TURNS[key] = next_publish_turn(known, count, version, raced, _DRAWS)

    # -- declaring -------------------------------------------------------------------------

    def prepare(
        self, queue: str, given: dict[str, Any], policies: Policies | None, *, alter: bool
    ) -> None:
        """Before the root commits a declare or alter of ``queue``: a raise of its count
        refused where it would lower it, and the tables of every partition past 0 declared
        (or altered) with the arguments the root will have, ``partitions`` aside. A crash
        before the root's commit leaves tables no reader looks for, which the next declare
        takes as they are."""
        partitions = given.get("partitions")
        if not alter and partitions in (None, 1):
            return  # a declare without a count: the root compares the rest, no table to make
        snapshot = self.store.snapshot()
        state = snapshot.states.get(queue) if snapshot is not None else None
        if state is None and alter:
            return  # the root refuses it (no queue)
        if state is not None and alter:  # a declare's other count is a mismatch
            refuse_lowering(queue, state.arguments.partitions, partitions)
        arguments = declaration(queue, state, given, policies, alter=alter)[0]
        if arguments.partitions == 1:
            return
        self.store.create()  # the root first: its folder then holds the partitions' folder
        each = replace(arguments, partitions=1)
        futures = [
            self._in_thread(functools.partial(self._declare_partition, queue, k, each))
            for k in range(1, arguments.partitions)
        ]
        _results(futures)
        with self._lock:
            self._counts.pop(queue, None)

    def _declare_partition(self, queue: str, partition: int, arguments: QueueArguments) -> None:
        def work(transaction: QueueTransaction) -> None:
            state = transaction.states.get(queue)
            if state is not None and state.arguments == arguments:
                return
            if state is None:  # the partition's first seq: its seqs name it
                transaction.next_seq = max(transaction.next_seq, first_seq(partition))
            transaction.declare(queue, arguments.to_dict(), alter=True)
            if state is not None:
                transaction.settle(queue)
            transaction.commit(operation=CommitOperation.DECLARE.on(queue))

        run(self.store_of(queue, partition), work, what=f"partition {partition} of {queue!r}")

    @staticmethod
    def _in_thread(call: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()

        def target() -> None:
            try:
                future.set_result(call())
            except BaseException as error:
                future.set_exception(error)

        threading.Thread(target=target, daemon=True, name="spark-queue-partition").start()
        return future

    # -- producing -------------------------------------------------------------------------

    def publish(
        self,
        queue: str,
        taken: Bodies | pa.Table,
        given_rows: Rows,
        given: dict[str, Any],
        count: int,
        producer: str | None,
        sequence: int | None,
        on_reject: str,
        policies: Policies | None,
    ) -> PublishOutcome:
        """A publish's rows (``taken``: :func:`publish_input`'s of ``given_rows``) to
        ``queue``'s ``count`` partitions: a row with a key to its key's partition; rows
        without one to the producer's (an idempotent producer's retry goes where its first
        try went), else all to the process's keyless turn (sticky)."""
        must_not_hand_on()  # each share waits on its partition's round
        if isinstance(taken, Bodies) and producer is None and scoped_partition() is None:
            return self._publish_bodies(queue, taken, given, count, on_reject, policies)
        # Routed by key: the input columns as a table (bodies alone are read once more).
        rows = taken if isinstance(taken, pa.Table) else as_input_table(given_rows)
        targets, turn = self.targets(queue, rows, count, producer)
        parts: list[tuple[np.ndarray, Future[PublishOutcome]]] = []
        for partition in np.unique(targets).tolist():
            at = np.flatnonzero(targets == partition)
            own = given if partition == 0 else partition_arguments(given)
            request = publish_request(
                queue,
                rows.take(at),
                now_micros(),
                own,
                producer,
                sequence,
                on_reject,
                policies if partition == 0 else None,
            )
            store = self.store_of(queue, partition)
            parts.append((at, group_of(store.location).submit(request)))
        outcomes = _results([future for _, future in parts])
        shares = [(at, outcome) for (at, _), outcome in zip(parts, outcomes, strict=True)]
        self.took_turn(queue, turn, count, targets, shares)
        return merged_outcome(queue, rows.num_rows, shares)

    def _publish_bodies(
        self,
        queue: str,
        bodies: Bodies,
        given: dict[str, Any],
        count: int,
        on_reject: str,
        policies: Policies | None,
    ) -> PublishOutcome:
        """Bodies alone, without a producer: all to the process's keyless turn, kept as
        given for the partition's group commit to shape with its round's others, as on a
        queue without partitions (shaped in the caller's thread, 32 callers' calls under
        the GIL come back too far apart to share rounds)."""
        turn = self.publish_turn(queue)
        partition, spread = self.keyless_partition(queue, turn, count)
        request = publish_request(
            queue,
            bodies,
            now_micros(),
            given if partition == 0 else partition_arguments(given),
            None,
            None,
            on_reject,
            policies if partition == 0 else None,
        )
        store = self.store_of(queue, partition)
        outcome: PublishOutcome = group_of(store.location).submit(request).result()
        if outcome.result.version is not None:
            self.published(queue, turn, spread, outcome.result.version, outcome.result.attempts > 1)
        return outcome

    def targets(
        self, queue: str, rows: pa.Table, count: int, producer: str | None
    ) -> tuple[np.ndarray, int | None]:
        """The partition of each row (see :meth:`publish`): all of them the one
        :func:`one_partition` scopes the call to, where it does; and the process's keyless
        turn the rows without a key took (None: an idempotent producer's, or scoped)."""
        scoped = scoped_partition()
        if scoped is not None:
            self.require_partition(queue, scoped)
            return np.full(rows.num_rows, scoped, dtype=np.int64), None
        keys = rows["key"] if "key" in rows.column_names else None
        if producer is not None:
            return row_partitions(keys, rows.num_rows, count, key_partition(producer, count)), None
        turn = self.publish_turn(queue)
        keyless = keys is None or keys.null_count > 0
        partition = self.keyless_partition(queue, turn, count)[0]
        return row_partitions(keys, rows.num_rows, count, partition), turn if keyless else None

    def took_turn(
        self,
        queue: str,
        turn: int | None,
        count: int,
        targets: np.ndarray,
        shares: list[tuple[np.ndarray, PublishOutcome]],
    ) -> None:
        """After a publish's shares came back: where some went to the keyless ``turn``'s
        partition and its commit landed, the process's turn goes on (:meth:`published`)."""
        if turn is None:
            return
        partition, spread = self.keyless_partition(queue, turn, count)
        for at, outcome in shares:
            version = outcome.result.version
            if len(at) and int(targets[at[0]]) == partition and version is not None:
                self.published(queue, turn, spread, version, outcome.result.attempts > 1)

    def last_sequence(self, producer: str, queues: dict[str, int]) -> int | None:
        """The last sequence ``producer`` committed to any partition of ``queues`` (the
        root's own is the caller's)."""
        found = []
        for queue, count in queues.items():
            for partition in range(1, count):
                snapshot = self.store_of(queue, partition).snapshot(with_states=False)
                if snapshot is not None:
                    found.append(snapshot.transaction_version(f"{PRODUCER_APP_PREFIX}{producer}"))
        return max((f for f in found if f is not None), default=None)

    # -- consuming -------------------------------------------------------------------------

    def lease(
        self,
        queue: str,
        count: int,
        limits: ConsumerLimits,
        filter: str | None,
        strict_groups: bool,
    ) -> pa.Table:
        """Up to ``limits.max_messages`` of ``queue``'s messages, from its partitions in turn
        from the partition of this table's lease turn (:meth:`lease_turn`: it stays where
        the partition fills the leases, and comes to every partition within a bound), the
        rest from the partitions after it: each partition's messages in its delivery
        order. The schema's metadata holds each partition's version the lease planned on
        (:data:`LEASE_VERSIONS_KEY`), where an idle consumer watches for commits."""
        scoped = scoped_partition()
        turn = None
        if scoped is not None:
            self.require_partition(queue, scoped)
            count, order = max(count, scoped + 1), [scoped]
        else:
            turn = self.lease_turn(queue)
            order = [(turn.start + step) % count for step in range(count)]
        attempts: list[int] = []  # each asked partition's commit attempt

        def lease_share(
            partition: int, messages: int | None, body_bytes: int | None
        ) -> tuple[pa.Table, int | None]:
            store = self.store_of(queue, partition)
            asked = replace(limits, max_messages=messages, max_bytes=body_bytes)
            request = LeaseRequest(queue, asked, filter, strict_groups)
            outcome = group_of(store.location).submit(request).result()
            attempts.append(outcome.attempt)
            rows = delivered_rows(store, outcome.view, queue, outcome.leased)
            return rows, outcome.view.version

        leased = lease_in_turn(count, order, limits.max_messages, limits.max_bytes, lease_share)
        if turn is not None:  # the first partition filled it where no other was asked
            self.leased(queue, turn, count, filled=len(attempts) == 1, raced=attempts[0] > 1)
        return leased

    def submit(self, request: Request[Any]) -> Any:
        """A request of ``QueueTable._call``: one with seqs, to the partitions its seqs
        name; a release of every lease, to every partition; anything else to the root."""
        root = group_of(self.store.location)
        if isinstance(request, ChangeRequest | ExtendRequest):
            seqs = request.seqs
            if seqs is not None and len(seqs) and int(seqs.max()) >= ROOT_SEQ_LIMIT:
                return self._by_seqs(request, seqs)
            if seqs is None:  # a release: every partition of its queue (or every queue)
                return self._everywhere(request)
        future = root.submit(request)
        if isinstance(request, PublishRequest) and request.whole and hand_on(future):
            return HANDED_ON  # answered as its round lands, by whoever took it
        return future.result()

    def _by_seqs(self, request: ChangeRequest | ExtendRequest, seqs: np.ndarray) -> int:
        """Seqs to their partitions, each a request to its table, all at once; seqs of a
        partition the queue does not have are no lease of it, and ignored."""
        owners = partition_of(seqs)
        count = 1
        if request.queue is not None:  # read afresh only where a seq is past the known count
            count = self.count(request.queue)
            if int(owners.max()) >= count:
                count = self.count(request.queue, fresh=True)
        futures = []
        for partition in np.unique(owners).tolist():
            if partition >= count:
                continue
            mask = owners == partition
            part = copy.copy(request)
            part.seqs = seqs[mask]
            if request.deliveries is not None:
                part.deliveries = request.deliveries[mask]
            store = self.store_of(request.queue or "", partition)
            futures.append(group_of(store.location).submit(part))
        return sum(_results(futures))

    def _everywhere(self, request: ChangeRequest | ExtendRequest) -> int:
        root = group_of(self.store.location).submit(request)
        if request.queue is not None:
            queues = {request.queue: self.count(request.queue)}
        else:
            snapshot = self.store.snapshot()
            queues = self.partitioned(snapshot.states) if snapshot is not None else {}
        futures = [root]
        for queue, count in queues.items():
            for partition in range(1, count):
                part = copy.copy(request)
                futures.append(group_of(self.store_of(queue, partition).location).submit(part))
        return sum(_results(futures))

    # -- the whole queue -------------------------------------------------------------------

    def stats(self, queue: str, root: Snapshot) -> list[QueueStats]:
        """Each partition's stats, partition 0 first (``root``: the root in the present)."""
        return [table_stats(self.store, queue, root)] + [
            table_stats(self.store_of(queue, k), queue)
            for k in range(1, partitions_in(root, queue))
        ]

    def peek(self, queue: str, root: Snapshot, limit: int) -> pa.Table:
        """Up to ``limit`` ready messages of ``queue`` over its partitions: by priority,
        then by when they were enqueued (each partition's own order within)."""
        found = []
        for partition in range(partitions_in(root, queue)):
            store = self.store_of(queue, partition)
            snapshot = root if partition == 0 else store.snapshot()
            if snapshot is None:
                raise TableNotFoundError(store.uri)
            require_queue(snapshot.states, queue, store.uri)
            found.append(peek_rows(store, snapshot, queue, limit))
        if len(found) == 1:  # one table's own delivery order
            return found[0]
        merged = pa.concat_tables(found)
        order = merged.sort_by(
            [("priority", "descending"), ("enqueued_at", "ascending"), ("seq", "ascending")]
        )
        return order.slice(0, limit)

    def purge(self, queue: str, count: int, progress: Progress) -> int:
        """Purge every partition of ``queue`` (a commit each)."""
        return sum(purge_table(self.store_of(queue, k), queue, progress) for k in range(count))


def purge_table(
    store: QueueStore, queue: str, progress: Progress, policies: Policies | None = None
) -> int:
    """One table's purge of ``queue`` (``QueueTable.purge``)."""

    def work(transaction: QueueTransaction) -> int:
        snapshot = transaction.snapshot
        require_queue(snapshot.states, queue, store.uri)
        seqs = purgeable_seqs(store, snapshot, queue, transaction.now, progress)
        count = transaction.purge(queue, seqs)
        progress(f"purging queue {queue}: committing {count} removals")
        transaction.commit(operation=CommitOperation.PURGE.on(queue))
        return count

    return run(store, work, create=False, policies=policies)


def _results(futures: list[Future[T]]) -> list[T]:
    """Every future's result once all are done; the first error raised after."""
    for future in futures:
        future.exception()
    return [future.result() for future in futures]
