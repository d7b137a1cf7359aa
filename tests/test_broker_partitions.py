"""Several brokers on one partitioned queue (docs/BROKER.md "Several brokers"): real broker
processes; each partition's calls go to the broker rendezvous hashing gives it, and a
broker killed mid-stream hands its partitions over with nothing lost."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from spark_queue import CommitConflictError, QueueTable
from spark_queue.broker.auth import token_key
from spark_queue.broker.client import DISCOVERY_SECONDS, wire_request
from spark_queue.broker.discovery import (
    HEARTBEAT_SECONDS,
    STALE_FLOOR_SECONDS,
    BrokerRecord,
    write_record,
)
from spark_queue.errors import BrokerRequestError, PartitionedQueueError
from spark_queue.model.assignment import keyless_partitions, partition_owner
from spark_queue.model.partition_turns import PUBLISH_ROUNDS
from spark_queue.model.partitions import key_partition, partition_of
from spark_queue.rules import identity_holds
from spark_queue.server.ownership import OwnedPartitions
from spark_queue.storage.location import Location
from tests.brokers import BrokerProcess, wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 4
# Long enough that no lease runs out on a client that holds it, on a loaded machine too; short
# enough that a delivery the kill lost comes back within the test.
LEASE_PERIOD = "12 seconds"


def split_queue(ids: list[str]) -> tuple[str, dict[int, str]]:
    """The first queue name ``jobs-<n>`` whose partitions both brokers share (broker ids
    are random: the name, not the ids, is chosen), and who owns each partition."""
    for n in range(1000):
        queue = f"jobs-{n}"
        owners = {k: partition_owner(queue, k, ids) for k in range(PARTITIONS)}
        if set(owners.values()) == set(ids):
            return queue, owners  # type: ignore[return-value]
    raise AssertionError("no queue name splits the partitions")


def start_two(path: str, tmp_path: Path) -> tuple[BrokerProcess, BrokerProcess]:
    first = BrokerProcess(path, log_path=tmp_path / "first.log")
    second = BrokerProcess(path, log_path=tmp_path / "second.log")
    return first, second


def test_each_partition_s_calls_go_to_its_broker_and_a_plain_queue_to_the_first(tmp_path):
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").declare("plain")
    first, second = start_two(path, tmp_path)
    with first, second:
        brokers = {first.id: first, second.id: second}
        queue, owners = split_queue(list(brokers))
        QueueTable(path, broker="off").declare(queue, partitions=PARTITIONS)
        table = QueueTable(path)
        wait_until(lambda: len(table.router.live()) == 2, what="both brokers seen")
        # One-message publishes of keys that reach every partition, each key's to its
        # partition's broker.
        keys = [
            next(f"k{n}" for n in range(1000) if key_partition(f"k{n}", PARTITIONS) == k)
            for k in range(PARTITIONS)
        ]
        sent = PARTITIONS * PUBLISH_ROUNDS
        rows = [{"body": f"m{i}", "key": keys[i % PARTITIONS]} for i in range(sent)]
        seqs = [table.publish(queue, [row]).seqs[0] for row in rows]
        counts = Counter(partition_of(seqs).tolist())
        assert counts == dict.fromkeys(range(PARTITIONS), PUBLISH_ROUNDS)
        leased = table.lease(queue, "w", max_messages=100)  # asks each partition once
        assert sorted(leased["body"].to_pylist()) == sorted(f"m{i}".encode() for i in range(sent))
        assert table.ack(queue, leased["seq"].to_pylist(), "w") == sent  # one ack a partition
        for broker_id, broker in brokers.items():
            mine = [k for k, owner in owners.items() if owner == broker_id]
            status = broker.status()
            # Its partitions' publishes and a lease on each, through it alone.
            served = {str(k): PUBLISH_ROUNDS + 1 for k in mine}
            assert status["partitions_served"] == {queue: served}
            # and an ack of each partition's seqs
            assert status["served"] == (PUBLISH_ROUNDS + 2) * len(mine)
        assert all(table.stats(queue)[n] == 0 for n in ("ready", "leased"))
        # A call of rows without a key goes whole to one broker (the owner of the client's
        # turn's partition), which places them by its own turn; the client's turn moves on
        # by one a call, so its calls reach each broker as often as it owns partitions.
        before = {b.id: b.status()["served"] for b in (first, second)}
        for i in range(sent):
            table.publish(queue, [f"free{i}"])
        for broker_id, broker in brokers.items():
            mine = sum(owner == broker_id for owner in owners.values())
            grown = broker.status()["served"] - before[broker_id]
            assert grown == mine * sent // PARTITIONS
        assert table.stats(queue)["ready"] == sent
        # A queue without partitions goes to the first broker started, as with one broker.
        before = {b.id: b.status()["served"] for b in (first, second)}
        table.publish("plain", ["x"])
        assert first.status()["served"] == before[first.id] + 1
        assert second.status()["served"] == before[second.id]


def test_a_broker_places_keyless_rows_in_its_own_partitions_until_its_peer_leaves(tmp_path):
    path = str(tmp_path / "queues")
    first, second = start_two(path, tmp_path)
    with first, second:
        queue, owners = split_queue([first.id, second.id])
        mine = {k for k, owner in owners.items() if owner == first.id}
        QueueTable(path, broker="off").declare(queue, partitions=PARTITIONS)
        table = QueueTable(path, broker=first.address)  # every call at the first broker
        # Enough commits for a turn over every partition to reach them all.
        calls = PARTITIONS * PUBLISH_ROUNDS + 1
        seqs = [table.publish(queue, [f"m{i}"]).seqs[0] for i in range(calls)]
        assert set(partition_of(seqs).tolist()) <= mine
        # The second stops (its record goes): its partitions join the first's turn once
        # the first looks the brokers up again (a never-ending cache would time out here).
        assert second.stop() == 0
        landed: set[int] = set()

        def every_partition_reached() -> bool:
            landed.update(partition_of(table.publish(queue, ["more"]).seqs).tolist())
            return landed == set(range(PARTITIONS))

        wait_until(every_partition_reached, timeout=60, what="keyless rows in every partition")


def test_a_broker_counts_the_brokers_its_clients_trust_in_its_keyless_places(tmp_path):
    """A token broker's places (:class:`OwnedPartitions`) count the live records signed
    with its token, itself among them: an unsigned record (forged) or a stale one takes
    none of its partitions; a signed one that appears counts from the next lookup."""
    location = Location.of(str(tmp_path / "queues"))
    key = token_key("a token of the brokers")
    now = time.time()

    def record(broker_id: str, heartbeat_at: float = now) -> BrokerRecord:
        return BrokerRecord(
            broker_id, "127.0.0.1:1", location.uri, 1, socket.gethostname(), now - 1,
            heartbeat_at, 2.0, True, 2**20,
        )  # fmt: skip

    ids = ["own", "peer", "forged", "stale"]
    queue = next(
        f"q{n}" for n in range(1000)
        if {partition_owner(f"q{n}", k, ids) for k in range(8)} == set(ids)
    )  # fmt: skip
    write_record(location, record("own").signed(key))
    write_record(location, record("forged"))
    write_record(location, record("stale", now - 60).signed(key))
    places = OwnedPartitions(location, "own", key)
    alone = keyless_partitions(queue, 8, "own", ["own"])
    assert places(queue, 8) == alone == list(range(8))
    write_record(location, record("peer").signed(key))
    assert places(queue, 8) == alone  # until the next lookup
    time.sleep(DISCOVERY_SECONDS + 0.1)
    shared = places(queue, 8)
    assert shared == keyless_partitions(queue, 8, "own", ["own", "peer"]) != alone


def test_a_broker_answers_for_a_partition_of_a_publish_or_lease_only(tmp_path):
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").declare("jobs", partitions=PARTITIONS)
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        client = broker.client()
        before = QueueTable(path, broker="off").partition_stats("jobs")

        def call(method: str, arguments: dict, partition: int):
            return client.call(method, *wire_request(path, method, arguments, partition))

        with pytest.raises(PartitionedQueueError, match="has partitions=4: it has no partition 7"):
            call("publish", {"queue": "jobs", "rows": ["a"]}, 7)
        with pytest.raises(BrokerRequestError, match="'partition' names a partition"):
            call("ack", {"queue": "jobs", "seqs": [0]}, 1)
        assert QueueTable(path, broker="off").partition_stats("jobs") == before
        outcome = call("publish", {"queue": "jobs", "rows": ["a", "b"]}, 2)
        assert partition_of(outcome.result.seqs).tolist() == [2, 2]
        leased = call("lease", {"queue": "jobs", "consumer": "w"}, 1)
        assert leased.num_rows == 0  # partition 1 only: the messages are in 2
        assert call("lease", {"queue": "jobs", "consumer": "w"}, 2).num_rows == 2


def test_a_killed_broker_s_partitions_move_and_nothing_is_lost(tmp_path, seed):
    """SIGKILL of one of two brokers while 2 publishers and 2 consumers (threads of one
    client) run through both: its partitions go to the other at once for this client (the
    first call that finds it gone skips it), and for every client once its record is stale;
    every answered publish is delivered and acked. What the kill may double: a publish in
    flight at it (its commit landed, its answer lost: run again here), at most one a
    publisher; a lease in flight at it leaves its messages leased until the lease runs out,
    then delivered again (a second delivery the client sees once), at most one lease's
    messages a consumer."""
    rng = random.Random(seed)
    kill_after = rng.randrange(10, 40)
    print(f"killing the second broker after {kill_after} acks")
    path = str(tmp_path / "queues")
    first, second = start_two(path, tmp_path)
    publishers, consumers, lease_messages = 2, 2, 5
    with first, second:
        queue, owners = split_queue([first.id, second.id])
        moved = [k for k, owner in owners.items() if owner == second.id]
        QueueTable(path, broker="off").declare(queue, partitions=PARTITIONS)
        table = QueueTable(path)
        wait_until(lambda: len(table.router.live()) == 2, what="both brokers seen")
        stop_publishing, stop_consuming = threading.Event(), threading.Event()
        published: list[tuple[str, int]] = []  # body, seq
        delivered: list[tuple[int, str, int]] = []  # seq, body, delivery count
        acks = [0]
        errors: list[BaseException] = []

        def retried(call, *args, **kwargs):
            while True:
                try:
                    return call(*args, **kwargs)
                except CommitConflictError:
                    continue

        def publish(name: str) -> None:
            n = 0
            while not stop_publishing.is_set():
                body = f"{name}-{n}"
                seqs = retried(table.publish, queue, [body]).seqs
                published.append((body, seqs[0]))
                n += 1

        def consume(name: str) -> None:
            while True:
                leased = retried(
                    table.lease, queue, name, max_messages=lease_messages, lease_period=LEASE_PERIOD
                )
                if not leased.num_rows:
                    if stop_consuming.is_set():
                        return
                    time.sleep(0.02)
                    continue
                rows = zip(
                    leased["seq"].to_pylist(),
                    leased["body"].to_pylist(),
                    leased["delivery_count"].to_pylist(),
                    strict=True,
                )
                delivered.extend((seq, body.decode(), count) for seq, body, count in rows)
                seqs = leased["seq"].to_pylist()
                counts = leased["delivery_count"].to_pylist()
                acks[0] += retried(table.ack, queue, seqs, name, deliveries=counts)

        def guarded(target, name):
            def run() -> None:
                try:
                    target(name)
                except BaseException as error:
                    errors.append(error)

            return threading.Thread(target=run, name=name)

        threads = [guarded(publish, f"p{n}") for n in range(publishers)]
        threads += [guarded(consume, f"c{n}") for n in range(consumers)]
        for thread in threads:
            thread.start()
        try:
            wait_until(lambda: acks[0] >= kill_after or errors, what=f"{kill_after} acks")
            assert second.status()["partitions_served"][queue].keys() == {str(k) for k in moved}
            served_before = first.status()["partitions_served"][queue]
            assert served_before.keys() == {str(k) for k in owners if k not in moved}
            second.kill()
            killed_at = time.monotonic()
            # This client moves them at once: the first call that finds the broker gone
            # skips it, and its calls all go to the first broker, long before the killed
            # one's record goes stale; that broker places keyless rows in the killed one's
            # partitions once it sees the record stale too.
            wait_until(
                lambda: [r.id for r in table.router.live()] == [first.id],
                what="this client skipping the killed broker",
            )
            # Before its record can be stale (its last heartbeat at most HEARTBEAT_SECONDS
            # before the kill): what moved this client is the call that found it gone.
            assert time.monotonic() - killed_at < STALE_FLOOR_SECONDS - HEARTBEAT_SECONDS
            served, since = first.status()["served"], len(published)
            wait_until(
                lambda: (
                    set(moved) <= set(partition_of([q for _, q in published[since:]]).tolist())
                    and first.status()["served"] > served
                ),
                what="publishes to the moved partitions through the first broker",
            )
            # Every client moves them once the record is stale: within the documented bound
            # (staleness after the last heartbeat, plus a client's lookup interval).
            fresh = QueueTable(path)
            wait_until(
                lambda: [r.id for r in fresh.router.live()] == [first.id],
                what="the killed broker's record stale",
            )
            assert time.monotonic() - killed_at <= STALE_FLOOR_SECONDS + DISCOVERY_SECONDS + 1
        finally:
            stop_publishing.set()
            for thread in threads[:publishers]:
                thread.join(timeout=120)

        def drained() -> bool:
            stats = table.stats(queue)
            held = stats["ready"] + stats["leased"] + stats["scheduled"]
            # (Not the acks counted: an ack whose answer the kill lost ran again here,
            # ending nothing.)
            return bool(errors) or held == 0

        wait_until(drained, what="every message acked")
        stop_consuming.set()
        for thread in threads[publishers:]:
            thread.join(timeout=120)
        assert errors == []
        assert first.stop() == 0
    bodies = Counter(body for _, body, _ in delivered)
    lost = {body for body, _ in published} - set(bodies)
    assert not lost, f"lost {sorted(lost)[:10]}"
    seqs_of: dict[str, set[int]] = {}
    for seq, body, _ in delivered:
        seqs_of.setdefault(body, set()).add(seq)
    doubled = [body for body, seqs in seqs_of.items() if len(seqs) > 1]  # stored twice
    assert len(doubled) <= publishers, doubled
    seen = Counter(seq for seq, _, _ in delivered)
    assert [seq for seq, n in seen.items() if n > 1] == []  # no lease ran out on a client
    again = [seq for seq, _, count in delivered if count > 1]  # first delivery lost
    assert len(again) <= consumers * lease_messages, again
    stats = QueueTable(path, broker="off").stats(queue)
    assert stats["added"] == stats["acked"] == len(published) + len(doubled)
    assert (stats["ready"], stats["leased"], stats["scheduled"]) == (0, 0, 0)
    assert identity_holds(stats)
