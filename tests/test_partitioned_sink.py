"""The Spark sink on a partitioned queue, and how a Spark write numbers its rows: each row in
its key's partition, each partition table committed with the batch's transaction (a replay
completes the tables a killed driver left and doubles none), the lanes that keep a write's
use of seqs in proportion to its rows, and delta-spark and delta-rs reading each partition.
Driver kills are tests/test_exactly_once.py's; S3, tests/test_object_storage_spark.py's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from spark_queue import QueueTable
from spark_queue.errors import ArgumentMismatchError
from spark_queue.model.lanes import TASKS_APP, lane
from spark_queue.model.partitions import ROOT_SEQ_LIMIT, key_partition, partition_of, partition_uri
from spark_queue.spark.options import parse_sink_options
from spark_queue.spark.sink import RingQueueStreamWriter, tables_of
from tests.helpers import assert_identity, enqueue, write_batch
from tests.test_partitions import every_log

KEYS = [f"customer-{i % 13}" for i in range(120)]


def keyed_rows(count: int) -> list[tuple[str, str | None]]:
    """``count`` bodies ``i``, every third without a key, the others keyed by ``KEYS``."""
    return [(str(i), None if i % 3 == 0 else KEYS[i % len(KEYS)]) for i in range(count)]


def test_lanes_never_collide_and_a_right_width_uses_twice_the_rows():
    for width in (1, 2, 3, 8, 200):
        taken: set[int] = set()
        for task in range(300):
            first, step = lane(task, width)
            offsets = {first + step * row for row in range(50)}
            assert not taken & offsets, (width, task)
            taken |= offsets
    # Every task in the width's lanes: the highest offset is under twice the rows.
    highest = max(lane(t, 200)[0] + lane(t, 200)[1] * 999 for t in range(200))
    assert highest < 2 * 200 * 1000
    assert lane(0, 1) == (0, 2)  # a lone task: every other seq


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
    plan, files = by_table[1]
    first._commit_table(plan, files, 7, "spark-queue-query", 1)  # then the driver dies
    assert table.stats("q")["added"] == sum(f.file.rows for f in files)

    replay = stream_writer(path)  # Spark replays batch 7: new files, a new reservation
    again = replay.write(iter(rows.to_batches()))
    again.query_id = "query"
    replay.commit([again], 7)
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
def test_a_write_uses_seqs_in_proportion_to_its_rows_each_task_in_order(spark, tmp_path):
    """Four tasks of 100 rows: the first write (no width recorded) uses a few thousand
    seqs, the next (four lanes) about twice its rows; each task's rows in input order."""
    path = str(tmp_path / "queues")
    df = spark.range(0, 400, numPartitions=4).select(F.col("id").cast("string").alias("body"))
    write_batch(df, path, queue="q")
    table = QueueTable(path, broker="off")
    used = table.store.snapshot().states["q"].next_seq
    assert used < 4 * 100 * 32
    assert table.store.snapshot().transaction_version(TASKS_APP) == 4
    write_batch(df, path, queue="q")
    more = table.store.snapshot().states["q"].next_seq - used
    assert more <= 2 * 4 * 100
    rows = spark.read.format("ringqueue").option("queue", "q").load(path).collect()
    seqs = [r.seq for r in rows]
    assert len(set(seqs)) == 800 and seqs == sorted(seqs) and max(seqs) < ROOT_SEQ_LIMIT
    for half in (rows[:400], rows[400:]):  # each write's rows, task by task in input order
        for task in range(4):
            mine = [int(r.body) for r in half if int(r.body) // 100 == task]
            assert mine == list(range(task * 100, task * 100 + 100))
    assert_identity(path)
