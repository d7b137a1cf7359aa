"""The per-process caches of data-file reads (spark_queue/storage/row_cache.py), and that reads
through them are the same as reads without them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from spark_queue import QueueTable
from spark_queue.storage import row_cache
from spark_queue.storage.row_cache import DataFile, LeastRecentlyUsed


def test_least_recently_used_drops_the_oldest_beyond_its_capacity():
    cache: LeastRecentlyUsed[str] = LeastRecentlyUsed(10)
    cache.put("a", "A", 4)
    cache.put("b", "B", 4)
    assert cache.get("a") == "A"  # now "b" is the least recently used
    cache.put("c", "C", 4)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == ("A", None, "C")
    assert cache.held == 8
    cache.put("a", "A2", 2)  # replaced, not counted twice
    assert (cache.get("a"), cache.held) == ("A2", 6)


def test_an_entry_heavier_than_the_whole_cache_is_not_kept():
    cache: LeastRecentlyUsed[str] = LeastRecentlyUsed(10)
    cache.put("small", "s", 3)
    cache.put("huge", "h", 11)
    assert (cache.get("huge"), cache.get("small"), cache.held) == (None, "s", 3)


@pytest.fixture
def parquet_file(tmp_path):
    path = str(tmp_path / "rows.parquet")
    rows = pa.table({"seq": np.arange(1000, dtype=np.int64), "body": [b"x"] * 1000})
    pq.write_table(rows, path, row_group_size=300)
    row_cache.clear()
    yield path
    row_cache.clear()


def test_a_row_group_and_a_footer_are_read_once_and_kept(parquet_file):
    path = parquet_file
    fs = pafs.LocalFileSystem()
    first = DataFile(fs, path)
    assert first.metadata.num_row_groups == 4
    group = first.row_group(1, ["seq"])
    assert group.column("seq").to_pylist() == list(range(300, 600))
    again = DataFile(fs, path)  # another reader of the same file, as the next lease is
    assert again.metadata is first.metadata
    assert again.row_group(1, ["seq"]) is group
    assert again.row_group(1, ["seq", "body"]) is not group  # other columns, another entry


def test_derived_values_are_made_once_per_row_group_and_name(parquet_file):
    path = parquet_file
    made: list[int] = []

    def make(index: int):
        made.append(index)
        return index * 10, 8

    source = DataFile(pafs.LocalFileSystem(), path)
    assert [source.derived(i, "x", lambda i=i: make(i)) for i in (0, 1, 0, 1)] == [0, 10, 0, 10]
    assert made == [0, 1]


def test_reads_through_the_caches_match_a_fresh_process(tmp_path):
    """Leases and acks after publishes, compaction and a purge read what a process with
    empty caches reads: the same heads and the same message rows."""
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q")
    for batch in range(40):  # enough small files for compaction to rewrite them
        table.publish("q", [f"b{batch}-m{i}" for i in range(25)])
    leased = []
    for _ in range(30):
        rows = table.lease("q", "c", max_messages=7)
        leased += rows["body"].to_pylist()
        table.ack("q", rows["seq"].to_pylist()[::2], "c")
        table.cancel("q", rows["seq"].to_pylist()[1::2], "c")
    cached_stats = table.stats("q")
    through_caches = table.lease("q", "d", max_messages=1000)
    table.release("q", consumer="d")
    row_cache.clear()
    fresh = QueueTable(path, broker="off")
    assert fresh.stats("q")["ready"] == cached_stats["ready"]
    fresh_read = fresh.lease("q", "e", max_messages=1000)

    def messages(rows: pa.Table) -> list[tuple[int, bytes]]:
        return sorted(zip(rows["seq"].to_pylist(), rows["body"].to_pylist(), strict=True))

    assert messages(fresh_read) == messages(through_caches)
    # Every message not acknowledged is there once: cancelled ones back, the rest unread.
    assert len(leased) == 30 * 7
    assert fresh_read.num_rows == 40 * 25 - cached_stats["acked"] > 0
