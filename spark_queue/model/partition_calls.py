"""A call on a partitioned queue split into its partitions' shares and put back together,
wherever the shares run: each in its partition table's group commit
(:mod:`spark_queue.partitioned`), or each at the broker that serves its partition
(:mod:`spark_queue.broker.spread`).

- :func:`one_partition` scopes the ``publish`` and ``lease`` calls made in its block to one
  partition of their queue: a share sent to a partition's broker runs there in it, and a
  share a client runs itself (its broker unreachable) runs here in it. A context variable,
  not an argument, so that ``QueueTable``'s signatures stay the user's.
- :func:`lease_in_turn` is how a lease spreads over partitions, :func:`merged_outcome` how
  a publish's shares answer as one.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.model.results import PublishOutcome, PublishResult
from spark_queue.model.schema import LEASE_VERSION_KEY, LEASE_VERSIONS_KEY

_SCOPE: ContextVar[int | None] = ContextVar("spark_queue_partition_scope", default=None)

# A share of a lease: partition, messages and body bytes still wanted -> the partition's
# messages and the version of its table the lease planned on.
LeaseShare = Callable[[int, int | None, int | None], tuple[pa.Table, int | None]]


@contextlib.contextmanager
def one_partition(partition: int) -> Iterator[None]:
    """Within the block, a ``publish`` to a partitioned queue puts every row in partition
    ``partition``, and a ``lease`` takes from that partition only (this thread's calls)."""
    token = _SCOPE.set(partition)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def scoped_partition() -> int | None:
    """The partition :func:`one_partition` scopes this thread's calls to; None: none."""
    return _SCOPE.get()


def lease_in_turn(
    count: int,
    order: Sequence[int],
    max_messages: int | None,
    max_bytes: int | None,
    lease_share: LeaseShare,
) -> pa.Table:
    """A lease over the partitions of ``order`` (of a queue of ``count``), one after the
    other, each asked for what the ones before left of ``max_messages`` and ``max_bytes``;
    the first is asked even for none (a lease of 0 settles). The schema's metadata holds
    each partition's version the lease planned on (:data:`LEASE_VERSIONS_KEY`, None where
    it was not asked), where an idle consumer watches for commits."""
    found: list[pa.Table] = []
    versions: list[int | None] = [None] * count
    messages, body_bytes = max_messages, max_bytes
    for step, partition in enumerate(order):
        if step and (messages == 0 or (body_bytes is not None and body_bytes <= 0)):
            break
        rows, version = lease_share(partition, messages, body_bytes)
        versions[partition] = version
        found.append(rows.replace_schema_metadata(None))
        if messages is not None:
            messages -= rows.num_rows
        if body_bytes is not None and rows.num_rows:
            body_bytes -= int(pc.sum(pc.binary_length(rows["body"])).as_py())
    leased = pa.concat_tables(found)
    metadata = {LEASE_VERSIONS_KEY: json.dumps(versions).encode()}
    if versions[0] is not None:
        metadata[LEASE_VERSION_KEY] = str(versions[0]).encode()
    return leased.replace_schema_metadata(metadata)


def lease_version(rows: pa.Table, partition: int) -> int | None:
    """The version of partition ``partition``'s table a lease of it planned on, from its
    answer's metadata (:func:`lease_in_turn`'s, or a lease of a queue of one partition)."""
    metadata = rows.schema.metadata or {}
    if LEASE_VERSIONS_KEY in metadata:
        versions = json.loads(metadata[LEASE_VERSIONS_KEY])
        if partition < len(versions):
            return None if versions[partition] is None else int(versions[partition])
    if partition == 0 and LEASE_VERSION_KEY in metadata:
        return int(metadata[LEASE_VERSION_KEY])
    return None


def merged_outcome(
    queue: str, rows: int, shares: Sequence[tuple[np.ndarray, PublishOutcome]]
) -> PublishOutcome:
    """The answer of a publish of ``rows`` rows to ``queue`` whose shares went to
    partitions apart: each share's row positions (in the order given) and its outcome. The
    seqs in the order given, the counts added up; ``version`` is the commit's version where
    one partition was written, else None (several tables' versions)."""
    accepted = np.zeros(rows, dtype=bool)
    seqs = np.zeros(rows, dtype=np.int64)
    for at, outcome in shares:
        accepted[at] = outcome.accepted
        seqs[at[outcome.accepted]] = outcome.result.seqs
    results = [outcome.result for _, outcome in shares]
    versions = {r.version for r in results if r.version is not None}
    result = PublishResult(
        queue,
        seqs[accepted].tolist(),
        sum(r.rejected for r in results),
        sum(r.evicted for r in results),
        sum(r.dead_lettered for r in results),
        duplicate=all(r.duplicate for r in results),
        version=versions.pop() if len(results) == 1 and versions else None,
        attempts=max(r.attempts for r in results),
        duplicates=sum(r.duplicates for r in results),
    )
    return PublishOutcome(result, accepted)
