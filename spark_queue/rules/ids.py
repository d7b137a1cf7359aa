"""De-duplication by message id (SEMANTICS §2 "De-duplication"): which arriving messages
repeat a ``message_id`` their queue recorded within its ``duplicate_window``.

Ids are reduced to 128-bit hashes (two 64-bit lanes), computed column-wise from the Arrow
buffers: no Python object per id. The window is :class:`SeenIds`, sorted runs of hashes with
the time each was recorded, searched with binary searches. Two different ids share a hash
with probability about ``n * m / 2**128`` for a batch of ``n`` against a window of ``m``
(10^-25 for a million against ten million): an accident that would drop a real message is
that unlikely.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

# Odd 64-bit constants of the two lanes (from splitmix64 and murmur3).
_LANES = (
    (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)),
    (np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x94D049BB133111EB)),
)
_FMIX = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))
DIGEST_BYTES = 16  # both lanes
_LARGEST_RUN_FIRST = 2  # runs of similar size merge: a run at most this times the next


def _fmix(values: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finaliser: every input bit reaches every output bit."""
    values = values ^ (values >> np.uint64(33))
    values = values * _FMIX[0]
    values = values ^ (values >> np.uint64(33))
    values = values * _FMIX[1]
    mixed: np.ndarray = values ^ (values >> np.uint64(33))
    return mixed


def _words(data: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """The bytes of equal-length values as little-endian 64-bit words, one row per value,
    zero-padded to a whole word."""
    width = -(-length // 8) * 8
    matrix = np.zeros((len(starts), max(width, 8)), dtype=np.uint8)
    if length:
        if len(starts) > 1 and bool((np.diff(starts) == length).all()):  # contiguous
            first = int(starts[0])
            matrix[:, :length] = data[first : first + len(starts) * length].reshape(-1, length)
        else:
            matrix[:, :length] = data[starts[:, None] + np.arange(length)]
    return matrix.view("<u8")


def id_hashes(ids: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two 64-bit hash lanes per id and a mask of the ids that are set (nulls never match).

    Strings are hashed as their UTF-8 bytes, grouped by length: ids of one length (UUIDs,
    zero-padded numbers) are one matrix of words, folded word by word in both lanes.
    """
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    ids = ids.cast(pa.large_binary())
    count = len(ids)
    valid = ~np.asarray(ids.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    offsets_buffer, data_buffer = ids.buffers()[1], ids.buffers()[2]
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[ids.offset : ids.offset + count + 1]
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0)
    ).astype(np.uint8, copy=False)
    starts, lengths = offsets[:-1], np.diff(offsets)
    lanes = [np.zeros(count, np.uint64), np.zeros(count, np.uint64)]
    with np.errstate(over="ignore"):
        for length in np.unique(lengths[valid]).tolist():
            rows = np.flatnonzero(valid & (lengths == length))
            words = _words(data, starts[rows], int(length))
            for lane, (seed, multiplier) in zip(lanes, _LANES, strict=True):
                folded = np.full(len(rows), seed * np.uint64(length + 1), np.uint64)
                for column in range(words.shape[1]):
                    folded = _fmix(folded ^ (words[:, column] * multiplier)) * seed
                lane[rows] = _fmix(folded)
    return lanes[0], lanes[1], valid


@dataclass(frozen=True)
class SeenRun:
    """Recorded ids, sorted by the first lane: hashes and when each was recorded."""

    first: np.ndarray  # uint64, ascending
    second: np.ndarray  # uint64
    seen_at: np.ndarray  # int64 microseconds

    def __len__(self) -> int:
        return len(self.first)

    @classmethod
    def of(cls, first: np.ndarray, second: np.ndarray, seen_at: np.ndarray) -> SeenRun:
        order = np.argsort(first, kind="stable")
        return cls(first[order], second[order], seen_at[order])

    @classmethod
    def of_ordered(
        cls, first: np.ndarray, second: np.ndarray, seen_at: int, order: np.ndarray
    ) -> SeenRun:
        """The ids at positions ``order`` (in hash order already), recorded at ``seen_at``."""
        return cls(first[order], second[order], np.full(len(order), seen_at, np.int64))

    def digests(self) -> pa.Array:
        """Each id's 128 bits as 16 bytes (both lanes, little-endian): how a ``seen`` file
        stores it, written and read back with no work per id."""
        lanes = np.ascontiguousarray(np.stack([self.first, self.second], axis=1), dtype="<u8")
        fixed = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(DIGEST_BYTES), len(self), [None, pa.py_buffer(lanes.tobytes())]
        )
        return fixed.cast(pa.binary())

    @classmethod
    def of_digests(cls, digests: pa.Array | pa.ChunkedArray, seen_at: np.ndarray) -> SeenRun:
        """The inverse of :meth:`digests`, sorted."""
        if isinstance(digests, pa.ChunkedArray):
            digests = digests.combine_chunks()
        fixed = digests.cast(pa.binary(DIGEST_BYTES))
        data = np.frombuffer(fixed.buffers()[1], dtype="<u8")
        lanes = data[2 * fixed.offset : 2 * (fixed.offset + len(fixed))].reshape(-1, 2)
        return cls.of(lanes[:, 0].astype(np.uint64), lanes[:, 1].astype(np.uint64), seen_at)

    def within(self, since: int) -> SeenRun:
        """The ids recorded at or after ``since``."""
        keep = self.seen_at >= since
        if keep.all():
            return self
        return SeenRun(self.first[keep], self.second[keep], self.seen_at[keep])

    def merged(self, other: SeenRun) -> SeenRun:
        """Both runs as one, sorted: a merge of two sorted runs in linear passes (a sort of
        the two together measured 1 s for eight million)."""
        places = np.searchsorted(self.first, other.first) + np.arange(len(other))
        size = len(self) + len(other)
        theirs = np.zeros(size, dtype=bool)
        theirs[places] = True
        columns = []
        for mine, given in zip(
            (self.first, self.second, self.seen_at),
            (other.first, other.second, other.seen_at),
            strict=True,
        ):
            column = np.empty(size, dtype=mine.dtype)
            column[places] = given
            column[~theirs] = mine
            columns.append(column)
        return SeenRun(*columns)

    def contains(self, first: np.ndarray, second: np.ndarray, since: int) -> np.ndarray:
        """Per hash: whether this run recorded it at or after ``since``."""
        if not len(self) or not len(first):
            return np.zeros(len(first), dtype=bool)
        at = np.searchsorted(self.first, first)
        at[at == len(self)] = 0
        seen: np.ndarray = (
            (self.first[at] == first) & (self.second[at] == second) & (self.seen_at[at] >= since)
        )
        return seen


class SeenIds:
    """A queue's de-duplication window: the ids recorded within it, as a few sorted runs.

    A new run joins at the end, and runs of similar size merge (dropping what fell out of
    the window), so a window of ``m`` ids is searched in ``O(log m)`` runs and each id is
    merged ``O(log m)`` times over its life. Arrays are never changed in place."""

    def __init__(self, runs: list[SeenRun] | None = None) -> None:
        self.runs = list(runs or [])

    def duplicates(
        self, first: np.ndarray, second: np.ndarray, valid: np.ndarray, since: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per arriving id: recorded at or after ``since``, or an earlier arrival of this
        same batch has it (the first occurrence wins). Nulls (``~valid``) never are.

        Returns the mask, and the positions of the set ids in hash order (for
        :meth:`SeenRun.of_ordered`, which then needs no sort of its own)."""
        repeated = np.zeros(len(first), dtype=bool)
        set_ids = np.flatnonzero(valid)
        if not len(set_ids):
            return repeated, set_ids
        # In hash order (stable, so arrivals of one id stay in arrival order): a repeat
        # follows its first occurrence, and the binary searches below walk each run front to
        # back, 30 times faster than searching in arrival order. Ids that share the first
        # lane and differ in the second could interleave; at 2^-64 a pair, that is ignored.
        order = set_ids[np.argsort(first[set_ids], kind="stable")]
        ordered_first, ordered_second = first[order], second[order]
        hit = np.zeros(len(order), dtype=bool)
        hit[1:] = (ordered_first[1:] == ordered_first[:-1]) & (
            ordered_second[1:] == ordered_second[:-1]
        )
        for run in self.runs:
            hit |= run.contains(ordered_first, ordered_second, since)
        repeated[order] = hit
        return repeated, order

    def with_run(self, run: SeenRun, since: int) -> SeenIds:
        """This window plus ``run``, merged where sizes are alike; what was recorded before
        ``since`` is dropped by the merges."""
        runs = [*self.runs, run] if len(run) else list(self.runs)
        while len(runs) > 1 and len(runs[-2]) <= _LARGEST_RUN_FIRST * len(runs[-1]):
            newer, older = runs.pop().within(since), runs.pop().within(since)
            runs.append(older.merged(newer))
        return SeenIds(runs)
