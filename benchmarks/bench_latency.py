"""End-to-end latency, commit to delivery, of a streaming consumer against plain Delta.

A producer process commits a small batch every ``--interval`` seconds; a streaming query
(``processingTime`` 0, ``foreachBatch``) collects each micro-batch in the driver. A batch's
latency is the moment the query holds its rows minus the moment its producer's commit
returned (one clock: one machine). Two pipelines, in one Spark application, taking turns:

- **ringqueue**: ``QueueTable.publish`` into a queue, ``readStream.format("ringqueue")``
  (at-least-once: each micro-batch also acknowledges the one before);
- **ringqueue-driver**: the same with ``readMode=driver`` (each batch read by the driver's
  source worker as it is leased; no executor Python worker);
- **delta**: ``deltalake.write_deltalake(mode="append")`` into a plain Delta table,
  ``readStream.format("delta")``.

With ``--producer spark`` the producer is the consuming session itself:
a thread writes a DataFrame of ``--messages`` rows (one, say) every ``--interval``
seconds with ``df.write.format("ringqueue")`` or ``df.write.format("delta")``, and a batch's
latency runs from the write call's return. Delta's reader then learns of the write from its
own JVM's log cache, which a Python data source cannot share.

Goal: p50 and p90 ratios ringqueue / delta <= 1.0, also with ``--producer spark
--messages 1``.

With ``--reader-paths`` it times Spark's micro-batch phases for two toy sources of one row per
trigger, one read by executor tasks and one whose rows come with the plan (PySpark's simple
stream reader, which ``readMode=driver`` uses): what the read path alone costs a batch.

With ``--source-steps`` it runs no Spark: it times the ringqueue source's own steps, as the
driver's source worker and a read task call them, on a queue that gets one message per
micro-batch (an idle ``latestOffset``, one that acknowledges and leases, ``partitions``,
``read``), so that the part of a batch's latency spent in the connector's code is known.

    .venv/bin/python benchmarks/bench_latency.py [--seconds 60] [--turns 2]
        [--interval 0.5] [--messages 100] [--producer process|spark] [--source-steps]
        [--reader-paths]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from common import ROOT, attempts_by_operation, median, percentile, write_results

# ringqueue-driver: the same consumer with ``readMode=driver`` (its batches read in the
# driver's source worker, no executor Python).
PIPELINES = ("ringqueue", "ringqueue-driver", "delta")


def paced(seconds: float, interval: float, write: Callable[[int], None]) -> dict:
    """``write(batch)`` every ``interval`` s for ``seconds``; returns {batch: (the time its
    write was called, the time it returned)}."""
    written: dict[int, tuple[float, float]] = {}
    started = time.monotonic()
    batch = 0
    while time.monotonic() - started < seconds:
        due = started + batch * interval
        time.sleep(max(0.0, due - time.monotonic()))
        called = time.time()
        write(batch)
        written[batch] = (called, time.time())
        batch += 1
    return written


def produce(pipeline: str, path: str, seconds: float, interval: float, messages: int) -> dict:
    """The producer process: one batch every ``interval`` s; returns {batch: commit time}."""
    from deltalake import write_deltalake

    from spark_queue import QueueTable

    table = QueueTable(path) if pipeline.startswith("ringqueue") else None

    def write(batch: int) -> None:
        rows = pa.table(
            {
                "body": pa.array([os.urandom(200) for _ in range(messages)], pa.binary()),
                "key": pa.array([str(batch)] * messages, pa.string()),
            }
        )
        if table is not None:
            table.publish("q", rows)
        else:
            write_deltalake(path, rows, mode="append")

    return paced(seconds, interval, write)


def produce_with_spark(
    spark, pipeline: str, path: str, seconds: float, interval: float, messages: int
) -> dict:
    """The producer as a thread of the consuming application: ``df.write`` of a batch
    every ``interval`` s; returns {batch: time the write call returned}."""
    return paced(
        seconds, interval, lambda batch: spark_write(spark, pipeline, path, str(batch), messages)
    )


def spark_write(spark, pipeline: str, path: str, key: str, messages: int) -> None:
    """``df.write`` of ``messages`` rows with ``key`` into the pipeline's table."""
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    schema = StructType(
        [StructField("body", BinaryType(), False), StructField("key", StringType(), False)]
    )
    frame = spark.createDataFrame([(os.urandom(200), key) for _ in range(messages)], schema)
    writer = frame.write.mode("append")
    if pipeline.startswith("ringqueue"):
        writer.format("ringqueue").option("queue", "q").save(path)
    else:
        writer.format("delta").save(path)


def one_turn(
    spark, pipeline: str, work: Path, turn: int, args: argparse.Namespace
) -> tuple[float, dict[str, list[float]]]:
    """Run one pipeline for ``args.seconds``; returns the warm-up batch's latency and the
    latencies of the producer's batches."""
    from deltalake import write_deltalake

    from spark_queue import QueueTable

    path = str(work / f"{pipeline}-{turn}")
    if pipeline.startswith("ringqueue"):
        QueueTable(path).declare("q")
        reader = (
            spark.readStream.format("ringqueue")
            .option("path", path)
            .option("queue", "q")
            .option("consumer", "latency")
            .option("readMode", "driver" if pipeline.endswith("driver") else "executors")
        )
    else:
        empty = pa.table({"body": pa.array([], pa.binary()), "key": pa.array([], pa.string())})
        write_deltalake(path, empty)
        reader = spark.readStream.format("delta").option("path", path)
    delivered: dict[int, float] = {}

    def collect(frame, _batch_id: int) -> None:
        keys = [row.key for row in frame.select("key").distinct().collect()]
        now = time.time()
        for key in keys:
            delivered.setdefault(int(key), now)

    query = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(work / f"checkpoint-{pipeline}-{turn}"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    # One warm-up batch, not counted: a query's first batch starts its Python workers
    # (ringqueue) or its Delta log reader (delta), ~1.5-2.5 s that steady state never pays.
    warm_up = pa.table({"body": pa.array([b"warm-up"], pa.binary()), "key": pa.array(["-1"])})
    if args.producer == "spark":  # its writers warmed up too
        spark_write(spark, pipeline, path, "-1", 1)
    elif pipeline.startswith("ringqueue"):
        QueueTable(path).publish("q", warm_up)
    else:
        write_deltalake(path, warm_up, mode="append")
    warm_up_committed = time.time()
    while -1 not in delivered:
        query.processAllAvailable()
    first_batch = delivered.pop(-1) - warm_up_committed
    if args.producer == "spark":
        produced: list[dict] = []
        writer = threading.Thread(
            target=lambda: produced.append(
                produce_with_spark(
                    spark, pipeline, path, args.seconds, args.interval, args.messages
                )
            )
        )
        writer.start()
        while writer.is_alive():  # the query runs on its own trigger; this only waits
            writer.join(0.5)
        committed = produced[0]
    else:
        context = multiprocessing.get_context("spawn")
        with context.Pool(1) as pool:
            committed = pool.apply(
                produce, (pipeline, path, args.seconds, args.interval, args.messages)
            )
    deadline = time.time() + 60
    while len(delivered) < len(committed) and time.time() < deadline:
        query.processAllAvailable()
    query.stop()
    missing = set(committed) - set(delivered)
    assert not missing, f"{pipeline}: batches never delivered: {sorted(missing)[:5]}"
    if pipeline.startswith("ringqueue"):
        for operation, attempts in attempts_by_operation(path).items():
            print(
                f"turn {turn}: {len(attempts)} {operation} commits, "
                f"{statistics.mean(attempts):.3f} attempts each (max {max(attempts)})"
            )
    return first_batch, {
        "return": [delivered[b] - committed[b][1] for b in sorted(committed)],
        "start": [delivered[b] - committed[b][0] for b in sorted(committed)],
    }


def source_steps(batches: int = 100) -> None:
    """Time the source's steps outside Spark (see the module docstring)."""
    sys.path.insert(0, str(ROOT))
    from pyspark.sql.datasource import ReadAllAvailable

    from spark_queue import QueueTable
    from spark_queue.spark.options import parse_source_options
    from spark_queue.spark.source import RingQueueStreamReader

    with tempfile.TemporaryDirectory(prefix="bench-latency-steps-") as folder:
        path = f"{folder}/queues"
        table = QueueTable(path)
        table.publish("q", ["warm-up"])
        options = parse_source_options({"path": path, "queue": "q", "consumer": "c"})
        reader = RingQueueStreamReader(options)
        limit = ReadAllAvailable()
        start = reader.latestOffset(reader.initialOffset(), limit)
        # As Spark calls them: the trigger after a batch acknowledges it (nothing new yet),
        # later ones find nothing, and the one after a publish leases it.
        steps: dict[str, list[float]] = {
            "latestOffset acknowledging the last batch, nothing new (a commit)": [],
            "latestOffset, nothing to do (an idle trigger)": [],
            "latestOffset leasing the new message (a commit)": [],
            "partitions": [],
            "read (the task's work)": [],
        }
        timings = list(steps.values())

        def timed(index: int, call: Callable[..., Any], *args: Any) -> Any:
            began = time.perf_counter()
            result = call(*args)
            timings[index].append(time.perf_counter() - began)
            return result

        def read_all(partitions: list) -> int:
            return sum(b.num_rows for p in partitions for b in reader.read(p))

        for n in range(batches):
            timed(0, reader.latestOffset, start, limit)
            timed(1, reader.latestOffset, start, limit)
            table.publish("q", [f"m{n}"])
            end = timed(2, reader.latestOffset, start, limit)
            partitions = timed(3, reader.partitions, start, end)
            assert timed(4, read_all, partitions) == 1
            start = end
    print(f"the source's steps, {batches} micro-batches of one message, local disk")
    print("| step | p50 ms | p90 ms |")
    print("|---|---|---|")
    for step, values in steps.items():
        print(
            f"| {step} | {1000 * statistics.median(values):.1f} | "
            f"{1000 * percentile(values, 0.9):.1f} |"
        )


def reader_paths(seconds: float = 20.0) -> None:
    """Spark's micro-batch phases for two toy Python sources that deliver one new row per
    trigger: one whose rows executor tasks read (``streamReader``), one whose rows come with
    the plan (``simpleStreamReader``, as ``readMode=driver``). No table: what each path
    costs Spark alone."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    sys.path.insert(0, str(ROOT))
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamReader,
        InputPartition,
        SimpleDataSourceStreamReader,
    )

    from spark_queue import local_session

    def rows(first: int, stop: int) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"v": pa.array(range(first, stop), pa.int64())})

    class Span(InputPartition):
        def __init__(self, first: int, stop: int) -> None:
            self.first, self.stop = first, stop

    class TaskRead(DataSourceStreamReader):
        def __init__(self) -> None:
            self.latest = 0

        def initialOffset(self) -> dict:
            return {"n": 0}

        def latestOffset(self) -> dict:
            self.latest += 1
            return {"n": self.latest}

        def partitions(self, start: dict, end: dict) -> list:
            return [Span(start["n"], end["n"])]

        def read(self, partition: Span):  # type: ignore[override]
            yield rows(partition.first, partition.stop)

    class PlanRead(SimpleDataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"n": 0}

        def read(self, start: dict):  # type: ignore[override]
            return iter([rows(start["n"], start["n"] + 1)]), {"n": start["n"] + 1}

        def readBetweenOffsets(self, start: dict, end: dict):  # type: ignore[override]
            return iter([rows(start["n"], end["n"])])

    class TaskSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "toy_tasks"

        def schema(self) -> str:
            return "v long"

        def streamReader(self, schema):  # type: ignore[override]
            return TaskRead()

    class PlanSource(TaskSource):
        @classmethod
        def name(cls) -> str:
            return "toy_plan"

        def streamReader(self, schema):  # type: ignore[override]
            from pyspark.errors import PySparkNotImplementedError

            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )

        def simpleStreamReader(self, schema):  # type: ignore[override]
            return PlanRead()

    spark = local_session("bench-latency-reader-paths")
    spark.dataSource.register(TaskSource)
    spark.dataSource.register(PlanSource)
    print(f"median ms per micro-batch of one row, {seconds:.0f} s each, first 5 batches left out")
    print("| source | batches | latestOffset | walCommit | addBatch | commitOffsets | trigger |")
    print("|---|---|---|---|---|---|---|")
    for source in ("toy_tasks", "toy_plan") * 2:  # two turns each
        query = (
            spark.readStream.format(source)
            .load()
            .writeStream.foreachBatch(lambda frame, _id: frame.collect())
            .trigger(processingTime="0 seconds")
            .start()
        )
        time.sleep(seconds)  # a toy source always has a row: no trigger is idle
        progress = query.recentProgress[5:]
        query.stop()
        phases = ["latestOffset", "walCommit", "addBatch", "commitOffsets", "triggerExecution"]
        medians = [statistics.median(p["durationMs"][k] for p in progress) for k in phases]
        print(f"| {source} | {len(progress)} | {' | '.join(f'{m:.0f}' for m in medians)} |")
    spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per pipeline and turn")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--messages", type=int, default=100, help="per producer batch")
    parser.add_argument(
        "--producer",
        choices=["process", "spark"],
        default="process",
        help="a process committing with delta-rs and QueueTable, or df.write in this session",
    )
    parser.add_argument(
        "--source-steps", action="store_true", help="time the source's steps, without Spark"
    )
    parser.add_argument(
        "--reader-paths",
        action="store_true",
        help="Spark's micro-batch phases for toy sources read by tasks or with the plan",
    )
    args = parser.parse_args()
    if args.source_steps:
        source_steps()
        return
    if args.reader_paths:
        reader_paths()
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    sys.path.insert(0, str(ROOT))
    from spark_queue import local_session

    spark = local_session("bench-latency")
    # From the write call's return (the goal's measure), and from its start: a write
    # may return after its commit is already visible (Delta's did, by up to 0.75 s).
    latencies: dict[str, dict[str, list[float]]] = {
        since: {p: [] for p in PIPELINES} for since in ("return", "start")
    }
    first_batches: dict[str, list[float]] = {p: [] for p in PIPELINES}
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as folder:
        for turn in range(args.turns):
            for pipeline in PIPELINES:
                first, measured = one_turn(spark, pipeline, Path(folder), turn, args)
                first_batches[pipeline].append(first)
                for since, values in measured.items():
                    latencies[since][pipeline] += values
    spark.stop()
    summary = {
        since: {
            p: {
                "batches": len(values),
                "min": min(values),
                "p50": median(values),
                "p90": percentile(values, 0.90),
                "p99": percentile(values, 0.99),
                "max": max(values),
                "first_batch": first_batches[p],
            }
            for p, values in by_pipeline.items()
        }
        for since, by_pipeline in latencies.items()
    }
    print(
        f"{args.turns} turns x {args.seconds:.0f} s per pipeline; a batch of {args.messages} "
        f"every {args.interval} s, written by {args.producer}"
    )
    for since, by_pipeline in summary.items():
        print(f"\nlatency from the write call's {since}")
        print("| pipeline | batches | min s | p50 s | p90 s | p99 s | max s | warm-up batch s |")
        print("|---|---|---|---|---|---|---|---|")
        for p, s in by_pipeline.items():
            print(
                f"| {p} | {s['batches']} | {s['min']:.3f} | {s['p50']:.3f} | {s['p90']:.3f} | "
                f"{s['p99']:.3f} | {s['max']:.3f} | "
                f"{', '.join(f'{v:.2f}' for v in s['first_batch'])} |"
            )
        delta = by_pipeline["delta"]
        for p in PIPELINES[:-1]:
            ring = by_pipeline[p]
            print(
                f"| ratio {p} / delta | | | {ring['p50'] / delta['p50']:.2f} | "
                f"{ring['p90'] / delta['p90']:.2f} | {ring['p99'] / delta['p99']:.2f} | "
                f"{ring['max'] / delta['max']:.2f} | |"
            )
    target = write_results(
        f"latency-{args.producer}.json",
        {"arguments": vars(args), "summary": summary, "latencies": latencies},
        show=False,
    )
    print(f"figures: {target}")


if __name__ == "__main__":
    main()
