"""Spark Connect: ``register`` ships the package where the server lacks it, and what only a
Connect session shows (errors reaching the client, a restarted processing-time consumer).

Runs in the Connect pass only (``SPARK_QUEUE_TEST_SESSION=connect``): ``spark`` is a session
of the test session's local Connect server, whose Python workers cannot import
``spark_queue`` unless a session ships it (tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from spark_queue import QueueTable, register
from spark_queue.model.queue_arguments import READ_MODES
from spark_queue.spark.connect import is_connect, ship_package, workers_import_package
from tests.helpers import assert_identity, bodies, delivered, messages, write_batch

pytestmark = [pytest.mark.spark, pytest.mark.connect_only]


@pytest.fixture
def fresh_session(connect_server) -> SparkSession:
    """A new session of the server: none of the artifacts other sessions added. Not
    stopped: the server releases it when it stops."""
    return SparkSession.builder.remote(connect_server.url).create()


def test_the_streaming_sink_replays_a_batch_into_a_no_op(spark, queue_path, tmp_path):
    source = tmp_path / "in"
    messages(spark, [f"s{i}" for i in range(6)]).write.parquet(str(source))
    checkpoint = tmp_path / "checkpoint"

    def run_stream() -> None:
        query = (
            spark.readStream.schema("body string")
            .parquet(str(source))
            .writeStream.format("ringqueue")
            .option("queue", "orders")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start(queue_path)
        )
        query.awaitTermination()
        assert query.exception() is None

    run_stream()
    # As if the driver died after the Delta commit and before Spark's commit log: the
    # batch runs again, and its application transaction makes it a no-op.
    (checkpoint / "commits" / "0").unlink()
    (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
    run_stream()
    stats = QueueTable(queue_path).stats("orders")
    assert (stats["added"], stats["ready"]) == (6, 6)
    assert bodies(spark, queue_path, "orders") == [f"s{i}" for i in range(6)]
    assert_identity(queue_path)


def test_a_processing_time_consumer_restarted_delivers_each_message_once(
    spark, queue_path, tmp_path
):
    write_batch(messages(spark, [f"m{i}" for i in range(10)]), queue_path, queue="q")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_until_idle() -> None:
        query = (
            spark.readStream.format("ringqueue")
            .option("queue", "q")
            .option("consumer", "poller")
            .option("maxMessagesPerTrigger", 4)
            .load(queue_path)
            .select("seq", "body")
            .writeStream.format("delta")
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="500 milliseconds")
            .start(str(out))
        )
        query.processAllAvailable()
        query.stop()
        assert query.exception() is None

    run_until_idle()
    assert delivered(out) == sorted(f"m{i}" for i in range(10))
    write_batch(messages(spark, ["late"]), queue_path, queue="q")
    run_until_idle()  # the restart acknowledges the last batch of the first run, once
    assert delivered(out) == sorted([*(f"m{i}" for i in range(10)), "late"])
    stats = QueueTable(queue_path).stats("q")
    # A processing-time query's last batch stays leased until its next trigger.
    assert (stats["acked"] + stats["leased"], stats["ready"]) == (11, 0)
    assert_identity(queue_path)


@pytest.mark.parametrize("read_mode", READ_MODES)
def test_browse_with_filters_and_a_filtering_consumer(spark, queue_path, tmp_path, read_mode):
    rows = [(f"m{i}", "eu" if i % 2 else "us", i % 3) for i in range(9)]
    batch = spark.createDataFrame(rows, "body string, region string, priority int")
    write_batch(
        batch.selectExpr("body", "map('region', region) AS headers", "priority").coalesce(1),
        queue_path,
        queue="q",
    )
    browsed = spark.read.format("ringqueue").option("queue", "q").load(queue_path)
    eu = browsed.where("headers['region'] = 'eu' AND priority >= 1").select("body", "priority")
    expected = spark.createDataFrame(
        [(body.encode(), priority) for body, region, priority in rows
         if region == "eu" and priority >= 1],
        "body binary, priority int",
    )  # fmt: skip
    assert_df_equality(eu, expected, ignore_row_order=True, ignore_nullable=True)

    out = tmp_path / "out"
    query = (
        spark.readStream.format("ringqueue")
        .option("queue", "q")
        .option("consumer", "eu")
        .option("filter", "headers['region'] = 'eu'")
        .option("readMode", read_mode)
        .load(queue_path)
        .select("body")
        .writeStream.format("delta")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start(str(out))
    )
    query.awaitTermination()
    assert delivered(out) == sorted(body for body, region, _ in rows if region == "eu")
    # The us messages stay, in place and untouched, for other consumers.
    us = browsed.where("headers['region'] = 'us'").select("body", "state", "delivery_count")
    expected = spark.createDataFrame(
        [(body.encode(), "ready", 0) for body, region, _ in rows if region == "us"],
        "body binary, state string, delivery_count int",
    )
    assert_df_equality(us, expected, ignore_row_order=True, ignore_nullable=True)
    assert_identity(queue_path)


@pytest.mark.parametrize(
    ("kind", "option", "value", "named"),
    [
        ("write", "overflow", "drop-tail", "drop-head, ring, reject-publish, reject-publish-dlx"),
        ("write", "semantics", "x", "unknown option 'semantics'; valid options: path, queue"),
        ("read", "semantics", "x", "semantics must be one of at-least-once, at-most-once"),
    ],
)
def test_a_bad_option_reaches_the_client_named_with_its_valid_values(
    spark, queue_path, tmp_path, kind, option, value, named
):
    QueueTable(queue_path).declare("q")
    version = QueueTable(queue_path).store.open().version()
    with pytest.raises(PySparkException, match=named) as raised:
        if kind == "write":
            write_batch(messages(spark, ["a"]), queue_path, queue="q", **{option: value})
        else:
            query = (
                spark.readStream.format("ringqueue")
                .option("queue", "q")
                .option(option, value)
                .load(queue_path)
                .writeStream.format("delta")
                .option("checkpointLocation", str(tmp_path / "checkpoint"))
                .trigger(availableNow=True)
                .start(str(tmp_path / "out"))
            )
            query.awaitTermination()
    assert "InvalidOptionError" in str(raised.value)
    assert QueueTable(queue_path).store.open().version() == version
    assert not (tmp_path / "out" / "_delta_log").exists()


def test_a_bad_column_reaches_the_client_named_and_nothing_is_written(spark, queue_path):
    wrong = spark.createDataFrame([("x", "high")], "body string, priority string")
    with pytest.raises(PySparkException, match="column 'priority' has type string"):
        write_batch(wrong, queue_path, queue="q")
    assert not Path(queue_path).exists()


def test_the_package_is_shipped_only_where_the_workers_lack_it(fresh_session, queue_path):
    assert is_connect(fresh_session)
    assert not workers_import_package(fresh_session)
    assert ship_package(fresh_session) is True  # asked, and shipped
    assert workers_import_package(fresh_session)
    assert ship_package(fresh_session) is False  # importable now: not shipped again
    register(fresh_session)  # registering again is harmless
    write_batch(messages(fresh_session, ["a", "b"]), queue_path, queue="q")
    assert bodies(fresh_session, queue_path, "q") == ["a", "b"]


def test_register_without_shipping_leaves_the_workers_without_the_package(
    fresh_session, queue_path
):
    register(fresh_session, ship=False)
    with pytest.raises(PySparkException, match="No module named 'spark_queue'"):
        write_batch(messages(fresh_session, ["a"]), queue_path, queue="q")
    assert not Path(queue_path).exists()
