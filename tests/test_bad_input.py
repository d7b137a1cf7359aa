"""Bad input: a clear error naming the option or column, and an unchanged table."""

from __future__ import annotations

import os

import pytest
from pyspark.sql import functions as F

from spark_queue import (
    ArgumentMismatchError,
    InvalidOptionError,
    QueueTable,
    SparkQueueDeprecationWarning,
)
from spark_queue.spark.options import (
    parse_browse_options,
    parse_sink_options,
    parse_source_options,
)
from tests.helpers import bodies, messages, write_batch

BAD_OPTIONS = [
    ("maxLength", "-2", "maxLength"),
    ("maxLength", "abc", "maxLength"),
    ("maxLength", "1.5", "maxLength"),
    ("maxLengthBytes", "-5", "maxLengthBytes"),
    ("maxLengthBytes", "lots", "maxLengthBytes"),
    ("ringSize", "-3", "ringSize"),
    ("overflow", "drop-tail", "overflow"),
    ("deadLetterQueue", "bad name!", "deadLetterQueue"),
    ("rejectThreshold", "0", "rejectThreshold"),
    ("rejectThreshold", "1.5", "rejectThreshold"),
    ("rejectThreshold", "half", "rejectThreshold"),
    ("onReject", "explode", "onReject"),
    ("expiration", "soon", "expiration"),
    ("queue", "no spaces", "queue"),
    ("maxLenght", "3", "maxLenght"),
    ("maxLength", str(2**70), "maxLength"),
    ("maxLength", "1_000", "maxLength"),
    ("expiration", "1.5", "expiration"),
    ("expiration", str(10**16), "expiration"),
    ("exclusive", "1", "exclusive"),
]


@pytest.mark.parametrize(("option", "value", "named"), BAD_OPTIONS)
def test_option_validation_names_the_option(option, value, named):
    options = {"path": "/tmp/x", "queue": "q", option.lower(): value}
    with pytest.raises(InvalidOptionError, match=f"(?i){named}"):  # Spark lower-cases keys
        parse_sink_options(options)


def test_ring_size_conflicts_are_errors():
    with pytest.raises(InvalidOptionError, match="ringSize"):
        parse_sink_options({"path": "/p", "ringsize": "3", "overflow": "drop-head"})
    with pytest.raises(InvalidOptionError, match="maxLength"):
        parse_sink_options({"path": "/p", "ringsize": "3", "maxlength": "4"})


def test_options_are_case_insensitive_and_none_is_unlimited():
    parsed = parse_sink_options(
        {"PATH": "/p", "Queue": "q", "MAXLENGTH": "None", "overflow": "Reject-Publish"}
    )
    assert parsed.arguments == {"max_length": None, "overflow": "reject-publish"}
    assert parsed.queue == "q"
    with pytest.warns(SparkQueueDeprecationWarning, match=r"^maxLength='-1' for none"):
        assert parse_sink_options({"path": "/p", "maxlength": "-1"}).arguments == {
            "max_length": None
        }


@pytest.mark.parametrize(("option", "value", "named"), BAD_OPTIONS[::3])
def test_bad_option_fails_the_spark_write_and_writes_nothing(
    spark, queue_path, option, value, named
):
    QueueTable(queue_path).declare("q")
    version = QueueTable(queue_path).store.open().version()
    options = {"queue": "q", option: value}
    with pytest.raises(Exception, match=f"(?i){named}"):
        write_batch(messages(spark, ["a"]), queue_path, **options)
    assert QueueTable(queue_path).store.open().version() == version


@pytest.mark.connect
def test_missing_body_unknown_column_and_wrong_type(spark, queue_path):
    QueueTable(queue_path).declare("q")
    version = QueueTable(queue_path).store.open().version()
    no_body = spark.createDataFrame([("x",)], "payload string")
    with pytest.raises(Exception, match="no 'body' column"):
        write_batch(no_body, queue_path, queue="q")
    unknown = spark.createDataFrame([("x", "y")], "body string, colour string")
    with pytest.raises(Exception, match="unknown column 'colour'"):
        write_batch(unknown, queue_path, queue="q")
    wrong = spark.createDataFrame([("x", "high")], "body string, priority string")
    with pytest.raises(Exception, match="column 'priority' has type string"):
        write_batch(wrong, queue_path, queue="q")
    assert QueueTable(queue_path).store.open().version() == version


def test_null_body_or_missing_queue_fails_and_leaves_no_files(spark, queue_path, tmp_path):
    QueueTable(queue_path).declare("q")
    version = QueueTable(queue_path).store.open().version()
    null_body = spark.createDataFrame([("a",), (None,)], "body string").coalesce(1)
    with pytest.raises(Exception, match="'body' is null"):
        write_batch(null_body, queue_path, queue="q")
    no_queue = messages(spark, ["a"])
    with pytest.raises(Exception, match="option 'queue'"):
        write_batch(no_queue, queue_path)
    assert QueueTable(queue_path).store.open().version() == version
    staged = list((tmp_path / "queues" / "record=message").glob("*.parquet"))
    assert staged == []  # the failed task removed what it had staged


@pytest.mark.connect
def test_a_write_with_no_queue_fails_before_any_task_runs(spark, queue_path, tmp_path):
    """Neither the option nor a column: refused on the driver side, where the writer is made
    with the schema, as every other bad option is (a task would fail twice over, with a JVM
    stack trace per attempt)."""
    QueueTable(queue_path).declare("q")
    version = QueueTable(queue_path).store.open().version()
    ran = str(tmp_path / "a-task-ran")

    @F.udf("string")
    def body(value: str) -> str:
        os.makedirs(ran, exist_ok=True)
        return value

    rows = spark.range(2).select(body(F.col("id").cast("string")).alias("body"))
    with pytest.raises(Exception) as failed:
        write_batch(rows, queue_path)
    text = str(failed.value)
    assert "InvalidInputError: no queue for the rows: set the option 'queue'" in text, text
    assert not os.path.exists(ran)
    assert QueueTable(queue_path).store.open().version() == version


def test_redeclare_with_another_value_shows_both(spark, queue_path):
    write_batch(messages(spark, ["a"]), queue_path, queue="q", maxLength=5)
    version = QueueTable(queue_path).store.open().version()
    with pytest.raises(Exception, match=r"maxLength: queue has 5, given 6"):
        write_batch(messages(spark, ["b"]), queue_path, queue="q", maxLength=6)
    with pytest.raises(ArgumentMismatchError, match="overflow"):
        QueueTable(queue_path).declare("q", overflow="ring")
    assert QueueTable(queue_path).store.open().version() == version
    # Arguments not given leave the queue as it is.
    write_batch(messages(spark, ["c"]), queue_path, queue="q")
    assert QueueTable(queue_path).arguments("q").max_length == 5
    assert bodies(spark, queue_path, "q") == ["a", "c"]


@pytest.mark.parametrize(
    "parse",
    [
        parse_sink_options,
        lambda options: parse_source_options({**options, "queue": "q"}),
        parse_browse_options,
    ],
    ids=["sink", "source", "browse"],
)
def test_a_relative_path_is_refused_and_an_absolute_one_or_a_uri_taken(parse):
    for relative in ("lake/queues", "./queues", "queues", "file:queues"):
        with pytest.raises(InvalidOptionError, match="option 'path' must be an absolute"):
            parse({"path": relative})
    for taken in ("/lake/queues", "s3://bucket/queues", "file:///lake/queues"):
        assert parse({"path": taken}).path == taken


def test_a_spark_write_to_a_relative_path_fails_and_writes_nowhere(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="option 'path' must be an absolute local path"):
        write_batch(messages(spark, ["a"]), "relative-queues", queue="q")
    with pytest.raises(Exception, match="option 'path' must be an absolute local path"):
        spark.read.format("ringqueue").load("relative-queues").collect()
    assert list(tmp_path.iterdir()) == []


def test_path_holding_a_non_queue_delta_table(spark, tmp_path):
    path = str(tmp_path / "plain")
    spark.range(3).write.format("delta").save(path)
    with pytest.raises(Exception, match="not a spark-queue table"):
        write_batch(messages(spark, ["a"]), path, queue="q")
    assert spark.read.format("delta").load(path).count() == 3
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count()
    assert history == 1
    with pytest.raises(Exception, match="not a spark-queue table"):
        spark.read.format("ringqueue").load(path).collect()


def test_overwrite_mode_is_refused(spark, queue_path):
    with pytest.raises(Exception, match="only appends"):
        messages(spark, ["a"]).write.format("ringqueue").mode("overwrite").option(
            "queue", "q"
        ).save(queue_path)


def test_browse_unknown_queue(spark, queue_path):
    QueueTable(queue_path).declare("q")
    with pytest.raises(Exception, match="queue 'nope' does not exist"):
        spark.read.format("ringqueue").option("queue", "nope").load(queue_path).collect()


def test_priority_out_of_int_range(spark, queue_path):
    df = messages(spark, ["a"]).withColumn("priority", F.lit(2**40))
    with pytest.raises(Exception, match="priority"):
        write_batch(df, queue_path, queue="q")
