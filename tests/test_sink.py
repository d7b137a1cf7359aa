"""SEMANTICS §2 through the real sink: Spark writes, delta-rs commits, real Delta tables."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from spark_queue import QueueTable
from tests.helpers import assert_identity, bodies, enqueue, messages

pytestmark = pytest.mark.spark
MODES = ["batch", "stream"]


@pytest.mark.connect
@pytest.mark.parametrize("mode", MODES)
def test_ring_of_three_receiving_a_b_c_d_keeps_b_c_d(spark, queue_path, tmp_path, mode):
    enqueue(
        spark,
        tmp_path,
        mode,
        messages(spark, ["A", "B", "C", "D"]),
        queue_path,
        queue="ring",
        ringSize=3,
    )
    assert bodies(spark, queue_path, "ring") == ["B", "C", "D"]
    stats = QueueTable(queue_path).stats("ring")
    assert (stats["added"], stats["replaced"], stats["ready"]) == (4, 1, 3)
    assert_identity(queue_path)


@pytest.mark.parametrize("mode", MODES)
def test_drop_head_by_count_across_batches(spark, queue_path, tmp_path, mode):
    enqueue(
        spark, tmp_path, mode, messages(spark, ["a", "b", "c"]), queue_path, queue="q", maxLength=4
    )
    enqueue(spark, tmp_path, mode, messages(spark, ["d", "e", "f"]), queue_path, queue="q")
    assert bodies(spark, queue_path, "q") == ["c", "d", "e", "f"]
    assert QueueTable(queue_path).stats("q")["dropped"] == 2
    assert_identity(queue_path)


@pytest.mark.parametrize("mode", MODES)
def test_drop_head_by_bytes_and_an_oversized_message(spark, queue_path, tmp_path, mode):
    enqueue(
        spark,
        tmp_path,
        mode,
        messages(spark, ["aaaa", "bbbb", "cc"]),
        queue_path,
        queue="q",
        maxLengthBytes=8,
    )
    assert bodies(spark, queue_path, "q") == ["bbbb", "cc"]
    enqueue(spark, tmp_path, mode, messages(spark, ["x" * 9]), queue_path, queue="q")
    assert bodies(spark, queue_path, "q") == []  # it evicted everything, itself included
    stats = QueueTable(queue_path).stats("q")
    assert (stats["dropped"], stats["ready_bytes"]) == (4, 0)
    assert_identity(queue_path)


def test_batch_larger_than_the_limit_keeps_its_newest(spark, queue_path):
    enqueue(
        spark,
        None,
        "batch",
        messages(spark, [str(i) for i in range(10)]),
        queue_path,
        queue="q",
        maxLength=3,
    )
    assert bodies(spark, queue_path, "q") == ["7", "8", "9"]
    assert_identity(queue_path)


@pytest.mark.parametrize("mode", MODES)
def test_reject_publish_by_count_and_by_bytes(spark, queue_path, tmp_path, mode):
    enqueue(
        spark,
        tmp_path,
        mode,
        messages(spark, ["1", "2", "3"]),
        queue_path,
        queue="count",
        maxLength=2,
        overflow="reject-publish",
    )
    assert bodies(spark, queue_path, "count") == ["1", "2"]
    enqueue(
        spark,
        tmp_path,
        mode,
        messages(spark, ["aaaa", "bbbbbb", "cc"]),
        queue_path,
        queue="bytes",
        maxLengthBytes=7,
        overflow="reject-publish",
    )
    assert bodies(spark, queue_path, "bytes") == ["aaaa", "cc"]  # exact check per message
    table = QueueTable(queue_path)
    assert table.stats("count")["rejected"] == 1
    assert table.stats("bytes")["rejected"] == 1
    assert_identity(queue_path)


@pytest.mark.parametrize("mode", MODES)
def test_reject_publish_dlx_dead_letters_the_newer(spark, queue_path, tmp_path, mode):
    enqueue(
        spark,
        tmp_path,
        mode,
        messages(spark, ["old1", "old2", "new1", "new2"]),
        queue_path,
        queue="work",
        maxLength=2,
        overflow="reject-publish-dlx",
        deadLetterQueue="work.dlq",
    )
    assert bodies(spark, queue_path, "work") == ["old1", "old2"]
    dead = (
        spark.read.format("ringqueue")
        .option("queue", "work.dlq")
        .load(queue_path)
        .select("body", "death_reason", "original_queue")
    )
    expected = spark.createDataFrame(
        [(b"new1", "maxlen", "work"), (b"new2", "maxlen", "work")],
        "body binary, death_reason string, original_queue string",
    )
    assert_df_equality(dead, expected, ignore_nullable=True)
    original = spark.read.format("ringqueue").option("queue", "work.dlq").load(queue_path)
    assert all(r.original_seq is not None and r.died_at is not None for r in original.collect())
    stats = QueueTable(queue_path).stats("work")
    assert (stats["rejected"], stats["dead_lettered"]) == (2, 2)
    assert QueueTable(queue_path).stats("work.dlq")["added"] == 2
    assert_identity(queue_path)


def test_drop_head_dead_letters_dropped_messages(spark, queue_path):
    enqueue(
        spark,
        None,
        "batch",
        messages(spark, ["a", "b", "c"]),
        queue_path,
        queue="q",
        maxLength=1,
        deadLetterQueue="q.dlq",
    )
    assert bodies(spark, queue_path, "q") == ["c"]
    assert bodies(spark, queue_path, "q.dlq") == ["a", "b"]
    assert_identity(queue_path)


def test_on_reject_fail_commits_nothing(spark, queue_path):
    QueueTable(queue_path).declare("q", max_length=1, overflow="reject-publish")
    version = QueueTable(queue_path).store.open().version()
    with pytest.raises(Exception, match="onReject=fail"):
        enqueue(
            spark,
            None,
            "batch",
            messages(spark, ["a", "b"]),
            queue_path,
            queue="q",
            onReject="fail",
        )
    assert QueueTable(queue_path).store.open().version() == version
    assert bodies(spark, queue_path, "q") == []


def test_lowered_limit_ring_versus_drop_head(spark, queue_path):
    table = QueueTable(queue_path)
    enqueue(
        spark, None, "batch", messages(spark, list("abcde")), queue_path, queue="ring", ringSize=5
    )
    enqueue(
        spark, None, "batch", messages(spark, list("abcde")), queue_path, queue="drop", maxLength=5
    )
    table.alter("ring", max_length=2)
    table.alter("drop", max_length=2)
    assert bodies(spark, queue_path, "ring") == list("abcde")  # ring never trims at once
    assert bodies(spark, queue_path, "drop") == ["d", "e"]  # drop-head trims at once
    enqueue(spark, None, "batch", messages(spark, ["f"]), queue_path, queue="ring")
    assert bodies(spark, queue_path, "ring") == list("bcdef")  # one evicted per append
    assert_identity(queue_path)


@pytest.mark.parametrize("mode", MODES)
def test_several_queues_in_one_batch_one_commit(spark, queue_path, tmp_path, mode):
    df = messages(spark, ["a1", "b1", "a2", "b2", "a3"], ["a", "b", "a", "b", "a"])
    QueueTable(queue_path).declare("a", ring_size=2)
    version = QueueTable(queue_path).store.open().version()
    enqueue(spark, tmp_path, mode, df, queue_path)
    assert bodies(spark, queue_path, "a") == ["a2", "a3"]
    assert bodies(spark, queue_path, "b") == ["b1", "b2"]
    assert QueueTable(queue_path).store.open().version() == version + 1  # one commit
    assert_identity(queue_path)


def test_seq_follows_arrival_order_across_partitions(spark, queue_path):
    """Four tasks of 100 rows, written twice: in seq order, each write's rows task after
    task, each task's in its row order (the second write in lanes of the recorded width)."""
    df = spark.range(0, 400, numPartitions=4).select(F.col("id").cast("string").alias("body"))
    enqueue(spark, None, "batch", df, queue_path, queue="q")
    enqueue(spark, None, "batch", df, queue_path, queue="q")
    rows = spark.read.format("ringqueue").option("queue", "q").load(queue_path).collect()
    seqs = [r.seq for r in rows]
    assert len(seqs) == 800 and seqs == sorted(seqs) and len(set(seqs)) == 800
    first, second = rows[:400], rows[400:]
    assert [int(r.body) for r in first] == list(range(400))  # partition, then row order
    assert [int(r.body) for r in second] == list(range(400))
    assert_identity(queue_path)


def test_scheduled_messages_are_not_counted_until_due(spark, queue_path):
    df = (
        spark.createDataFrame([("later",), ("now1",), ("now2",)], "body string")
        .coalesce(1)
        .withColumn(
            "deliver_at",
            F.when(F.col("body") == "later", F.expr("current_timestamp() + INTERVAL 1 HOUR")),
        )
    )
    enqueue(spark, None, "batch", df, queue_path, queue="q", ringSize=2)
    table = QueueTable(queue_path)
    stats = table.stats("q")
    assert (stats["ready"], stats["scheduled"], stats["replaced"]) == (2, 1, 0)
    states = {
        bytes(r.body).decode(): r.state
        for r in spark.read.format("ringqueue").option("queue", "q").load(queue_path).collect()
    }
    assert states == {"later": "scheduled", "now1": "ready", "now2": "ready"}
    assert_identity(queue_path)


def test_optional_columns_are_stored(spark, queue_path):
    df = spark.createDataFrame(
        [(b"x", "id-1", "k", {"region": "eu"}, 7)],
        "body binary, message_id string, key string, headers map<string,string>, priority int",
    )
    enqueue(spark, None, "batch", df, queue_path, queue="q")
    row = spark.read.format("ringqueue").option("queue", "q").load(queue_path).collect()[0]
    assert (row.message_id, row.key, row.headers, row.priority, row.size) == (
        "id-1",
        "k",
        {"region": "eu"},
        7,
        1,
    )
    assert row.enqueued_at is not None and row.delivery_count == 0


def test_priority_order_in_browse(spark, queue_path):
    df = spark.createDataFrame([("low", 0), ("high", 9), ("mid", 5)], "body string, priority int")
    enqueue(spark, None, "batch", df.coalesce(1), queue_path, queue="q")
    assert bodies(spark, queue_path, "q") == ["high", "mid", "low"]


def test_queue_table_is_plain_delta_read_by_delta_spark(spark, queue_path):
    enqueue(
        spark, None, "batch", messages(spark, list("abcdef")), queue_path, queue="q", ringSize=4
    )
    enqueue(spark, None, "batch", messages(spark, ["x", "y"], ["r", "r"]), queue_path)
    table = spark.read.format("delta").load(queue_path)
    messages_df = table.where("record = 'message'")
    removed = table.where("record = 'removal'").select("queue", "seq")
    live = messages_df.join(removed, ["queue", "seq"], "left_anti")
    through_delta = live.select("queue", "seq", "body").orderBy("queue", "seq")
    through_ringqueue = (
        spark.read.format("ringqueue")
        .load(queue_path)
        .select("queue", "seq", "body")
        .orderBy("queue", "seq")
    )
    assert_df_equality(through_delta, through_ringqueue, ignore_nullable=True)
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{queue_path}`").collect()[0]
    assert (detail.minReaderVersion, detail.minWriterVersion) == (1, 2)
    assert detail.partitionColumns == ["record"]


def test_dead_letters_and_direct_messages_to_one_queue_in_one_batch(spark, queue_path):
    QueueTable(queue_path).declare("src", max_length=1, dead_letter_queue="dlq")
    df = messages(spark, ["s1", "d1", "s2", "s3"], ["src", "dlq", "src", "src"])
    enqueue(spark, None, "batch", df, queue_path)
    assert bodies(spark, queue_path, "src") == ["s3"]
    assert bodies(spark, queue_path, "dlq") == ["d1", "s1", "s2"]  # arrivals, then the dead
    seqs = [r.seq for r in spark.read.format("ringqueue").load(queue_path).collect()]
    assert len(seqs) == len(set(seqs))
    assert_identity(queue_path)
