"""A partitioned queue's arithmetic: where its partition tables are, which seqs each
partition numbers its messages with, and which partition a message goes to.

A queue declared with ``partitions=N`` is N queue tables: partition 0 is the queue in the
table it was declared in (the root), partitions 1 to N-1 are queue tables of their own in
the root's hidden folder ``_partitions`` (Delta's readers and vacuums skip folders whose
names begin with ``_``), each holding that one queue. Where they are follows from the root
and the queue's name alone (:func:`partition_folder`); the root's record of the queue holds
the count.

**Seqs are global.** The root table numbers its messages from 0, as every queue table
does; partition ``k >= 1`` numbers from :func:`first_seq` ``(k) = (1023 + k) * 2**52``, so
a seq names its partition, :func:`partition_of` ``(seq) = max(0, (seq >> 52) - 1023)``,
and ``ack``, ``cancel``, ``extend``, receipt handles and every other call that takes seqs
work on the whole queue without translation. The root keeps the seqs below ``2**62``
(:data:`ROOT_SEQ_LIMIT`), as wide a range as a table had before partitions; each partition
table numbers its messages in ``2**52`` (a Spark write's tasks in lanes,
:mod:`spark_queue.model.lanes`).

**Routing** is Kafka's: a message with a ``key`` goes to partition
``(murmur2(utf8(key)) & 0x7fffffff) % N`` (:func:`key_partition`), the partition Kafka's
default partitioner gives the same key, so per-key order holds.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.errors import InvalidOptionError, QueueError

MAX_PARTITIONS = 1024
"""The most partitions a queue may have."""
PARTITIONS_FOLDER = "_partitions"
"""The root table's folder of partition tables (hidden from Delta's readers by its ``_``)."""
PARTITION_SEQ_BITS = 52
"""Each partition ``k >= 1`` numbers its messages within ``2**52`` seqs."""
ROOT_SEQ_LIMIT = 1 << 62
"""The root table's seqs (partition 0's) stay below this."""
_FIRST_BLOCK = ROOT_SEQ_LIMIT >> PARTITION_SEQ_BITS  # 1024: partition 1's block
QUEUE_FOLDER_NAME_CHARS = 64  # of a queue's name in its folder's name (then its digest)


def first_seq(partition: int) -> int:
    """The first seq partition ``partition`` numbers a message with: 0 for the root's
    (its table's own next seq applies), ``(1023 + k) * 2**52`` for partition ``k``."""
    if partition == 0:
        return 0
    return (_FIRST_BLOCK - 1 + partition) << PARTITION_SEQ_BITS


def partition_of(seqs: np.ndarray) -> np.ndarray:
    """The partition of each seq (int64): ``max(0, (seq >> 52) - 1023)``."""
    blocks = np.asarray(seqs, dtype=np.int64) >> PARTITION_SEQ_BITS
    return np.asarray(np.maximum(0, blocks - (_FIRST_BLOCK - 1)), dtype=np.int64)


def partition_folder(queue: str) -> str:
    """The folder, relative to the root table, of ``queue``'s partition tables.

    A queue's name is safe in a path (``A-Z a-z 0-9 _ . -``, never dots alone), but two
    names that differ in case only would share a folder on a case-insensitive file system:
    the folder is the name's first 64 characters, then 16 hex digits of its SHA-256, so
    every queue has its own, of at most 81 characters."""
    digest = hashlib.sha256(queue.encode("utf-8")).hexdigest()[:16]
    return f"{PARTITIONS_FOLDER}/{queue[:QUEUE_FOLDER_NAME_CHARS]}-{digest}"


def partition_path(queue: str, partition: int) -> str:
    """Partition ``partition``'s (>= 1) table, relative to the root table."""
    return f"{partition_folder(queue)}/{partition}"


def partition_uri(root: str, queue: str, partition: int) -> str:
    """The URI (or local path) of ``queue``'s partition ``partition`` (0: ``root``)."""
    if partition == 0:
        return root
    return f"{root.rstrip('/')}/{partition_path(queue, partition)}"


def is_partition_path(relative: str) -> bool:
    """Whether ``relative`` (a path below a table's root) is where a partition table of one
    of its queues is (:func:`partition_path`)."""
    parts = relative.strip("/").split("/")
    return len(parts) == 3 and parts[0] == PARTITIONS_FOLDER and parts[2].isdigit()


def table_partition(uri: str) -> int:
    """The partition a table at ``uri`` keeps: ``k`` where ``uri`` ends in a partition
    table's path (:func:`partition_path`), else 0 (a root table)."""
    tail = uri.rstrip("/").split("/")[-3:]
    return int(tail[-1]) if is_partition_path("/".join(tail)) else 0


def check_seqs_left(uri: str, partition: int, highest: int) -> None:
    """A commit numbering messages up to ``highest`` in the table at ``uri``, which keeps
    ``partition``, is refused where ``highest`` leaves that partition's seqs: a seq must
    name the partition it is in (:func:`partition_of`).

    Raises:
        QueueError: the table's seqs are used up.
    """
    if int(partition_of(np.array([highest]))[0]) != partition:
        end = ROOT_SEQ_LIMIT if partition == 0 else first_seq(partition + 1)
        raise QueueError(
            f"queue table {uri} has used its seqs up: partition {partition}'s seqs end "
            f"below {end}, and this commit numbers a message {highest}; nothing was committed"
        )


def refuse_lowering(queue: str, current: int, given: int | None) -> None:
    """An ``alter`` of ``queue``'s ``partitions`` from ``current`` to ``given`` (None: not
    given) is refused where it lowers them: a partition's messages would have nowhere to go.

    Raises:
        InvalidOptionError: ``given`` is below ``current``.
    """
    if given is not None and given < current:
        raise InvalidOptionError(
            f"queue {queue!r} has partitions={current}: partitions can be raised, never "
            f"lowered; got partitions={given}"
        )


# -- routing -------------------------------------------------------------------------------

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``data`` (``org.apache.kafka.common.utils.Utils.murmur2``,
    seed ``0x9747b28c``), as a signed 32-bit number, as Kafka returns it."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    whole = length - length % 4
    for at in range(0, whole, 4):
        k = int.from_bytes(data[at : at + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def key_partition(key: str, partitions: int) -> int:
    """The partition of a message with ``key`` (Kafka's default partitioner:
    ``toPositive(murmur2(utf8(key))) % partitions``, ``toPositive`` being ``& 0x7fffffff``)."""
    return (murmur2(key.encode("utf-8")) & 0x7FFFFFFF) % partitions


def row_partitions(
    keys: pa.Array | pa.ChunkedArray | None, rows: int, partitions: int, keyless: int
) -> np.ndarray:
    """The partition of each of ``rows`` rows of a queue of ``partitions``: a row with a key
    (``keys``, strings or nulls; None: no row has one) its key's (:func:`key_partition`),
    a row without one ``keyless`` (the caller's sticky or producer's partition)."""
    targets = np.full(rows, keyless, dtype=np.int64)
    if keys is None or keys.null_count == rows:
        return targets
    encoded = pc.dictionary_encode(keys)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    by_key = np.array(
        [key_partition(key, partitions) for key in encoded.dictionary.to_pylist()],
        dtype=np.int64,
    )
    keyed = encoded.indices.is_valid().to_numpy(zero_copy_only=False)
    indices = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)
    targets[keyed] = by_key[indices[keyed]]
    return targets
