"""Where a client's leases of a partitioned queue start and where a process's keyless
publishes go (spark_queue.model.partition_turns): the plain rules, the bound that keeps
every partition a lease's start, and the rules on real tables on a local disk."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import threading
import time

import numpy as np

from spark_queue import QueueTable
from spark_queue.model.partition_turns import (
    LEASE_SLICE,
    PUBLISH_ROUNDS,
    LeaseTurn,
    PublishTurn,
    next_lease_turn,
    next_publish_turn,
    starts_within,
)
from spark_queue.model.partitions import key_partition, partition_of


def key_of(partition: int, count: int) -> str:
    """A key whose messages go to ``partition`` of ``count``."""
    return next(f"k{i}" for i in range(10_000) if key_partition(f"k{i}", count) == partition)


def leased_partition(table: QueueTable, queue: str = "q") -> int:
    """The partition of a one-message lease's message (acked: the backlog stays as it was
    but for it)."""
    seq = table.lease(queue, "c", max_messages=1)["seq"][0].as_py()
    table.ack(queue, [seq], "c")
    return int(partition_of(np.array([seq]))[0])


# -- the rules ----------------------------------------------------------------------------------


def test_a_lease_turn_stays_while_its_partition_fills_and_wins():
    rng = random.Random(0)
    turn = LeaseTurn(5)
    for taken in range(1, 4):
        turn = next_lease_turn(turn, 8, filled=True, raced=False, rng=rng)
        assert turn == LeaseTurn(5, taken)
    assert next_lease_turn(turn, 8, filled=False, raced=False, rng=rng) == LeaseTurn(6)


def test_a_lease_turn_moves_on_after_its_slice():
    turn = LeaseTurn(3, LEASE_SLICE - 2)
    turn = next_lease_turn(turn, 4, filled=True, raced=False, rng=random.Random(0))
    assert turn == LeaseTurn(3, LEASE_SLICE - 1)
    assert next_lease_turn(turn, 4, True, False, random.Random(0)) == LeaseTurn(4)


def test_a_lease_that_lost_a_race_goes_to_another_partition(seed):
    """The loser of two clients that met goes elsewhere, to a partition drawn at random
    (two losers at one partition go apart rather than on in step)."""
    rng = random.Random(seed)
    for count in (2, 3, 8):
        start = rng.randrange(100)
        seen = {
            next_lease_turn(LeaseTurn(start, 4), count, filled, True, rng).start % count
            for filled in (True, False)
            for _ in range(200)
        }
        assert start % count not in seen
        assert len(seen) == count - 1  # every other partition, at random


def test_every_partition_is_a_start_within_the_bound(seed):
    """A model of one client's leases whatever each partition gives (filled or not, at
    random, a partition often dry or never): of every run of ``starts_within(N)`` leases in
    a row, one starts at each partition, so no partition waits longer than that for it."""
    rng = random.Random(seed)
    for _ in range(200):
        count = rng.randrange(1, 9)
        slice = rng.randrange(1, 6)
        fills = [rng.random() for _ in range(count)]  # how often each partition fills
        turn = LeaseTurn(rng.randrange(100), rng.randrange(slice))
        starts = []
        for _ in range(starts_within(count, slice) * 5):
            starts.append(turn.start % count)
            filled = rng.random() < fills[turn.start % count]
            turn = next_lease_turn(turn, count, filled, False, rng, slice)
        bound = starts_within(count, slice)
        for first in range(len(starts) - bound + 1):
            assert set(starts[first : first + bound]) == set(range(count)), (count, slice)


def test_a_publish_turn_moves_on_after_its_rounds_or_elsewhere_after_a_lost_race(seed):
    """Each commit counts once, however many callers of its round tell of it."""
    rng = random.Random(seed)
    turn = PublishTurn(6)
    for version in range(10, 10 + PUBLISH_ROUNDS - 1):
        turn = next_publish_turn(turn, 4, version, False, rng)
        assert next_publish_turn(turn, 4, version, False, rng) == turn  # told again
        assert turn.start == 6
    assert next_publish_turn(turn, 4, 99, False, rng) == PublishTurn(7)
    jumps = {next_publish_turn(turn, 4, 99, True, rng).start % 4 for _ in range(200)}
    assert jumps == {0, 1, 3}
    assert next_publish_turn(PublishTurn(6, PUBLISH_ROUNDS - 1), 1, 5, True, rng).start == 7


# -- on tables ----------------------------------------------------------------------------------


def test_leases_stay_on_a_partition_while_it_fills_then_move_on(tmp_path):
    """One client's one-message leases stay on the partition they start at while it has
    messages, then the next partitions' turn comes, the dry one left."""
    table = QueueTable(tmp_path / "queues")
    table.declare("q", partitions=4)
    for partition in range(4):
        table.publish("q", [{"body": b"m", "key": key_of(partition, 4)}] * 5)
    taken = [leased_partition(table) for _ in range(20)]
    runs = [taken[i] for i in range(20) if i == 0 or taken[i] != taken[i - 1]]
    assert len(runs) == 4 and sorted(runs) == [0, 1, 2, 3], taken
    assert all((b - a) % 4 == 1 for a, b in itertools.pairwise(runs)), taken


def test_leases_reach_every_partition_within_the_bound(tmp_path, seed):
    """No partition is starved by one client on a queue whose every partition always has
    messages: its leases stay a slice on each partition, and every run of
    ``starts_within(N)`` one-message leases takes from all N."""
    rng = random.Random(seed)
    count = rng.choice([2, 3])
    table = QueueTable(tmp_path / "queues")
    table.declare("q", partitions=count)
    bound = starts_within(count)
    for partition in range(count):
        table.publish("q", [{"body": b"m", "key": key_of(partition, count)}] * (2 * bound))
    taken = [leased_partition(table) for _ in range(2 * bound)]
    for first in range(0, bound + 1, 7):
        assert set(taken[first : first + bound]) == set(range(count))
    assert len(set(taken[:LEASE_SLICE])) == 1  # the first slice on one partition


# Another process commits to the partition this one leases from, all the time.
WRITER = """
import sys, time
from spark_queue import QueueTable
table = QueueTable(sys.argv[1], broker="off")
print("ready", flush=True)
stop = time.time() + 20
while time.time() < stop:
    table.publish("q", [{"body": b"w", "key": sys.argv[2]}])
"""


def test_a_lease_that_loses_a_race_leaves_the_partition(tmp_path):
    """Where another writer commits to the partition between a client's leases, the lease's
    commit loses a race, and the next lease starts elsewhere."""
    path = tmp_path / "queues"
    table = QueueTable(path)
    table.declare("q", partitions=2)
    for partition in range(2):
        table.publish("q", [{"body": b"m", "key": key_of(partition, 2)}] * 50)
    start = leased_partition(table)
    assert leased_partition(table) == start  # alone: it stays
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), key_of(start, 2)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        while table.stats("q")["added"] == 100:  # until the writer commits
            time.sleep(0.05)
        taken = [leased_partition(table) for _ in range(30)]
    finally:
        writer.kill()
        writer.wait()
    assert 1 - start in taken, taken


def test_keyless_publishes_of_one_process_share_a_turn(tmp_path):
    """Every table and thread of a process publishes without a key to one partition for
    ``PUBLISH_ROUNDS`` commits there, then to the next: a process's tables made one after
    the other go on from where the one before left, and calls made together ride one
    partition."""
    path = tmp_path / "queues"
    QueueTable(path).declare("q", partitions=8)
    firsts = [QueueTable(path).publish("q", [b"m"]).seqs[0] for _ in range(3 * PUBLISH_ROUNDS)]
    parts = partition_of(np.array(firsts)).tolist()
    runs = [parts[i : i + PUBLISH_ROUNDS] for i in range(0, len(parts), PUBLISH_ROUNDS)]
    assert all(len(set(run)) == 1 for run in runs), parts
    assert all((b[0] - a[0]) % 8 == 1 for a, b in itertools.pairwise(runs)), parts

    tables = [QueueTable(path) for _ in range(8)]
    go = threading.Barrier(8)
    seqs: list[int] = []

    def publish(table: QueueTable) -> None:
        go.wait()
        seqs.extend(table.publish("q", [b"t"] * 2).seqs)

    threads = [threading.Thread(target=publish, args=(t,)) for t in tables]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(partition_of(np.array(seqs)).tolist())) < 8  # shared rounds


def test_a_consumer_keeps_the_partition_it_leases_from(tmp_path):
    """A ``Consumer`` leases through its table: while its partition fills its leases, the
    messages it receives come from that partition alone."""
    table = QueueTable(tmp_path / "queues")
    table.declare("q", partitions=4)
    for partition in range(4):
        table.publish("q", [{"body": b"m", "key": key_of(partition, 4)}] * 200)
    got: list[int] = []
    with table.consumer("q", "c", max_prefetch=20) as consumer:
        while len(got) < 100:
            batch = consumer.receive(10, wait_time="5s")
            assert batch
            for message in batch:
                message.ack()
            got += [message.seq for message in batch]
    assert len(set(partition_of(np.array(got)).tolist())) == 1
