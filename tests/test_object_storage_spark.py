"""Spark on a queue table in a local S3-compatible server (moto's): the sink, the streaming
consumer, and delta-spark reading the table through S3A. Storage options reach the Python
workers as ``storage.<KEY>`` options; the ``AWS_*`` environment is cleared."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import time
import urllib.parse
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from spark_queue import QueueTable
from spark_queue.model.partitions import partition_of, partition_uri
from spark_queue.model.queue_arguments import READ_MODES
from spark_queue.rules import identity_holds
from spark_queue.spark.session import configure_s3a
from tests.crash import forget_commit
from tests.helpers import messages, write_batch
from tests.latency_proxy import LatencyProxy, in_a_row
from tests.object_store import SECRET_KEY, RequestLog
from tests.test_commit_requests import requests, touched

pytestmark = pytest.mark.spark


def storage(options: dict[str, str]) -> dict[str, str]:
    """Storage options as data source options (the spelling is case-insensitive)."""
    return {f"storage.{key.lower()}": value for key, value in options.items()}


def test_batch_and_streaming_sink_on_s3_with_an_exactly_once_replay(
    spark: SparkSession, s3_table: str, s3_options: dict[str, str], tmp_path: Path
) -> None:
    write_batch(messages(spark, ["b0", "b1"]), s3_table, queue="orders", **storage(s3_options))

    source = tmp_path / "in"
    messages(spark, [f"s{i}" for i in range(6)]).write.parquet(str(source))
    checkpoint = tmp_path / "checkpoint"

    def run_stream() -> None:
        stream = spark.readStream.schema("body string").parquet(str(source))
        writer = stream.writeStream.format("ringqueue").option("queue", "orders")
        query = (
            writer.options(**storage(s3_options))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start(s3_table)
        )
        query.awaitTermination()
        assert query.exception() is None
        assert SECRET_KEY not in json.dumps(query.lastProgress, default=str)

    run_stream()
    # As if the driver died after the Delta commit and before Spark's commit log: the
    # batch runs again, and its application transaction makes it a no-op.
    (checkpoint / "commits" / "0").unlink()
    shutil.rmtree(checkpoint / "commits" / ".0.crc", ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (checkpoint / "commits" / ".0.crc").unlink()
    run_stream()

    table = QueueTable(s3_table, storage_options=s3_options)
    stats = table.stats("orders")
    assert stats["added"] == 8 and stats["ready"] == 8 and identity_holds(stats)
    bodies = [bytes(b).decode() for b in table.peek("orders", limit=10).column("body")]
    assert bodies == ["b0", "b1", *(f"s{i}" for i in range(6))]


def test_the_sink_on_a_partitioned_queue_on_s3_replays_exactly_once_and_delta_reads_each(
    spark: SparkSession, s3_table: str, s3_options: dict[str, str], tmp_path: Path
) -> None:
    sink = {"queue": "orders", "partitions": "3", **storage(s3_options)}
    rows = [(f"b{i}", f"key-{i}") for i in range(30)]
    batch = spark.createDataFrame(rows, "body string, key string").coalesce(2)
    write_batch(batch, s3_table, **sink)
    source = tmp_path / "in"
    spark.createDataFrame(
        [(f"s{i}", f"key-{i}") for i in range(30)], "body string, key string"
    ).coalesce(2).write.parquet(str(source))
    checkpoint = tmp_path / "checkpoint"
    for run in range(2):
        stream = spark.readStream.schema("body string, key string").parquet(str(source))
        query = (
            stream.writeStream.format("ringqueue")
            .options(**sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start(s3_table)
        )
        query.awaitTermination()
        assert query.exception() is None
        if run == 0:  # the driver died after the commits, before Spark's commit log
            forget_commit(checkpoint, 0)

    table = QueueTable(s3_table, storage_options=s3_options)
    added = [stats["added"] for stats in table.partition_stats("orders")]
    assert sum(added) == 60 and all(added)
    configure_s3a(spark, s3_options)
    for partition in range(3):
        uri = partition_uri(s3_table, "orders", partition)
        by_rs = DeltaTable(uri, storage_options=s3_options).to_pyarrow_table(
            columns=["seq"], filters=[("record", "=", "message")]
        )
        s3a = uri.replace("s3://", "s3a://", 1)
        by_spark = spark.read.format("delta").load(s3a).where("record = 'message'").count()
        assert by_rs.num_rows == by_spark == added[partition]
        assert set(partition_of(np.array(by_rs["seq"].to_pylist())).tolist()) == {partition}
    leased = table.lease("orders", "check", max_messages=None)
    bodies = sorted(bytes(b).decode() for b in leased["body"].to_pylist())
    assert bodies == sorted([f"b{i}" for i in range(30)] + [f"s{i}" for i in range(30)])


def consumer(spark: SparkSession, uri: str, options: dict[str, str], **settings: Any) -> DataFrame:
    """A streaming read of queue ``jobs`` with the data source options ``settings``."""
    reader = spark.readStream.format("ringqueue").option("queue", "jobs")
    return reader.options(**settings, **storage(options)).load(uri)


@pytest.mark.parametrize("read_mode", READ_MODES)
def test_streaming_consumer_on_s3(
    spark: SparkSession, s3_table: str, s3_options: dict[str, str], tmp_path: Path, read_mode: str
) -> None:
    table = QueueTable(s3_table, storage_options=s3_options)
    table.publish("jobs", [f"j{i}" for i in range(50)])
    reader = consumer(
        spark,
        s3_table,
        s3_options,
        consumer="s3-worker",
        maxMessagesPerTrigger=20,
        readMode=read_mode,
    )
    output = tmp_path / "out"
    query = (
        reader.select("seq", "body")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start(str(output))
    )
    query.awaitTermination()
    assert query.exception() is None
    explained = io.StringIO()
    with contextlib.redirect_stdout(explained):
        query.explain(extended=True)
    assert SECRET_KEY not in explained.getvalue()
    assert SECRET_KEY not in json.dumps(query.recentProgress, default=str)

    delivered = spark.read.parquet(str(output)).orderBy("seq").collect()
    assert [bytes(r.body).decode() for r in delivered] == [f"j{i}" for i in range(50)]
    stats = table.stats("jobs")
    assert stats["ready"] == 0 and stats["leased"] + stats["acked"] == 50
    assert identity_holds(stats)


def _live_messages_sql(spark: SparkSession, uri: str) -> DataFrame:
    """docs/DESIGN.md's SQL view of the messages now in the queues."""
    return spark.sql(
        f"""
        SELECT m.* FROM delta.`{uri}` m
        LEFT ANTI JOIN (SELECT queue, seq FROM delta.`{uri}` WHERE record = 'removal') r
          USING (queue, seq)
        WHERE m.record = 'message'
        """
    )


def test_delta_spark_reads_a_queue_table_on_s3(
    spark: SparkSession, s3_table: str, s3_options: dict[str, str]
) -> None:
    table = QueueTable(s3_table, storage_options=s3_options)
    table.declare("ring", ring_size=3)
    table.publish("ring", [f"r{i}" for i in range(5)])  # r0 and r1 evicted
    configure_s3a(spark, s3_options)
    s3a = s3_table.replace("s3://", "s3a://", 1)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{s3a}`").collect()
    assert len(history) == table.store.open().version() + 1

    by_sql = _live_messages_sql(spark, s3a).selectExpr("seq", "CAST(body AS STRING) AS body")
    browsed = (
        spark.read.format("ringqueue")
        .option("queue", "ring")
        .options(**storage(s3_options))
        .load(s3_table)
        .selectExpr("seq", "CAST(body AS STRING) AS body")
    )
    assert_df_equality(by_sql, browsed, ignore_row_order=True)
    assert sorted(r.body for r in browsed.collect()) == ["r2", "r3", "r4"]
    # s3:// is mapped to S3A too: one URI serves the connector and delta-spark.
    assert spark.read.format("delta").load(s3_table).count() == (
        spark.read.format("delta").load(s3a).count()
    )


def batches(found: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """Requests cut after each log entry's PUT: one list per commit (and what follows)."""
    cut: list[list[tuple[str, str]]] = [[]]
    for request in found:
        cut[-1].append(request)
        if request[0] == "PUT" and request[1].startswith("log "):
            cut.append([])
    return cut


def test_a_stream_sinks_micro_batch_commits_its_files_and_one_entry_reading_none_back(
    spark: SparkSession,
    s3_table: str,
    s3_options: dict[str, str],
    s3_requests: RequestLog,
    tmp_path: Path,
) -> None:
    """A warm micro-batch of the sink: its task stores the message file; the commit stores
    the queue state, then the log entry, and reads neither the staged file (the task
    carries its rows) nor any entry it wrote; planning the batch looks at the entries
    after the last one it knew and at the state the previous commit wrote."""
    QueueTable(s3_table, storage_options=s3_options, broker="off").declare("jobs")
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "0.json").write_text('{"body": "x0"}\n')
    stream = spark.readStream.schema("body string").json(str(landing))
    writer = stream.writeStream.format("ringqueue").options(queue="jobs", **storage(s3_options))
    query = writer.option("checkpointLocation", str(tmp_path / "checkpoint")).start(s3_table)
    try:
        query.processAllAvailable()
        for batch in range(1, 4):
            s3_requests.mark()
            (landing / f"{batch}.json").write_text(f'{{"body": "x{batch}"}}\n')
            query.processAllAvailable()
            found = requests(s3_requests, s3_table)
            entry = found[-1]
            assert entry[0] == "PUT" and entry[1].startswith("log "), found
            version = int(entry[1].split()[1])
            writes = [request for request in found if request[0] == "PUT"]
            assert writes == [("PUT", "message file"), ("PUT", "queue file"), entry], found
            # The planner and the commit may run in two processes: each looks for itself.
            reads = {request for request in found if request[0] != "PUT"}
            assert reads <= {
                ("GET", f"log {version - 1}"),
                ("GET", f"log {version}"),
                ("HEAD", f"log {version - 1}"),  # a look after more than TRUSTED_SECONDS
                ("GET", "queue file"),
            }, found
    finally:
        query.stop()
    bodies = QueueTable(s3_table, storage_options=s3_options).peek("jobs", 10)["body"]
    assert [bytes(b).decode() for b in bodies.to_pylist()] == [f"x{i}" for i in range(4)]


def test_a_stream_sinks_micro_batch_plans_in_two_requests_in_a_row_and_commits_in_two(
    spark: SparkSession,
    proxied_s3_table: str,
    proxied_s3_options: dict[str, str],
    latency_proxy: LatencyProxy,
    tmp_path: Path,
) -> None:
    """Behind a proxy that holds each request: a warm micro-batch's planning (the
    reservation of its seqs, where the commit before it was made by another process) reads
    the next two log entries at once, then the queue state they name, looking meanwhile at
    the entry it moved to where it looked last too long ago; its task stores the message
    file; its commit stores the queue state, then the log entry, after two looks of its own
    where it committed last too long ago."""
    QueueTable(proxied_s3_table, storage_options=proxied_s3_options, broker="off").declare("j")
    bucket = urllib.parse.urlsplit(proxied_s3_table).netloc
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "0.json").write_text('{"body": "x0"}\n')
    stream = spark.readStream.schema("body string").json(str(landing))
    writer = stream.writeStream.format("ringqueue").options(
        queue="j", **storage(proxied_s3_options)
    )
    query = writer.option("checkpointLocation", str(tmp_path / "checkpoint")).start(
        proxied_s3_table
    )
    try:
        query.processAllAvailable()
        for batch in range(1, 4):
            latency_proxy.quiet(bucket, 0.3)
            (landing / f"{batch}.json").write_text(f'{{"body": "x{batch}"}}\n')
            with latency_proxy.counting(bucket) as trips:
                query.processAllAvailable()
            found = sorted(trips.requests, key=lambda r: r.start)
            task = [r for r in found if r.method == "PUT" and "record%3Dmessage" in r.target]
            assert len(task) == 1, str(trips)
            planning = [r for r in found if r.end <= task[0].start]
            commit = [r for r in found if r.start >= task[0].end]
            assert len(planning) + len(commit) + 1 == len(found), str(trips)
            looked = any(r.method == "HEAD" for r in planning)
            assert (len(planning), in_a_row(planning)) == (3 + looked, 2), str(trips)
            assert [r.method for r in planning].count("GET") == 3, str(trips)
            looks = [r for r in commit if r.method != "PUT"]
            assert [r.method for r in looks] in ([], ["GET", "HEAD"]), str(trips)
            assert [r.method for r in commit if r.method == "PUT"] == ["PUT"] * 2, str(trips)
            assert in_a_row(commit) == 2 + len(looks), str(trips)
    finally:
        query.stop()
    bodies = QueueTable(proxied_s3_table, storage_options=proxied_s3_options).peek("j", 10)
    assert [bytes(b).decode() for b in bodies["body"].to_pylist()] == [f"x{i}" for i in range(4)]


@pytest.mark.parametrize("read_mode", READ_MODES)
def test_a_stream_sources_batch_leases_in_its_files_and_one_entry_and_reads_each_file_once(
    spark: SparkSession,
    s3_table: str,
    s3_options: dict[str, str],
    s3_requests: RequestLog,
    tmp_path: Path,
    read_mode: str,
) -> None:
    """Each micro-batch of a streaming consumer, after its first: acknowledge and lease in
    one commit (its state files, then its log entry), and read the batch's small message
    file in one GET at most; no entry it wrote is read back. Looks at the log (the next
    entry, then its own) come only where a batch waited past the moment it trusts."""
    table = QueueTable(s3_table, storage_options=s3_options, broker="off")
    table.publish("jobs", [f"j{i}" for i in range(8)])
    reader = consumer(
        spark, s3_table, s3_options, consumer="w", maxMessagesPerTrigger=2, readMode=read_mode
    )
    s3_requests.mark()
    query = (
        reader.writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start(str(tmp_path / "out"))
    )
    query.awaitTermination()
    assert query.exception() is None
    commits = batches(requests(s3_requests, s3_table))
    first = int(commits[0][-1][1].split()[1])  # the first lease's entry, after the load
    assert len(commits) == 1 + 5  # four batches and the one that acknowledges the last
    for number, commit in enumerate(commits[1:-1], start=1):
        version = first + number
        assert commit[-1] == ("PUT", f"log {version}"), commit
        files = sorted(what for method, what in commit[:-1] if method == "PUT")
        assert set(files) <= {"queue file", "lease file", "removal file"}, commit
        assert len(files) == len(set(files)) and "queue file" in files, commit
        reads = [request for request in commit if request[0] != "PUT"]
        looks = [("GET", f"log {version}"), ("HEAD", f"log {version - 1}")]
        assert [r for r in reads if r not in looks] in ([], [("GET", "message file")]), commit
    assert commits[-1] == [], commits[-1]
    assert table.stats("jobs")["acked"] == 8


def test_a_stream_sources_lease_after_a_publish_reads_the_present_at_once_and_commits_in_two(
    spark: SparkSession,
    proxied_s3_table: str,
    proxied_s3_options: dict[str, str],
    s3_options: dict[str, str],
    latency_proxy: LatencyProxy,
    tmp_path: Path,
) -> None:
    """Behind a proxy that holds each request: a running query's source, its last batch
    acknowledged, finds the entry another process's publish added, reads the entry after
    it together with the queue state and the message file it names, then commits the
    lease: its files at once, then its entry. 7 requests, 4 in a row, from the look that
    found the publish to the lease's entry (looks that found nothing come before it), in
    each batch after the first."""
    uri = proxied_s3_table
    bucket = urllib.parse.urlsplit(uri).netloc
    producer = QueueTable(uri, storage_options=s3_options, broker="off")  # not counted
    producer.declare("jobs")
    reader = consumer(spark, uri, proxied_s3_options, consumer="w")
    query = (
        reader.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        for batch in range(3):
            while producer.stats("jobs")["acked"] < 10 * batch:  # the last batch acknowledged
                assert query.exception() is None, query.exception()
                time.sleep(0.05)
            started = time.time()
            producer.publish("jobs", [f"j{batch}.{i}" for i in range(10)])
            version = producer.store.view(probe=False).version
            query.processAllAvailable()
            if not batch:  # the query's start: it loads the table
                continue
            # A look sent just before the publish landed may find it: the proxy holds it.
            trips = latency_proxy.between(started - 1, time.time(), bucket)
            found = sorted(trips.requests, key=lambda r: r.start)
            looks = [r for r in found if touched(r.target, uri) == f"log {version}"]
            assert looks and looks[-1].status == 200, str(trips)
            first = looks[-1]
            entries = [r for r in found if r.method == "PUT" and r.start > first.start]
            entry = next(r for r in entries if "_delta_log" in r.target)
            assert touched(entry.target, uri) == f"log {version + 1}", str(trips)
            lease = [r for r in found if first.start <= r.start and r.end <= entry.end]
            assert sorted((r.method, touched(r.target, uri)) for r in lease) == sorted(
                [
                    ("GET", f"log {version}"),
                    ("GET", f"log {version + 1}"),
                    ("GET", "queue file"),
                    ("GET", "message file"),
                    ("PUT", "queue file"),
                    ("PUT", "lease file"),
                    ("PUT", f"log {version + 1}"),
                ]
            ), str(trips)
            assert (len(lease), in_a_row(lease)) == (7, 4), str(trips)
    finally:
        query.stop()
