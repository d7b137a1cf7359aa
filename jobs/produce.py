"""Produce messages into a queue with a streaming query, then print the queue's stats.

With no arguments it is the demo: 5,000 generated messages in 5 micro-batches into the ring
queue ``demo`` (ring size 1,000) at /tmp/spark-queue-demo/queues (``make demo`` gives it
``--path build/demo/queues``), on a local Spark with Delta set up. Under ``spark-submit`` it
runs on the submitted master.

Sources (``--source``):

- ``generate``: ``--messages`` rows (``body`` "message N", ``message_id`` "id-N") written as
  ``--batches`` Parquet files in ``--staging`` (default: a local temporary folder) and
  streamed one file per micro-batch. Not Spark's ``rate`` source: its rows per batch depend
  on the wall clock and an availableNow run of it is one batch, so neither the count nor the
  batches could be asked for.
- ``delta --input PATH``: a Delta table, streamed (new commits as they arrive).
- ``files --input DIR --format json|parquet|csv``: a file stream. Parquet carries its schema;
  for json and csv give ``--schema`` (a DDL string) or the schema is inferred once, at start,
  from the files already in DIR (fields that appear only in later files are then dropped:
  give ``--schema`` in production).

Message columns: ``--body``, ``--key``, ``--message-id``, ``--headers``, ``--priority``,
``--deliver-at``, ``--expires-at`` and ``--queue-column`` are Spark SQL expressions over the
input's columns. Each defaults to the input column of the sink's name (``body``, ``key``,
``message_id``, ``headers``, ``priority``, ``deliver_at``, ``expires_at``, ``queue``) when the
input has it; ``--body`` falls back to the whole row as JSON. Other input columns are not
enqueued. Queue arguments (``--ring-size``, ``--max-length`` ...) are the sink's options
(docs/ARGUMENTS.md); given ones must match an existing queue's.

Exactly-once: each micro-batch is one Delta commit tagged with the query id and batch id, so
a batch replayed after a crash (same ``--checkpoint``) enqueues nothing twice.
"""

from __future__ import annotations

import argparse
import json
import tempfile

from common import (
    add_remote_option,
    add_storage_options,
    add_trigger_options,
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
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_queue import InvalidOptionError, QueueStats, QueueTable
from spark_queue.model.arguments import ARGUMENTS
from spark_queue.model.queue_arguments import validate_arguments

SOURCES = ("generate", "delta", "files")
FORMATS = ("json", "parquet", "csv")
DEMO_QUEUE, DEMO_RING_SIZE = "demo", 1000
PROG = "produce.py"
GENERATED = "body STRING, message_id STRING"  # what generate() writes
# Flag -> sink column; each flag is a SQL expression defaulting to the same-named input column.
MESSAGE_COLUMNS = {
    "body": "body",
    "key": "key",
    "message_id": "message_id",
    "headers": "headers",
    "priority": "priority",
    "deliver_at": "deliver_at",
    "expires_at": "expires_at",
    "queue_column": "queue",
}
# The sink options this job takes as flags (spelt by the specification: --ring-size for
# ringSize): queue arguments, and onReject.
QUEUE_OPTIONS = (
    "ring_size",
    "max_length",
    "max_length_bytes",
    "overflow",
    "dead_letter_queue",
    "reject_threshold",
    "expiration",
    "expiration_model",
    "partitions",
    "on_reject",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_argument_group("queue table")
    where.add_argument(
        "--path",
        type=table_location,
        default="/tmp/spark-queue-demo/queues",
        help="queue table location, a local path or URI (default: %(default)s)",
    )
    add_storage_options(where)
    add_remote_option(parser)
    where.add_argument(
        "--queue",
        default=DEMO_QUEUE,
        help="queue of rows without a queue column (default: %(default)s; the demo queue is "
        f"a ring of {DEMO_RING_SIZE} unless queue arguments are given)",
    )
    source = parser.add_argument_group("input")
    source.add_argument(
        "--source", choices=SOURCES, default="generate", help="where messages come from"
    )
    source.add_argument("--input", help="Delta table path (delta) or folder (files)")
    source.add_argument("--format", choices=FORMATS, help="file format with --source files")
    source.add_argument(
        "--schema", help="input schema as DDL, e.g. 'id BIGINT, text STRING' (json, csv)"
    )
    source.add_argument(
        "--max-files-per-trigger",
        type=positive_int,
        help="input files (delta: data files) per micro-batch (default: all available)",
    )
    source.add_argument(
        "--messages", type=positive_int, default=5000, help="generated messages (default: 5000)"
    )
    source.add_argument(
        "--staging",
        help="folder for generated input (default: a local temporary folder, removed after; "
        "on a cluster of several hosts give a path every executor and the driver share)",
    )
    source.add_argument(
        "--batches",
        "--files",
        dest="batches",
        type=positive_int,
        default=5,
        help="micro-batches the generated messages arrive in (default: %(default)s)",
    )
    columns = parser.add_argument_group(
        "message columns (Spark SQL expressions over the input's columns)"
    )
    columns.add_argument(
        "--body", help="body, string or binary (default: column body, else to_json(struct(*)))"
    )
    columns.add_argument("--key", help="key, string (default: column key if present)")
    columns.add_argument("--message-id", help="message_id, string (default: column message_id)")
    columns.add_argument(
        "--headers", help="headers, map<string,string>, e.g. \"map('region', region)\""
    )
    columns.add_argument("--priority", help="priority, an integer (default: column priority)")
    columns.add_argument("--deliver-at", help="scheduled delivery, a timestamp")
    columns.add_argument("--expires-at", help="expiry, a timestamp")
    columns.add_argument(
        "--queue-column", help="the queue of each row, a string; null rows go to --queue"
    )
    arguments = parser.add_argument_group("queue arguments (sink options, docs/ARGUMENTS.md)")
    for name in QUEUE_OPTIONS:
        arguments.add_argument(ARGUMENTS[name].flag, help=ARGUMENTS[name].doc)
    run = parser.add_argument_group("query")
    add_trigger_options(run)
    run.add_argument(
        "--checkpoint",
        help="checkpoint location; required with --source delta or files (exactly-once "
        "needs it to survive the job); default with generate: a scratch folder",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the flags; bad combinations exit with status 2 naming the flag."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.source == "generate":
        if args.input or args.format:
            parser.error("--input and --format go with --source delta or files, not generate")
    elif args.staging:
        parser.error("--staging goes with --source generate")
    else:
        if not args.input:
            parser.error(f"--source {args.source} needs --input")
        if not args.checkpoint:
            parser.error(f"--source {args.source} needs --checkpoint (a lasting location)")
    if args.source == "files" and not args.format:
        parser.error(f"--source files needs --format, one of {', '.join(FORMATS)}")
    if args.source != "files" and args.schema:
        parser.error("--schema goes with --source files")
    if args.source == "delta" and args.format:
        parser.error("--format goes with --source files")
    given = {
        name: getattr(args, name)
        for name in QUEUE_OPTIONS
        if name != "on_reject" and getattr(args, name) is not None
    }
    try:
        validate_arguments(given, surface="flag")
        if args.on_reject is not None:
            ARGUMENTS["on_reject"].parse(args.on_reject, "--on-reject")
    except InvalidOptionError as error:  # names the flag
        parser.error(str(error))
    if args.queue == DEMO_QUEUE and not given:
        args.ring_size = str(DEMO_RING_SIZE)
    return args


def generate(spark: SparkSession, folder: str, messages: int, batches: int) -> None:
    """Write ``messages`` rows as ``batches`` Parquet files (one partition each)."""
    (
        spark.range(messages, numPartitions=min(batches, messages))
        .select(
            F.format_string("message %d", F.col("id")).alias("body"),
            F.concat(F.lit("id-"), F.col("id").cast("string")).alias("message_id"),
        )
        .write.mode("overwrite")
        .parquet(folder)
    )


def input_stream(spark: SparkSession, args: argparse.Namespace, scratch: str) -> DataFrame:
    reader = spark.readStream
    if args.max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
    if args.source == "generate":
        folder = args.staging or f"{scratch}/input"
        generate(spark, folder, args.messages, args.batches)
        return reader.option("maxFilesPerTrigger", 1).schema(GENERATED).parquet(folder)
    if args.source == "delta":
        return reader.format("delta").load(args.input)
    reader = reader.format(args.format)
    if args.format == "csv":
        reader = reader.option("header", "true")
    if args.schema:
        return reader.schema(args.schema).load(args.input)
    batch = spark.read.format(args.format)
    if args.format == "csv":
        batch = batch.option("header", "true").option("inferSchema", "true")
    try:
        schema = batch.load(args.input).schema
    except AnalysisException as error:
        fail(
            PROG,
            f"cannot infer a schema from --input {args.input!r} ({explain(error)}); give --schema",
        )
    return reader.schema(schema).load(args.input)


def message_columns(stream: DataFrame, args: argparse.Namespace) -> DataFrame:
    """Select the sink's columns from the input, by the flags' expressions."""
    present = set(stream.columns)
    selected = []
    for flag, column in MESSAGE_COLUMNS.items():
        expression = getattr(args, flag)
        if expression is None and column in present:
            expression = f"`{column}`"
        if expression is None and column == "body":
            expression = "to_json(struct(*))"
        if expression is None:
            continue
        try:
            stream.selectExpr(f"{expression} AS `{column}`")
        except AnalysisException as error:
            option = "--" + flag.replace("_", "-")
            fail(
                PROG,
                f"{option} {expression!r} is not a valid expression over the input columns "
                f"{sorted(present)}: {explain(error)}",
            )
        selected.append(f"{expression} AS `{column}`")
    return stream.selectExpr(*selected)


def main(argv: list[str] | None = None, spark: SparkSession | None = None) -> QueueStats:
    """Run the job with ``argv`` (default: the command line) in ``spark`` where given (a
    notebook's session, left running), else in the session of :func:`common.job_session`."""
    given = spark
    args = parse_args(argv)
    storage = storage_options(args)
    spark = job_session("spark-queue-produce", storage, args.remote, given)
    with tempfile.TemporaryDirectory(prefix="spark-queue-produce-") as scratch:
        stream = message_columns(input_stream(spark, args, scratch), args)
        writer = stream.writeStream.format("ringqueue").option("queue", args.queue)
        for key, value in storage.items():
            writer = writer.option(f"storage.{key}", value)
        for name in QUEUE_OPTIONS:
            if getattr(args, name) is not None:
                writer = writer.option(ARGUMENTS[name].option, getattr(args, name))
        writer = with_trigger(
            writer.option("checkpointLocation", args.checkpoint or f"{scratch}/checkpoint"), args
        )
        batches = run_query(PROG, spark, lambda: writer.start(args.path)).batches
    table = QueueTable(args.path, storage_options=storage)
    stats = table.stats(args.queue)
    print(f"queue {args.queue!r} in {table.path} after {batches} micro-batches:")
    counts = {k: v for k, v in stats.items() if isinstance(v, int)}
    width = max(len(k) for k in counts)
    for key, count in counts.items():
        print(f"  {key:<{width}}  {count:>12,}")
    print(json.dumps({"queue": args.queue, **stats}))
    end_session(spark, given)
    return stats


if __name__ == "__main__":
    main()
