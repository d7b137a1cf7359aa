"""Produce messages into a ring queue with a streaming query, then print the queue's stats.

Runs as it is on a fresh machine (a local Spark, a local Delta path):

    .venv/bin/python jobs/produce.py

or under spark-submit with ``--master``; see ``--help``. The input is generated (``--messages``
rows split into ``--files`` Parquet files, one micro-batch each) or read from ``--input``
(Parquet files or a Delta table with a ``body`` column and any other sink columns).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from spark_queue import QueueTable, local_session, register  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--path",
        default="/tmp/spark-queue-demo/queues",
        help="queue table location (default: %(default)s)",
    )
    parser.add_argument("--queue", default="demo", help="queue name (default: %(default)s)")
    parser.add_argument(
        "--ring-size", type=int, default=1000, help="ring size of the queue (default: %(default)s)"
    )
    parser.add_argument(
        "--messages", type=int, default=5000, help="generated messages (default: %(default)s)"
    )
    parser.add_argument(
        "--files",
        type=int,
        default=5,
        help="generated input files = micro-batches (default: %(default)s)",
    )
    parser.add_argument("--input", help="read this Parquet folder (or delta:PATH) instead")
    parser.add_argument("--checkpoint", help="checkpoint location (default: beside --path)")
    parser.add_argument("--master", help="Spark master; default: local[2] with Delta set up")
    return parser.parse_args(argv)


def session(master: str | None) -> SparkSession:
    if master is None:
        return local_session(app_name="spark-queue-produce")
    spark = SparkSession.builder.appName("spark-queue-produce").master(master).getOrCreate()
    return register(spark)


def generate(spark: SparkSession, folder: str, messages: int, files: int) -> None:
    (
        spark.range(messages, numPartitions=max(1, files))
        .select(
            F.format_string("message %d", F.col("id")).alias("body"),
            F.concat(F.lit("id-"), F.col("id").cast("string")).alias("message_id"),
        )
        .write.mode("overwrite")
        .parquet(folder)
    )


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    spark = session(args.master)
    with tempfile.TemporaryDirectory(prefix="spark-queue-produce-") as scratch:
        if args.input and args.input.startswith("delta:"):
            stream = spark.readStream.format("delta").load(args.input.removeprefix("delta:"))
        else:
            folder = args.input or f"{scratch}/input"
            if not args.input:
                generate(spark, folder, args.messages, args.files)
            schema = spark.read.parquet(folder).schema
            stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(folder)
        checkpoint = args.checkpoint or f"{scratch}/checkpoint"
        query = (
            stream.writeStream.format("ringqueue")
            .option("queue", args.queue)
            .option("ringSize", args.ring_size)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(args.path)
        )
        query.awaitTermination()
        batches = len(query.recentProgress)
    table = QueueTable(args.path)
    stats = table.stats(args.queue)
    print(f"queue {args.queue!r} in {table.path} after {batches} micro-batches:")
    counts = {k: v for k, v in stats.items() if isinstance(v, int)}
    width = max(len(k) for k in counts)
    for key, value in counts.items():
        print(f"  {key:<{width}}  {value:>12,}")
    print(json.dumps({"queue": args.queue, **stats}))
    spark.stop()
    return stats


if __name__ == "__main__":
    main()
