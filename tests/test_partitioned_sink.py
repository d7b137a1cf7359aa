"""The Spark sink on a partitioned queue, and how a Spark write numbers its rows: each row in
its key's partition, each partition table committed with the batch's transaction (a replay
completes the tables a killed driver left and doubles none), the lanes that keep a write's
rows task after task and its use of seqs in proportion to its rows (a task past its lane
overflowing above them all), and delta-spark and delta-rs reading each partition.
Driver kills are tests/test_exactly_once.py's; S3, tests/test_object_storage_spark.py's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_queue import QueueTable
from spark_queue.errors import ArgumentMismatchError, QueueError
from spark_queue.model.lanes import (
    FIRST_WIDTH,
    MAX_TASKS,
    MIN_WIDTH,
    OVERFLOW_ROWS,
    WIDTH_APP,
    lane_offsets,
    next_width,
)
from spark_queue.model.partitions import key_partition, partition_of, partition_uri
from spark_queue.spark.options import parse_sink_options
from spark_queue.spark.sink import RingQueueStreamWriter, tables_of
from tests.helpers import assert_identity, enqueue, write_batch
from tests.test_partitions import every_log

KEYS = [f"customer-{i % 13}" for i in range(120)]


def keyed_rows(count: int) -> list[tuple[str, str | None]]:
    """``count`` bodies ``i``, every third without a key, the others keyed by ``KEYS``."""
    return [(str(i), None if i % 3 == 0 else KEYS[i % len(KEYS)]) for i in range(count)]


def test_lanes_keep_tasks_in_order_and_an_overflow_collides_with_nothing():
    width = 16
    rows = [10, 40, 16, 3]  # task 1 overflows its lane, task 2 fills it
    offsets = [lane_offsets(t, width, 0, n) for t, n in enumerate(rows)]
    together = np.concatenate(offsets)
    assert len(set(together.tolist())) == sum(rows)
    assert all((np.diff(o) > 0).all() for o in offsets)
    # In offset order: every task's lane, task after task, then task 1's rows past its lane.
    order = [(t, r) for t, n in enumerate(rows) for r in range(n)]
    by_offset = [order[i] for i in np.argsort(together)]
    in_lanes = [(t, r) for t, r in order if r < width]
    assert by_offset == in_lanes + [(1, r) for r in range(width, 40)]
    assert offsets[1][width] == MAX_TASKS * width + OVERFLOW_ROWS
    # Numbered in pieces, a task's rows are numbered as at once.
    pieces = np.concatenate([lane_offsets(1, width, 0, 7), lane_offsets(1, width, 7, 33)])
    assert pieces.tolist() == offsets[1].tolist()
    with pytest.raises(QueueError, match=f"at most {MAX_TASKS} tasks"):
        lane_offsets(MAX_TASKS, width, 0, 1)
    with pytest.raises(QueueError, match=f"at most {width + OVERFLOW_ROWS} rows"):
        lane_offsets(0, width, width + OVERFLOW_ROWS, 1)


def test_a_recorded_width_holds_four_times_the_largest_task_and_never_shrinks():
    assert next_width(None, 100) == MIN_WIDTH  # 400 rows fit the narrowest
    assert next_width(None, 1025) == 8192  # 4100 rows: the next power of two
    assert next_width(8192, 10) == 8192  # never lower
    assert next_width(MIN_WIDTH, 1 << 40) == FIRST_WIDTH  # never wider than the first


def stream_writer(path: str, **options: str) -> RingQueueStreamWriter:
    """A streaming writer as Spark's planner makes it, reserved as pickling reserves it."""
    given = {"path": path, "queue": "q", **options}
    writer = RingQueueStreamWriter(parse_sink_options(given), ["body", "key"])
    writer.reserve()
    return writer


def test_a_replay_completes_the_partitions_a_killed_commit_left_and_doubles_none(tmp_path):
    """A driver killed between two partition tables' commits: the replay's commit finds
    the batch's transaction in the tables that have it, commits the others."""
    import pyarrow as pa

    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=3)
    # Every row keyed: outside Spark a task has no batch id to send keyless rows by.
    keys = [KEYS[i % len(KEYS)] for i in range(60)]
    rows = pa.table({"body": [str(i) for i in range(60)], "key": keys})
    first = stream_writer(path)
    staged = first.write(iter(rows.to_batches()))
    staged.query_id = "query"
    by_table = tables_of([staged])
    assert sorted(by_table) == [0, 1, 2]
    plan, files, largest = by_table[1]
    width = next_width(plan.recorded, largest)
    first._commit_table(plan, files, 7, "spark-queue-query", width)  # then the driver dies
    assert table.stats("q")["added"] == sum(f.file.rows for f in files)

    replay = stream_writer(path)  # Spark replays batch 7: new files, a new reservation
    # The tables the batch has not reached number by their width from before it.
    assert [p.recorded for p in replay._plans or []] == [None, width, None]
    again = replay.write(iter(rows.to_batches()))
    again.query_id = "query"
    replay.commit([again], 7)
    widths = [
        table.partitioned.store_of("q", k).snapshot().transaction_version(WIDTH_APP)
        for k in range(3)
    ]
    assert widths == [MIN_WIDTH] * 3  # table 1's from the first run, the others' the replay's
    leased = table.lease("q", "c", max_messages=None)
    assert Counter(b.decode() for b in leased["body"].to_pylist()) == Counter(
        rows["body"].to_pylist()
    )
    assert [s["added"] for s in table.partition_stats("q")] == [
        sum(1 for key in keys if key_partition(key, 3) == k) for k in range(3)
    ]
    replay.commit([again], 7)  # once more: every table has the transaction
    assert table.stats("q")["added"] == 60
    assert_identity(path)


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["batch", "stream"])
def test_each_row_goes_to_its_keys_partition_and_each_key_keeps_its_order(spark, tmp_path, mode):
    """Three tasks of 40 rows (``id // 40``), keyed by ``KEYS`` but every third row: a
    keyed row in its key's partition, a key's rows of one task in their input order."""
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=4)
    keys = F.array(*[F.lit(k) for k in KEYS])[F.col("id").cast("int")]
    df = spark.range(0, 120, numPartitions=3).select(
        F.col("id").cast("string").alias("body"),
        F.when(F.col("id") % 3 != 0, keys).alias("key"),
    )
    enqueue(spark, tmp_path, mode, df, path, queue="q")
    leased = table.lease("q", "c", max_messages=None)
    bodies = [int(b) for b in leased["body"].to_pylist()]
    assert sorted(bodies) == list(range(120))  # each row once
    keys_of = leased["key"].to_pylist()
    seqs = np.array(leased["seq"].to_pylist())
    owners = partition_of(seqs)
    assert all(
        owners[at] == key_partition(key, 4) for at, key in enumerate(keys_of) if key is not None
    )
    by_key_and_task: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for seq, body, key in zip(seqs.tolist(), bodies, keys_of, strict=True):
        by_key_and_task.setdefault((key, body // 40), []).append((seq, body))
    for found in by_key_and_task.values():  # in seq order, the bodies ascend
        assert [body for _, body in sorted(found)] == sorted(body for _, body in found)
    assert table.ack("q", leased["seq"]) == 120
    assert [s["acked"] for s in table.partition_stats("q")] == [
        int((owners == k).sum()) for k in range(4)
    ]
    assert_identity(path)


@pytest.mark.spark
def test_keyless_rows_stay_in_one_partition_a_task(spark, tmp_path):
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=4)
    df = spark.range(0, 90, numPartitions=3).select(F.col("id").cast("string").alias("body"))
    turn = table.store.snapshot().version  # the root's, when the write is reserved
    write_batch(df, path, queue="q")
    leased = table.lease("q", "c", max_messages=None)
    owners = partition_of(np.array(leased["seq"].to_pylist()))
    task_of = {int(b): int(b) // 30 for b in leased["body"].to_pylist()}
    by_task: dict[int, set[int]] = {}
    for body, owner in zip(leased["body"].to_pylist(), owners.tolist(), strict=True):
        by_task.setdefault(task_of[int(body)], set()).add(owner)
    assert by_task == {k: {(k + turn) % 4} for k in range(3)}  # (task + turn) % 4
    turn = table.store.snapshot().version
    write_batch(df, path, queue="q")  # the next write's keyless rows move on
    later = partition_of(np.array(table.lease("q", "c", max_messages=None)["seq"].to_pylist()))
    assert set(later.tolist()) == {(k + turn) % 4 for k in range(3)}
    assert table.stats("q")["added"] == 180


@pytest.mark.spark
def test_a_write_giving_partitions_declares_them_and_delta_readers_read_each_table(spark, tmp_path):
    path = str(tmp_path / "queues")
    df = spark.createDataFrame(keyed_rows(60), "body string, key string").coalesce(2)
    enqueue(spark, tmp_path, "stream", df, path, queue="q", partitions=3)
    table = QueueTable(path, broker="off")
    assert table.arguments("q").partitions == 3
    counts = [s["added"] for s in table.partition_stats("q")]
    assert sum(counts) == 60 and all(counts)
    for k in range(3):
        uri = partition_uri(path, "q", k)
        by_rs = DeltaTable(uri).to_pyarrow_table(filters=[("record", "=", "message")])
        by_spark = spark.read.format("delta").load(uri).where("record = 'message'").count()
        assert by_rs.num_rows == by_spark == counts[k]
        assert set(partition_of(np.array(by_rs["seq"].to_pylist())).tolist()) == {k}
    # A write with another count is a declare's mismatch, refused with nothing written.
    before = every_log(Path(path))
    with pytest.raises(Exception, match="partitions") as refused:
        write_batch(df, path, queue="q", partitions=4)
    assert ArgumentMismatchError.__name__ in str(refused.value)
    assert every_log(Path(path)) == before


@pytest.mark.spark
def test_a_write_uses_seqs_in_proportion_to_its_rows_task_after_task(spark, tmp_path):
    """Four tasks of 100 rows: the first write (no width recorded) numbers its tasks
    ``2**32`` apart, the next in lanes of the recorded ``2**12``; each write's rows in seq
    order task after task, each task's in input order."""
    path = str(tmp_path / "queues")
    df = spark.range(0, 400, numPartitions=4).select(F.col("id").cast("string").alias("body"))
    write_batch(df, path, queue="q")
    table = QueueTable(path, broker="off")
    used = table.store.snapshot().states["q"].next_seq
    assert used == 3 * FIRST_WIDTH + 100
    assert table.store.snapshot().transaction_version(WIDTH_APP) == MIN_WIDTH
    write_batch(df, path, queue="q")
    assert table.store.snapshot().states["q"].next_seq - used == 3 * MIN_WIDTH + 100
    rows = spark.read.format("ringqueue").option("queue", "q").load(path).collect()
    seqs = [r.seq for r in rows]
    assert len(set(seqs)) == 800 and seqs == sorted(seqs)
    assert [int(r.body) for r in rows] == list(range(400)) * 2
    assert_identity(path)


@pytest.mark.spark
@pytest.mark.parametrize("partitions", [1, 2])
def test_a_task_past_its_lane_overflows_above_every_lane(spark, tmp_path, partitions):
    """A write of four 10-row tasks records the narrowest width; then a write whose task 1
    has 6,000 rows: its rows past the lane follow every other task's, each row once."""
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=partitions)
    key = F.lit("d")  # one key: every row in one table (partition 1 of 2)

    def tasks(start: int, sizes: list[int]) -> DataFrame:  # task t: row t, exploded
        bounds = np.cumsum([start, *sizes]).tolist()
        task = F.col("id").cast("int")
        first = F.array(*[F.lit(b) for b in bounds[:-1]])[task]
        last = F.array(*[F.lit(b - 1) for b in bounds[1:]])[task]
        rows = spark.range(0, len(sizes), numPartitions=len(sizes))
        ids = rows.select(F.explode(F.sequence(first, last)).alias("id"))
        return ids.select(F.col("id").cast("string").alias("body"), key.alias("key"))

    write_batch(tasks(0, [10] * 4), path, queue="q")
    part = key_partition("d", partitions)
    store = table.partitioned.store_of("q", part)
    assert store.snapshot().transaction_version(WIDTH_APP) == MIN_WIDTH
    base = store.snapshot().states["q"].next_seq
    write_batch(tasks(40, [10, 6000, 10, 10]), path, queue="q")
    past = 6000 - MIN_WIDTH
    assert store.snapshot().states["q"].next_seq == (
        base + MAX_TASKS * MIN_WIDTH + OVERFLOW_ROWS + past
    )
    assert store.snapshot().transaction_version(WIDTH_APP) == 32768  # 4 * 6000, rounded up
    rows = spark.read.format("ringqueue").option("queue", "q").load(path).collect()
    seqs = [r.seq for r in rows]
    assert len(set(seqs)) == len(seqs) == 40 + 6030 and seqs == sorted(seqs)
    later = [int(r.body) for r in rows[40:]]
    lane_of_1 = list(range(50, 50 + MIN_WIDTH))
    assert later == [*range(40, 50), *lane_of_1, *range(6050, 6070), *range(50 + MIN_WIDTH, 6050)]
    assert_identity(path)
