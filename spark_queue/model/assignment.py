"""Which broker serves which partition of a partitioned queue: rendezvous (highest random
weight) hashing over the live brokers of a table (docs/BROKER.md "Several brokers").

Partition ``k`` of queue ``q`` belongs to the broker whose id gives the highest
:func:`weight` of ``(q, k, id)``. Every client that sees the same live brokers picks the
same owner, with no coordination and nothing stored; when a broker leaves, only the
partitions it owned move (each to the broker next in its :func:`rendezvous_order`), and
when one joins, only the partitions it now outweighs move to it.

The assignment gathers a partition's small calls at one broker, whose group commit then
batches them; correctness never rests on it: two brokers that serve one partition at once
only race for its commits, which are optimistic.

Pure functions; safe from any thread.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(queue: str, partition: int, broker: str) -> int:
    """The stable weight of ``broker`` (its id) for ``queue``'s partition ``partition``:
    64 bits of BLAKE2b over the three, the same in every process and on every machine."""
    text = f"{queue}\x00{partition}\x00{broker}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def rendezvous_order(queue: str, partition: int, brokers: Iterable[str]) -> list[str]:
    """``brokers`` (ids) from the owner of ``queue``'s partition ``partition`` down: the
    order in which they take it over as those before them leave. Ties (equal weights, or an
    id given twice) are broken by id."""
    return sorted(set(brokers), key=lambda b: (-weight(queue, partition, b), b))


def partition_owner(queue: str, partition: int, brokers: Iterable[str]) -> str | None:
    """The broker (id) of ``brokers`` that serves ``queue``'s partition ``partition``;
    None where there is none."""
    order = rendezvous_order(queue, partition, brokers)
    return order[0] if order else None


def keyless_partitions(queue: str, count: int, broker: str, brokers: Iterable[str]) -> list[int]:
    """Where ``broker`` places the rows of ``queue`` (of ``count`` partitions) free to go
    to any partition: the partitions it owns among ``brokers`` and itself, so that no two
    brokers commit keyless rounds to one partition table; every partition where it owns
    none (more brokers than partitions, or clients that still see another set of brokers:
    its calls are few, and a race for a table's commits costs a retry, nothing more)."""
    ids = {*brokers, broker}
    owned = [k for k in range(count) if partition_owner(queue, k, ids) == broker]
    return owned or list(range(count))
