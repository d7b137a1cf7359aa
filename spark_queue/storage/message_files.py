"""A snapshot's message files, read for the heads of queue levels: the files' statistics as
arrays (:class:`MessageFiles`), the rows of one level in one row group (:func:`level_rows`),
and :class:`FileHeadReader`, the :class:`spark_queue.rules.HeadReader` over them, through a
:class:`~spark_queue.storage.store.QueueStore` (a :class:`HeadSource`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.rules import HEAD_SCHEMA
from spark_queue.storage.row_cache import DataFile

HEAD_READ = ("queue", "seq", "size", "priority", "deliver_at", "enqueued_at", "expires_at")
FIRST_HEAD_SLICE = 1024  # rows of a level's first slice of a row group (then doubling)


class Listing(Protocol):
    """What :class:`FileHeadReader` reads the files of (a Snapshot)."""

    def message_files(
        self, queue: str, *, priority: int | None = None, from_seq: int = 0
    ) -> pa.Table: ...


class HeadSource(Protocol):
    """What :class:`FileHeadReader` reads through (a QueueStore)."""

    def read_head_rows(
        self, relative: str, size: int | None, queue: str, priority: int, from_seq: int
    ) -> Iterator[pa.Table]: ...

    def read_messages(
        self, snapshot: Any, queue: str, seqs: np.ndarray, columns: list[str] | None = None
    ) -> pa.Table: ...


@dataclass(frozen=True)
class MessageFiles:
    """A snapshot's message files by ``min_seq``, with their statistics as arrays: picking
    the files of a queue level is a few array comparisons, not a compute call per bound
    (it runs for every lease and ack). Missing statistics bound nothing."""

    files: pa.Table
    min_seq: np.ndarray
    max_seq: np.ndarray
    min_priority: np.ndarray
    max_priority: np.ndarray
    min_queue: list[str | None]
    max_queue: list[str | None]

    @classmethod
    def of(cls, files: pa.Table) -> MessageFiles:
        def bound(name: str, missing: int) -> np.ndarray:
            values: np.ndarray = files[name].cast(pa.int64()).fill_null(missing).to_numpy()
            return values

        low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
        return cls(
            files,
            bound("min_seq", low),
            bound("max_seq", high),
            bound("min_priority", low),
            bound("max_priority", high),
            files["min_queue"].to_pylist(),
            files["max_queue"].to_pylist(),
        )

    def holding(self, queue: str, priority: int | None, from_seq: int) -> pa.Table:
        """The files that may hold ``queue`` rows (of ``priority``) at or after ``from_seq``."""
        mask = self.max_seq >= from_seq
        if priority is not None:
            mask &= (self.min_priority <= priority) & (self.max_priority >= priority)
        mask &= np.fromiter(
            (
                (low is None or low <= queue) and (high is None or high >= queue)
                for low, high in zip(self.min_queue, self.max_queue, strict=True)
            ),
            dtype=bool,
            count=len(self.min_queue),
        )
        if mask.all():
            return self.files
        return self.files.take(np.flatnonzero(mask))


def level_rows(
    source: DataFile, index: int, queue: str, priority: int
) -> tuple[tuple[pa.Table, np.ndarray], int]:
    """Row group ``index``'s rows of one queue level as :data:`HEAD_SCHEMA` in seq order
    (one chunk), with their seqs as an array, and the bytes they hold."""
    metadata = source.metadata
    names = metadata.schema.names  # of the leaf columns, as the row groups' statistics
    group = metadata.row_group(index)
    # The queue is compared, never needed as text.
    rows = source.read(index, HEAD_READ, read_dictionary=("queue",))
    # Files are written in seq order with one queue and level each, as a rule: then the
    # statistics say every row is wanted, and neither a filter nor a sort runs.
    if not (
        only(group.column(names.index("queue")).statistics, queue)
        and only(group.column(names.index("priority")).statistics, priority)
    ):
        rows = rows.filter(
            pc.and_(pc.equal(rows["queue"], queue), pc.equal(rows["priority"], priority))
        )
    seqs = rows.column("seq").to_numpy()
    if len(seqs) > 1 and bool((seqs[1:] < seqs[:-1]).any()):
        rows = rows.sort_by("seq")
    level = pa.table(
        {
            "seq": rows.column("seq"),
            "size": rows.column("size"),
            "deliver_at": rows.column("deliver_at").cast(pa.int64()),
            "enqueued_at": rows.column("enqueued_at").cast(pa.int64()),
            "expires_at": rows.column("expires_at").cast(pa.int64()),
        },
        schema=HEAD_SCHEMA,
    ).combine_chunks()
    seqs = level.column("seq").to_numpy()
    return (level, seqs), level.nbytes + seqs.nbytes


def only(stats: Any, value: Any) -> bool:
    """Whether row group ``stats`` say every value of the column is ``value``."""
    return (
        stats is not None
        and stats.has_min_max
        and stats.has_null_count
        and stats.null_count == 0
        and stats.min == value
        and stats.max == value
    )


class FileHeadReader:
    """:class:`spark_queue.rules.HeadReader` over the table's files, pruned by their stats.

    Files whose seq ranges overlap (after compaction) are read together and merged, so rows
    always come out in seq order.
    """

    def __init__(self, store: HeadSource, snapshot: Listing) -> None:
        self.store = store
        self.snapshot = snapshot

    def read(self, queue: str, priority: int, from_seq: int) -> Iterator[pa.Table]:
        files = self.snapshot.message_files(queue, priority=priority, from_seq=from_seq)
        sizes = dict(zip(files["path"].to_pylist(), files["size"].to_pylist(), strict=True))
        for run in file_runs(files):
            if len(run) == 1:  # the usual case: stream it a row group at a time
                path = run[0]
                yield from self.store.read_head_rows(path, sizes[path], queue, priority, from_seq)
                continue
            parts = [
                part
                for path in run
                for part in self.store.read_head_rows(path, sizes[path], queue, priority, from_seq)
            ]
            if parts:
                yield pa.concat_tables(parts).sort_by("seq")

    def keys(self, queue: str, seqs: np.ndarray) -> pa.Array:
        if not len(seqs):
            return pa.array([], pa.string())
        rows = self.store.read_messages(self.snapshot, queue, seqs, ["seq", "key"])
        found = rows.column("seq").to_numpy()
        order = np.argsort(found)
        at = order[np.searchsorted(found, seqs, sorter=order)]
        return rows.column("key").combine_chunks().take(pa.array(at)).cast(pa.string())


def file_runs(files: pa.Table) -> list[list[str]]:
    """Group files (sorted by ``min_seq``) into runs whose seq ranges overlap only within a
    run, so reading run after run, each sorted, yields rows in seq order."""
    paths = files["path"].to_pylist()
    lows = files["min_seq"].fill_null(0).to_pylist()
    highs = files["max_seq"].fill_null(np.iinfo(np.int64).max).to_pylist()
    runs: list[list[str]] = []
    high = None
    for path, low, top in zip(paths, lows, highs, strict=True):
        if runs and high is not None and low <= high:
            runs[-1].append(path)
            high = max(high, top)
        else:
            runs.append([path])
            high = top
    return runs
