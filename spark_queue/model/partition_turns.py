"""Where a client's next lease of a partitioned queue starts, and where a process's next
keyless publish to it goes: plain rules over what the last call found
(:class:`~spark_queue.partitioned.Partitions` keeps the turns).

A partition table's view is cheap to keep where one client keeps using it (its own commits
keep it current: two requests in a row a commit on object storage) and dear to reach after
a while away (every entry other writers added meanwhile, one read after the other). So a
lease stays on the partition it took from while that partition gives what was asked and
nobody else commits there, and keyless publishes of one process share one partition a
round at a time:

- :func:`next_lease_turn`: a lease starts where the last one did while the partition
  filled it and its commit won at once; it moves on by one where the partition gave fewer
  than asked (the lease took the rest from the next ones), where its commit lost a race
  (another writer is there: of two clients that met, the winner stays and the loser moves),
  and after :data:`LEASE_SLICE` leases in a row on one partition. So every partition is a
  lease's start within ``partitions * LEASE_SLICE`` leases of one client in a row
  (:func:`starts_within`), whatever the partitions give: none waits behind another longer.
- :func:`next_publish_turn`: a keyless publish's partition moves on by one once a commit
  there lands (the next round goes to the next partition), and to another partition at
  random where the commit lost a race: two processes that met there go apart rather than
  on in step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

LEASE_SLICE = 32
"""The most leases in a row of one client that start from one partition: then the next
partition's turn comes (so with fewer clients than partitions none is left behind)."""


@dataclass(frozen=True)
class LeaseTurn:
    """Where a client's next lease starts: ``start`` (taken modulo the partitions, so a
    raised count keeps it), and how many leases in a row started there (``taken``)."""

    start: int
    taken: int = 0


def next_lease_turn(
    turn: LeaseTurn,
    partitions: int,
    filled: bool,
    raced: bool,
    rng: random.Random,
    slice: int = LEASE_SLICE,
) -> LeaseTurn:
    """The turn after a lease that started at ``turn`` (of ``partitions``): ``filled``,
    its first partition gave all it was asked (the lease asked no other); ``raced``, that
    partition's commit lost a race to another writer before it landed."""
    if raced and partitions > 1:
        return LeaseTurn(turn.start + rng.randrange(1, partitions))
    if filled and turn.taken + 1 < slice:
        return LeaseTurn(turn.start, turn.taken + 1)
    return LeaseTurn(turn.start + 1)


def starts_within(partitions: int, slice: int = LEASE_SLICE) -> int:
    """The bound :func:`next_lease_turn` keeps: of any run of this many leases of one
    client in a row, one starts at each of ``partitions`` partitions."""
    return partitions * slice


def next_publish_turn(turn: int, partitions: int, raced: bool, rng: random.Random) -> int:
    """A process's keyless publish turn after a commit at partition ``turn % partitions``
    landed: the next partition, or another one at random where the commit lost a race."""
    if raced and partitions > 1:
        return turn + rng.randrange(1, partitions)
    return turn + 1
