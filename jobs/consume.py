"""Consume a queue into a Delta table: the queue -> Delta pipeline, exactly once.

A ``ringqueue`` streaming read of ``--queue`` as consumer ``--consumer``, written with
delta-spark's streaming sink to ``--output`` (created on first run, appended after), with
``--checkpoint``. With ``--trigger availableNow`` (the default) it drains what the queue held
at start, in micro-batches bounded by ``--max-messages-per-trigger`` and
``--max-bytes-per-trigger``, prints what it did and stops; with ``processingTime`` it keeps
consuming until the job is stopped.

Why each message lands in the output exactly once (keep ``--checkpoint`` for the life of the
output table):

1. A micro-batch leases its messages to the consumer; the lease (its messages) is the batch's
   end offset, written to the checkpoint's offset log before the batch runs.
2. Delta's sink commits the batch's rows in one transaction carrying (query id, batch id): a
   batch Delta already committed is skipped if Spark runs it again.
3. The leased messages are acknowledged (they leave the queue) only when Spark commits the
   batch, that is after Delta did. If the job dies in between, the restarted query (same
   checkpoint) replays the same batch with the same messages: Delta skips it or commits it
   for the first time; then they are acknowledged.
4. Until acknowledged, no other consumer gets them, unless ``--lease-period`` runs out first:
   then they return to the queue for any consumer (``delivery_count`` + 1), and another
   consumer may deliver them a second time. Set ``--lease-period`` well above the longest
   batch, or leave it unset (leases then last until the consumer acks or is released).

Run one query per consumer name; a fresh checkpoint under an old name starts a new session
and first takes back what that name still held.
"""

from __future__ import annotations

import argparse
import json

from common import (
    add_remote_option,
    add_storage_options,
    add_trigger_options,
    argument_type,
    end_session,
    explain,
    fail,
    job_session,
    positive_int,
    run_query,
    storage_options,
    table_location,
    with_trigger,
)
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from spark_queue import BROWSE_COLUMNS, QueueError, QueueTable

# What a consumer's rows carry; ``state`` is always 'leased' there, so it is not written.
COLUMNS = [name for name in BROWSE_COLUMNS if name != "state"]
BODY_TYPES = ("binary", "string")
PROG = "consume.py"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--path",
        type=table_location,
        required=True,
        help="queue table location (path or URI)",
    )
    add_storage_options(parser)
    add_remote_option(parser)
    parser.add_argument("--queue", required=True, help="the queue to consume")
    parser.add_argument(
        "--consumer", default="default", help="consumer name, one query each (default: default)"
    )
    parser.add_argument("--output", required=True, help="Delta table path the messages go to")
    parser.add_argument(
        "--checkpoint", required=True, help="checkpoint location (keep it with --output)"
    )
    parser.add_argument(
        "--max-messages-per-trigger", type=positive_int, help="messages per micro-batch"
    )
    parser.add_argument(
        "--max-bytes-per-trigger",
        type=positive_int,
        help="body bytes per micro-batch (at least one message is always taken)",
    )
    parser.add_argument(
        "--lease-period",
        type=argument_type("lease_period"),
        help="an unacknowledged lease older than this returns its message to the queue, "
        "e.g. '5 minutes' (default: leases do not expire)",
    )
    parser.add_argument(
        "--filter",
        help="SQL predicate over the message columns: only matching messages are consumed, "
        "e.g. \"headers['region'] = 'eu'\"",
    )
    parser.add_argument(
        "--max-deliveries",
        type=argument_type("max_deliveries"),
        help="kill (dead-letter) a message delivered this many times without an ack",
    )
    parser.add_argument(
        "--columns",
        default=",".join(COLUMNS),
        help="comma-separated message columns to write (default: %(default)s)",
    )
    parser.add_argument(
        "--body-type",
        choices=BODY_TYPES,
        default="binary",
        help="write body as bytes or as UTF-8 text (default: %(default)s)",
    )
    add_trigger_options(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the flags; a bad value exits with status 2 naming the flag."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    unknown = [c for c in args.columns if c not in COLUMNS]
    if unknown or not args.columns:
        parser.error(f"--columns: unknown {unknown or 'empty list'}; valid: {', '.join(COLUMNS)}")
    return args


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> dict[str, object]:
    """Run the job with ``argv`` (default: the command line) in ``spark`` where given (a
    notebook's session, left running), else in the session of :func:`common.job_session`."""
    given = spark
    args = parse_args(argv)
    storage = storage_options(args)
    try:
        # Checked here, as maintain.py does, not by the query: its failure would come with
        # Spark's log of a query that terminated with an error, a JVM stack trace.
        table = QueueTable(args.path, storage_options=storage)
        table.arguments(args.queue)
    except QueueError as error:  # a bad path, no queue table or queue, an unreachable store
        fail(PROG, f"{type(error).__name__}: {error}")
    spark = job_session("spark-queue-consume", storage, args.remote, given)
    reader = (
        spark.readStream.format("ringqueue")
        .option("queue", args.queue)
        .option("consumer", args.consumer)
    )
    for option, value in (
        ("maxMessagesPerTrigger", args.max_messages_per_trigger),
        ("maxBytesPerTrigger", args.max_bytes_per_trigger),
        ("leasePeriod", args.lease_period),
        ("filter", args.filter),
        ("maxDeliveries", args.max_deliveries),
        *((f"storage.{key}", value) for key, value in storage.items()),
    ):
        if value is not None:
            reader = reader.option(option, value)
    try:
        messages = reader.load(args.path)
    except PySparkException as error:  # a bad option or queue, named by the connector
        fail(PROG, explain(error))
    if args.body_type == "string":
        messages = messages.withColumn("body", messages["body"].cast("string"))
    writer = with_trigger(
        messages.select(*args.columns)
        .writeStream.format("delta")
        .option("checkpointLocation", args.checkpoint),
        args,
    )
    progress = run_query(PROG, spark, lambda: writer.start(args.output))
    report: dict[str, object] = {
        "queue": args.queue,
        "consumer": args.consumer,
        "output": args.output,
        "batches": progress.batches,
        "messages": progress.rows,
        "stats": table.stats(args.queue),
    }
    print(
        f"consumer {args.consumer!r} moved {report['messages']:,} messages of queue "
        f"{args.queue!r} to {args.output} in {report['batches']} micro-batches"
    )
    print(json.dumps(report))
    end_session(spark, given)
    return report


if __name__ == "__main__":
    main()
