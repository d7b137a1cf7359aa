"""Benchmark: ``ringqueue`` through Spark Connect against a classic session (goal >= 0.9x).

One run measures, on one generated input (``--messages`` random bodies of ``--body-size``
bytes, ``--input-files`` Parquet files), the same two pipelines on each kind of session:

1. **Sink.** ``spark.readStream.parquet(input)`` (``maxFilesPerTrigger`` =
   ``--files-per-trigger``) into ``writeStream.format("ringqueue")``, availableNow, a fresh
   queue table and checkpoint every run; checked afterwards: ``added`` = N.
2. **Consumer.** The queue that run filled, ``readStream.format("ringqueue")``
   (``maxMessagesPerTrigger`` = ``--batch``) into ``writeStream.format("delta")``,
   availableNow; checked afterwards: N rows, the queue empty.

Each is timed from ``start()`` to the return of ``awaitTermination()``; the best of
``--repeats`` runs gives messages/s, and the ratio Connect/classic of those rates is
reported (1.0 = as fast as classic). PySpark runs one kind of session per process, so each
kind runs in a child process of its own (``--session``): ``local_session()`` for classic,
``local_session(remote=True)`` for Connect (a local Connect server with the same settings;
its Python workers import the installed ``spark_queue``, nothing is shipped). The order of
the two children alternates over ``--rounds``. Each child warms its session up with a small
run of both pipelines before anything is timed. Results are printed as a table and written
as JSON to ``--out``.

Run it from the project root::

    .venv/bin/python benchmarks/bench_connect.py                  # 1 M x 200 B
    .venv/bin/python benchmarks/bench_connect.py --messages 100000 --rounds 1  # smoke run
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, StructField, StructType

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sink import positive_int, write_bodies

from spark_queue import QueueTable, local_session

QUEUE = "bench"
SESSIONS = ("classic", "connect")
INPUT_SCHEMA = StructType([StructField("body", BinaryType(), nullable=False)])
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "connect.json"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark format('ringqueue') through Spark Connect against classic.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    add("--tmp-dir", default="/tmp", help="where the temporary work folder is made")
    add("--messages", type=positive_int, default=1_000_000, help="messages of the input")
    add("--body-size", type=positive_int, default=200, help="body bytes")
    add("--input-files", type=positive_int, default=10, help="Parquet files of the input")
    add("--files-per-trigger", type=positive_int, default=2, help="sink maxFilesPerTrigger")
    add("--batch", type=positive_int, default=200_000, help="consumer maxMessagesPerTrigger")
    add("--repeats", type=positive_int, default=2, help="timed runs per child process")
    add("--rounds", type=positive_int, default=2, help="child processes per kind, alternating")
    add("--seed", type=int, default=7, help="seed of the random bodies")
    add("--session", choices=SESSIONS, help=argparse.SUPPRESS)  # a child's kind
    add("--work", type=Path, help=argparse.SUPPRESS)  # a child's folder
    return parser.parse_args(argv)


def timed_run(spark: SparkSession, source: Path, folder: Path, args: argparse.Namespace) -> dict:
    """One sink run then one consumer run into ``folder``; seconds of each, checked."""
    queues, messages = folder / "queues", count_rows(source)
    query = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", args.files_per_trigger)
        .parquet(str(source))
        .writeStream.format("ringqueue")
        .option("queue", QUEUE)
        .option("checkpointLocation", str(folder / "sink-checkpoint"))
        .trigger(availableNow=True)
    )
    started = time.perf_counter()
    query.start(str(queues)).awaitTermination()
    sink = time.perf_counter() - started
    added = QueueTable(str(queues)).stats(QUEUE)["added"]
    assert added == messages, f"the sink enqueued {added} of {messages}"

    query = (
        spark.readStream.format("ringqueue")
        .option("queue", QUEUE)
        .option("consumer", "bench")
        .option("maxMessagesPerTrigger", args.batch)
        .load(str(queues))
        .select("seq", "body")
        .writeStream.format("delta")
        .option("checkpointLocation", str(folder / "consumer-checkpoint"))
        .trigger(availableNow=True)
    )
    started = time.perf_counter()
    query.start(str(folder / "out")).awaitTermination()
    consumer = time.perf_counter() - started
    written = spark.read.format("delta").load(str(folder / "out")).count()
    stats = QueueTable(str(queues)).stats(QUEUE)
    assert written == messages and stats["ready"] == 0, (written, stats["ready"])
    return {"sink_s": sink, "consumer_s": consumer}


def count_rows(folder: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in folder.glob("*.parquet"))


def child(args: argparse.Namespace) -> None:
    """Warm up, then ``--repeats`` timed runs on one kind of session; prints one JSON line."""
    remote = args.session == "connect"
    spark = local_session(f"bench-connect-{args.session}", remote=remote)
    runs = args.work / f"{args.session}-{time.monotonic_ns()}"
    timed_run(spark, args.work / "warm-up", runs / "warm-up", args)
    results = [
        timed_run(spark, args.work / "input", runs / str(i), args) for i in range(args.repeats)
    ]
    shutil.rmtree(runs, ignore_errors=True)
    print(json.dumps(results))


def run_child(kind: str, args: argparse.Namespace, work: Path) -> list[dict]:
    command = [
        sys.executable, __file__, "--session", kind, "--work", str(work),
        "--repeats", str(args.repeats), "--files-per-trigger", str(args.files_per_trigger),
        "--batch", str(args.batch),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} run failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.session:
        return child(args)
    work = Path(tempfile.mkdtemp(prefix="bench-connect-", dir=args.tmp_dir))
    try:
        write_bodies(work / "input", args.messages, args.body_size, args.input_files, args.seed)
        write_bodies(work / "warm-up", 2000, args.body_size, 2, args.seed + 1)
        runs: dict[str, list[dict]] = {kind: [] for kind in SESSIONS}
        for round_ in range(args.rounds):
            order = SESSIONS if round_ % 2 == 0 else SESSIONS[::-1]
            for kind in order:
                runs[kind] += run_child(kind, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = {
        kind: {
            "sink_msgs_per_s": args.messages / min(r["sink_s"] for r in runs[kind]),
            "consumer_msgs_per_s": args.messages / min(r["consumer_s"] for r in runs[kind]),
        }
        for kind in SESSIONS
    }
    ratios = {key: best["connect"][key] / best["classic"][key] for key in best["classic"]}
    results: dict[str, Any] = {
        "messages": args.messages,
        "body_size": args.body_size,
        "batch": args.batch,
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "runs": runs,
        "best": best,
        "ratio_connect_over_classic": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"{args.messages:,} messages of {args.body_size} B, best of {len(runs['classic'])}")
    print(f"{'':<10} {'classic msg/s':>14} {'connect msg/s':>14} {'connect/classic':>16}")
    for key, label in (("sink_msgs_per_s", "sink"), ("consumer_msgs_per_s", "consumer")):
        print(
            f"{label:<10} {best['classic'][key]:>14,.0f} {best['connect'][key]:>14,.0f} "
            f"{ratios[key]:>16.2f}"
        )


if __name__ == "__main__":
    main()
