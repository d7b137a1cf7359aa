"""The consumer side of the Python API: lease, ack, cancel, expire, release (SEMANTICS §3)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from pyspark.sql import functions as F

from spark_queue import QueueTable
from tests.clock import now_micros, wait_past
from tests.helpers import assert_identity, bodies, messages, write_batch

pytestmark = pytest.mark.spark


def texts(table) -> list[str]:
    return [bytes(b).decode() for b in table["body"].to_pylist()]


def test_artemis_consumer_close_example(spark, queue_path):
    """Ring 3, one consumer holding A, B, C, D unacked; release: B, C, D stay, replaced 1."""
    table = QueueTable(queue_path)
    table.declare("foo", ring_size=3)
    for body in "ABCD":  # each is dispatched to the consumer before the next arrives
        write_batch(messages(spark, [body]), queue_path, queue="foo")
        assert texts(table.lease("foo", "c", max_messages=1)) == [body]
    stats = table.stats("foo")
    assert (stats["leased"], stats["ready"], stats["added"]) == (4, 0, 4)
    assert table.release(consumer="c") == 4
    assert bodies(spark, queue_path, "foo") == ["B", "C", "D"]
    assert table.stats("foo")["replaced"] == 1
    assert_identity(queue_path)


def test_lease_ack_and_browse_shows_leased(spark, queue_path):
    write_batch(messages(spark, list("abcd")), queue_path, queue="q")
    table = QueueTable(queue_path)
    leased = table.lease("q", "worker-1", max_messages=2)
    assert texts(leased) == ["a", "b"]
    assert leased["delivery_count"].to_pylist() == [1, 1]
    rows = spark.read.format("ringqueue").option("queue", "q").load(queue_path).collect()
    assert [(bytes(r.body).decode(), r.state, r.consumer) for r in rows] == [
        ("a", "leased", "worker-1"),
        ("b", "leased", "worker-1"),
        ("c", "ready", None),
        ("d", "ready", None),
    ]
    assert table.stats("q")["leased_by_consumer"] == {"worker-1": 2}
    assert table.ack("q", leased["seq"].to_pylist(), "worker-2") == 0  # not its leases
    assert table.ack("q", leased["seq"].to_pylist(), "worker-1") == 2
    stats = table.stats("q")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (2, 0, 2)
    assert texts(table.lease("q", "worker-2", max_messages=10)) == ["c", "d"]
    assert_identity(queue_path)


def test_cancel_returns_to_position_and_max_cancels_kills(spark, queue_path):
    write_batch(messages(spark, ["x", "y"]), queue_path, queue="q", deadLetterQueue="q.dlq")
    table = QueueTable(queue_path)
    first = table.lease("q", "c", max_messages=1, max_cancels=2)
    assert table.cancel("q", first["seq"].to_pylist()) == 1
    again = table.lease("q", "c", max_messages=1, max_cancels=2)
    assert texts(again) == ["x"] and again["delivery_count"].to_pylist() == [2]
    table.cancel("q", again["seq"].to_pylist())  # second cancel: killed, dead-lettered
    assert bodies(spark, queue_path, "q") == ["y"]
    dead = spark.read.format("ringqueue").option("queue", "q.dlq").load(queue_path).collect()
    assert [(bytes(r.body).decode(), r.death_reason) for r in dead] == [("x", "cancel_limit")]
    assert table.stats("q")["killed"] == 1
    assert_identity(queue_path)


def test_lease_period_redelivers_with_a_higher_count_and_max_deliveries(spark, queue_path):
    write_batch(messages(spark, ["m"]), queue_path, queue="q", deadLetterQueue="dlq")
    table = QueueTable(queue_path)
    assert table.lease("q", "a", lease_period=1, max_deliveries=2)[
        "delivery_count"
    ].to_pylist() == [1]
    time.sleep(0.01)
    second = table.lease("q", "b", lease_period=1, max_deliveries=2)
    assert second["delivery_count"].to_pylist() == [2]  # another consumer got it back
    time.sleep(0.01)
    assert table.lease("q", "b").num_rows == 0  # expired again: killed at its limit
    assert table.stats("q")["killed"] == 1
    dead = spark.read.format("ringqueue").option("queue", "dlq").load(queue_path).collect()
    assert [r.death_reason for r in dead] == ["delivery_limit"]
    assert_identity(queue_path)


def test_expire_and_expired_messages_are_never_delivered(spark, queue_path):
    df = messages(spark, ["old", "fresh", "held"]).withColumn(
        "expires_at",
        F.when(F.col("body") == "old", F.expr("current_timestamp() - INTERVAL 1 MINUTE")),
    )
    write_batch(df, queue_path, queue="q", deadLetterQueue="dlq")
    table = QueueTable(queue_path)
    leased = table.lease("q", "c", max_messages=2)
    assert texts(leased) == ["fresh", "held"]
    assert table.expire("q", leased["seq"].to_pylist()[1:]) == 1
    stats = table.stats("q")
    assert (stats["expired"], stats["leased"]) == (2, 1)
    reasons = [
        r.death_reason
        for r in spark.read.format("ringqueue").option("queue", "dlq").load(queue_path).collect()
    ]
    assert reasons == ["expired", "expired"]
    assert_identity(queue_path)


@pytest.mark.parametrize(
    ("model", "delivered"),
    [
        ("default", ["msg-ttl-long"]),
        ("queue", []),
        ("earliest", []),
        ("latest", ["msg-ttl-long"]),
    ],
)
def test_expiration_models(spark, queue_path, model, delivered):
    df = messages(spark, ["msg-ttl-long"]).withColumn(
        "expires_at", F.expr("current_timestamp() + INTERVAL 1 HOUR")
    )
    write_batch(df, queue_path, queue="q", expiration="1 ms", expirationModel=model)
    time.sleep(0.01)
    assert texts(QueueTable(queue_path).lease("q", "c")) == delivered
    assert_identity(queue_path)


def test_priority_then_seq_and_bytes_bound(spark, queue_path):
    df = spark.createDataFrame([("low", 0), ("high", 5), ("mid", 2)], "body string, priority int")
    write_batch(df.coalesce(1), queue_path, queue="q")
    table = QueueTable(queue_path)
    assert texts(table.lease("q", "c", max_messages=10, max_bytes=5)) == ["high"]
    assert texts(table.lease("q", "c", max_messages=10)) == ["mid", "low"]


def test_filter_leases_matching_messages_and_leaves_the_rest(spark, queue_path):
    df = spark.createDataFrame(
        [
            ("e1", {"region": "eu"}),
            ("u1", {"region": "us"}),
            ("e2", {"region": "eu"}),
            ("u2", {"region": "us"}),
        ],
        "body string, headers map<string,string>",
    )
    write_batch(df.coalesce(1), queue_path, queue="q")
    table = QueueTable(queue_path)
    assert texts(table.lease("q", "eu", filter="headers['region'] = 'eu'")) == ["e1", "e2"]
    assert texts(table.lease("q", "any")) == ["u1", "u2"]  # the rest stayed, in order
    acked = table.ack(
        "q",
        [
            r.seq
            for r in spark.read.format("ringqueue").load(queue_path).collect()
            if r.consumer == "eu"
        ],
    )
    assert acked == 2
    assert table.release(consumer="any") == 2
    assert bodies(spark, queue_path, "q") == ["u1", "u2"]
    with pytest.raises(Exception, match="filter"):
        table.lease("q", "bad", filter="no_such_column = 1")
    assert_identity(queue_path)


def test_scheduled_messages_are_delivered_once_due(spark, queue_path):
    """A message is not delivered before its ``deliver_at``, and is once it is due.

    "Not before" is checked on a message due in an hour (a Spark write on a loaded machine
    can take seconds); "once due" on one due a second after a time read before the write,
    waited out by the clock."""
    start = now_micros()
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    hour, soon = (epoch + timedelta(microseconds=start + s * 1_000_000) for s in (3600, 1))
    df = spark.createDataFrame(
        [("hour", hour), ("soon", soon), ("now", None)], "body string, deliver_at timestamp"
    )
    write_batch(df.coalesce(1), queue_path, queue="q")
    table = QueueTable(queue_path)
    first = texts(table.lease("q", "c"))
    assert "now" in first and "hour" not in first
    wait_past(start + 1_000_000)
    # "soon" once: in the first lease only where the write took over a second.
    assert sorted(first + texts(table.lease("q", "c"))) == ["now", "soon"]
    stats = table.stats("q")
    assert (stats["scheduled"], stats["leased"]) == (1, 2)
    assert_identity(queue_path)


def test_purge_leaves_leased_messages_with_their_consumer(spark, queue_path):
    write_batch(messages(spark, list("abcd")), queue_path, queue="q")
    table = QueueTable(queue_path)
    held = table.lease("q", "c", max_messages=1)
    assert table.purge("q") == 3
    stats = table.stats("q")
    assert (stats["purged"], stats["leased"], stats["ready"]) == (3, 1, 0)
    assert table.ack("q", held["seq"].to_pylist()) == 1
    assert_identity(queue_path)


def test_returned_messages_are_index_rows_not_state_json(spark, queue_path):
    """A returned batch is stored column by column (records ``extra`` and ``redelivered``),
    not in the queue state's JSON, and a process that reads it back delivers it again with
    the counts it had."""
    import json

    write_batch(messages(spark, [f"m{i}" for i in range(60)]), queue_path, queue="q")
    table = QueueTable(queue_path)
    leased = table.lease("q", "c", max_messages=50)
    assert table.cancel("q", leased["seq"].to_pylist()[:30]) == 30
    assert table.release(consumer="c") == 20
    delta = spark.read.format("delta").load(queue_path)
    per_record = {r["record"]: r["count"] for r in delta.groupBy("record").count().collect()}
    assert (per_record["extra"], per_record["redelivered"]) == (50, 50)
    cancelled = delta.where("record = 'redelivered' and cancel_count = 1").count()
    assert cancelled == 30
    state = json.loads(delta.where("record = 'queue'").first()["queue_state"])
    assert "extras" not in state and "redelivered" not in state
    again = QueueTable(queue_path).lease("q", "d", max_messages=60)
    assert texts(again) == [f"m{i}" for i in range(60)]
    assert again["delivery_count"].to_pylist() == [2] * 50 + [1] * 10
    assert table.stats("q")["leased_by_consumer"] == {"d": 60}
    assert_identity(queue_path)
