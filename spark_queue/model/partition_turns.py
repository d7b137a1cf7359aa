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
  lease's start within ``partitions * LEASE_SLICE`` leases in a row of a client that loses
  no race (:func:`starts_within`), whatever the partitions give: none waits behind another
  longer (a client that loses races moves sooner, and another client holds the partition).
- :func:`next_publish_turn`: a process's keyless publishes go to one partition for
  :data:`PUBLISH_ROUNDS` of its commits, then to the next, and at once to another
  partition at random where a commit there lost a race: two processes that met there go
  apart rather than on in step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

LEASE_SLICE = 32
"""The most leases in a row of one client that start from one partition: then the next
partition's turn comes (so with fewer clients than partitions none is left behind)."""

PUBLISH_ROUNDS = 8
"""A process's keyless publishes go to one partition for this many of its commits there,
then to the next: its callers that come back from a round at different moments split
into smaller rounds only where the turn moves."""


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
    """The bound :func:`next_lease_turn` keeps: of any run of this many leases in a row of
    a client that loses no race, one starts at each of ``partitions`` partitions."""
    return partitions * slice


@dataclass(frozen=True)
class PublishTurn:
    """Where a process's keyless publishes go: ``start`` (modulo the partitions), how many
    of its commits landed there (``rounds``), and the version of the last one counted."""

    start: int
    rounds: int = 0
    version: int = -1


def next_publish_turn(
    turn: PublishTurn,
    partitions: int,
    version: int,
    raced: bool,
    rng: random.Random,
    rounds: int = PUBLISH_ROUNDS,
) -> PublishTurn:
    """A process's keyless publish turn after its commit of ``version`` at ``turn`` landed
    (each caller of a round tells of the same one: counted once): after ``rounds`` of them,
    the next partition; at once, another one at random where the commit lost a race."""
    if raced and partitions > 1:
        return PublishTurn(turn.start + rng.randrange(1, partitions))
    if version <= turn.version:
        return turn
    if turn.rounds + 1 < rounds:
        return PublishTurn(turn.start, turn.rounds + 1, version)
    return PublishTurn(turn.start + 1)
