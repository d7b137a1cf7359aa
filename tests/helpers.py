"""Shared test helpers: writing messages through the real sink, reading them back."""

from __future__ import annotations

import time
from pathlib import Path

from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_queue import QueueTable
from spark_queue.commit.maintenance import cleanup_log
from spark_queue.rules import identity_holds
from spark_queue.storage.location import Location
from spark_queue.storage.table_view import TRUSTED_SECONDS


def set_table_property(path: str, key: str, value: str) -> None:
    """Set a table property as docs/MAINTENANCE.md says to: with delta-rs (never a Spark
    ``ALTER TABLE`` on a live table), which takes a property it does not know (the
    ``spark_queue.*`` ones) only with ``raise_if_not_exists=False``."""
    from deltalake import DeltaTable

    DeltaTable(path).alter.set_table_properties({key: value}, raise_if_not_exists=False)


def cut_log(path: str) -> list[str]:
    """Log cleanup of every entry before the newest checkpoint, in place of waiting for them
    to age past the retention and the floor; returns the names deleted. It waits until the
    newest entry is ``TRUSTED_SECONDS`` old first: a client (a Spark worker, say) that knew
    the table less than that before takes a missing next entry for one not written yet, as
    the floor makes true, and would commit into the log's past."""
    newest = max(entry.stat().st_mtime for entry in (Path(path) / "_delta_log").glob("*.json"))
    time.sleep(max(0.0, newest + TRUSTED_SECONDS - time.time()))
    return cleanup_log(Location.of(path), retention_hours=0, min_age_seconds=0)


def messages(spark: SparkSession, bodies: list[str], queues: list[str] | None = None) -> DataFrame:
    """A one-partition DataFrame of string bodies (and queues), in this arrival order."""
    if queues is None:
        return spark.createDataFrame([(b,) for b in bodies], "body string").coalesce(1)
    rows = list(zip(bodies, queues, strict=True))
    return spark.createDataFrame(rows, "body string, queue string").coalesce(1)


def write_batch(df: DataFrame, path: str, **options: object) -> None:
    writer = df.write.format("ringqueue").mode("append")
    for key, value in options.items():
        writer = writer.option(key, str(value))
    writer.save(path)


def write_stream(
    spark: SparkSession, df: DataFrame, path: str, tmp: Path, **options: object
) -> None:
    """Enqueue ``df`` through a real streaming query (file source, availableNow)."""
    source = tmp / f"in-{len(list(tmp.glob('in-*')))}"
    df.write.parquet(str(source))
    stream = spark.readStream.schema(df.schema).parquet(str(source))
    writer = stream.writeStream.format("ringqueue").option(
        "checkpointLocation", str(source) + "-checkpoint"
    )
    for key, value in options.items():
        writer = writer.option(key, str(value))
    query = writer.trigger(availableNow=True).start(path)
    query.awaitTermination()
    assert query.exception() is None


def bodies(spark: SparkSession, path: str, queue: str) -> list[str]:
    """The bodies of ``queue`` in delivery order, through the browse read."""
    rows = spark.read.format("ringqueue").option("queue", queue).load(path).collect()
    return [bytes(r.body).decode() for r in rows]


def assert_identity(path: str) -> None:
    """SEMANTICS §4 for every queue of the table (``stats`` checks it and raises)."""
    table = QueueTable(path)
    for name in table.queues():
        assert identity_holds(table.stats(name))


def enqueue(
    spark: SparkSession, tmp: Path, mode: str, df: DataFrame, path: str, **options: object
) -> None:
    if mode == "batch":
        write_batch(df, path, **options)
    else:
        write_stream(spark, df, path, tmp, **options)


def start_consuming(
    spark: SparkSession, queue_path: str, out: Path, checkpoint: Path, queue: str = "q",
    *, columns: tuple[str, ...] = ("queue", "seq", "body", "delivery_count"),
    **options: object,
) -> StreamingQuery:  # fmt: skip
    """Start a query: queue -> Delta table (``columns`` of the stream), availableNow."""
    reader = spark.readStream.format("ringqueue").option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return (
        reader.load(queue_path)
        .select(*columns)
        .writeStream.format("delta")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )


def finish(query: StreamingQuery) -> None:
    """Wait for an availableNow query to stop, and require that it did not fail."""
    query.awaitTermination()
    assert query.exception() is None


def consume(
    spark: SparkSession, queue_path: str, out: Path, checkpoint: Path, queue: str = "q",
    *, columns: tuple[str, ...] = ("queue", "seq", "body", "delivery_count"),
    **options: object,
) -> None:  # fmt: skip
    """Queue -> Delta table (``columns`` of the stream), availableNow, until the query
    stops."""
    finish(start_consuming(spark, queue_path, out, checkpoint, queue, columns=columns, **options))


def output_columns(out: Path, *columns: str) -> list[list]:
    """``columns`` of the Delta table a query wrote, as lists; empty where it wrote no
    batch. Read with delta-rs: a delta-spark read of a small table costs a session ~2 s, and
    the tests that prove delta-spark reads what the connector writes do so themselves."""
    if not (out / "_delta_log").exists():
        return [[] for _ in columns]
    table = DeltaTable(str(out)).to_pyarrow_table(columns=list(columns))
    return [table[column].to_pylist() for column in columns]


def delivered(out: Path) -> list[str]:
    """The bodies a :func:`consume` query wrote, sorted; none where it wrote no batch."""
    (bodies,) = output_columns(out, "body")
    return sorted(body.decode() for body in bodies)
