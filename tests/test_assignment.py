"""Which broker serves which partition (docs/BROKER.md "Several brokers"): rendezvous
hashing over broker ids, as plain functions, without processes."""

from __future__ import annotations

import hashlib
import random
import uuid
from collections import Counter

from spark_queue.model.assignment import (
    keyless_partitions,
    partition_owner,
    rendezvous_order,
    weight,
)


def broker_ids(rng: random.Random, count: int) -> list[str]:
    """Ids as brokers make them (16 hex digits of a UUID)."""
    return [uuid.UUID(int=rng.getrandbits(128)).hex[:16] for _ in range(count)]


def owners(queue: str, partitions: int, brokers: list[str]) -> dict[int, str | None]:
    return {k: partition_owner(queue, k, brokers) for k in range(partitions)}


def test_the_owner_is_stable_and_independent_of_the_order_brokers_are_listed_in():
    brokers = ["b1", "b2", "b3"]
    first = owners("orders", 16, brokers)
    assert owners("orders", 16, list(reversed(brokers))) == first
    assert owners("orders", 16, [*brokers, "b2"]) == first  # an id listed twice
    assert partition_owner("orders", 0, []) is None
    assert rendezvous_order("orders", 3, brokers)[0] == first[3]


def test_the_weight_is_blake2b_so_every_process_agrees():
    """BLAKE2b of the three, not Python's ``hash`` (salted per process): every client of a
    table computes the same owners."""
    assert weight("orders", 0, "b1") == int.from_bytes(
        hashlib.blake2b(b"orders\x000\x00b1", digest_size=8).digest(), "big"
    )
    assert weight("orders", 1, "b1") != weight("orders", 0, "b1")
    assert weight("orders", 0, "b1") != weight("orders", 0, "b2")


def test_when_a_broker_leaves_only_its_partitions_move_each_to_the_next_in_order(seed):
    rng = random.Random(seed)
    for _ in range(50):
        brokers = broker_ids(rng, rng.randint(2, 6))
        queue = f"q{rng.randrange(1000)}"
        partitions = rng.randint(1, 64)
        before = owners(queue, partitions, brokers)
        leaving = rng.choice(brokers)
        after = owners(queue, partitions, [b for b in brokers if b != leaving])
        for k in range(partitions):
            if before[k] != leaving:
                assert after[k] == before[k], (queue, k)
            else:
                assert after[k] == rendezvous_order(queue, k, brokers)[1], (queue, k)


def test_when_a_broker_joins_only_the_partitions_it_takes_move(seed):
    rng = random.Random(seed)
    for _ in range(50):
        brokers = broker_ids(rng, rng.randint(1, 5))
        queue = f"q{rng.randrange(1000)}"
        partitions = rng.randint(1, 64)
        joining = broker_ids(rng, 1)[0]
        before = owners(queue, partitions, brokers)
        after = owners(queue, partitions, [*brokers, joining])
        assert all(after[k] in (before[k], joining) for k in range(partitions))


def test_partitions_spread_near_evenly_over_brokers(seed):
    """4,096 partitions (of 64 queues of 64) over 4 brokers: each broker's share is 1,024
    expected, with a standard deviation of ~28; each stays within 12% (~4.4 deviations)."""
    rng = random.Random(seed)
    brokers = broker_ids(rng, 4)
    shares: Counter[str | None] = Counter()
    for q in range(64):
        shares.update(owners(f"queue-{q}-{rng.randrange(10**6)}", 64, brokers).values())
    assert set(shares) == set(brokers)
    assert all(abs(share - 1024) <= 123 for share in shares.values()), shares
    # And two brokers over one queue of 4 partitions, the case of docs/BROKER.md: over many
    # pairs of ids, each broker owns 2 of the 4 on average.
    held = Counter()
    for _ in range(2000):
        pair = broker_ids(rng, 2)
        held.update(owners("orders", 4, pair)[k] == pair[0] for k in range(4))
    assert abs(held[True] - 4000) <= 200, held


def test_each_broker_places_keyless_rows_in_its_own_partitions_or_every_one_if_it_has_none(
    seed,
):
    rng = random.Random(seed)
    brokers = broker_ids(rng, 3)
    # The brokers' places split the partitions between them: no partition is two brokers'.
    places = [keyless_partitions("orders", 16, b, brokers) for b in brokers]
    assert sorted(k for own in places for k in own) == list(range(16))
    for broker, own in zip(brokers, places, strict=True):
        assert own == [k for k, owner in owners("orders", 16, brokers).items() if owner == broker]
        # A broker counts itself among the brokers whether or not the others list it.
        assert keyless_partitions("orders", 16, broker, set(brokers) - {broker}) == own
    # Three brokers on a queue of one partition: the two that own none place them anywhere.
    idle = [b for b in brokers if partition_owner("orders", 0, brokers) != b]
    assert [keyless_partitions("orders", 1, b, brokers) for b in idle] == [[0], [0]]
    lone = broker_ids(rng, 1)[0]
    assert keyless_partitions("orders", 4, lone, []) == [0, 1, 2, 3]
