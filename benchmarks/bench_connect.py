"""Benchmark: ``ringqueue`` through Spark Connect against a classic session (goal >= 0.9x).

One run measures, on one generated input (``--messages`` random bodies of ``--body-size``
bytes, ``--input-files`` Parquet files), the same pipelines on each kind of session:

1. **Sink.** ``spark.readStream.parquet(input)`` (``maxFilesPerTrigger`` =
   ``--files-per-trigger``) into ``writeStream.format("ringqueue")``, availableNow, a fresh
   queue table and checkpoint every run; checked afterwards: ``added`` = N.
2. **Consumer.** The queue that run filled, ``readStream.format("ringqueue")``
   (``maxMessagesPerTrigger`` = ``--batch``) into ``writeStream.format("delta")``,
   availableNow; checked afterwards: N rows, the queue empty.
3. **Controls** (unless ``--no-controls``): the sink's input into a Python data source that
   drops its Arrow batches (``noop``: what any Python sink pays, with nothing of
   ``spark_queue`` in it), and into ``format("delta")`` (a sink with no Python at all).

Why the controls: on Spark Connect every streaming query runs in a clone of the session
with an artifact state of its own, and PySpark keys its driver-side Python workers (the
data source's planning, the sink's commits) by that state's id, so each query starts
those workers afresh (three daemons for a Python sink), where a classic session reuses
them from query to query. That is seconds per query on two cores whatever the data source
does; the ``noop`` control measures it, and what ``ringqueue`` costs beyond it is ours.

Each query is timed from ``start()`` to the return of ``awaitTermination()`` (``*_s``), and
split with its progress reports: ``*_start_s`` until ``start()`` returned, ``*_batch0_s``
the first micro-batch's ``triggerExecution`` (where the per-query cost lands), and
``*_steady_msgs_per_s`` the rows of the later micro-batches over the time from the end of
the first to the end of the last (the rate of a query that is already running, as a
long-running one is; it needs two micro-batches or more, else ``null``). The best of
``--repeats`` runs gives messages/s, and the ratio Connect/classic of those rates is
reported (1.0 = as fast as classic), end to end, steady and warm (``*_warm_msgs_per_s``: from
the end of the second micro-batch, since on Connect the second still starts executor-side
Python workers). PySpark runs one kind of session
per process, so each kind runs in a child process of its own (``--session``):
``local_session()`` for classic, ``local_session(remote=True)`` for Connect (a local
Connect server with the same settings; its Python workers import the installed
``spark_queue``, nothing is shipped). The order of the two children alternates over
``--rounds``. Each child warms its session up with a small run of every pipeline before
anything is timed. Results are printed as tables and written as JSON to ``--out``.

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
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import BinaryType, StructField, StructType

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sink import write_bodies
from common import OUT, positive_int, write_results

from spark_queue import QueueTable, local_session

QUEUE = "bench"
SESSIONS = ("classic", "connect")
INPUT_SCHEMA = StructType([StructField("body", BinaryType(), nullable=False)])
DEFAULT_OUT = OUT / "connect.json"
# (key, label) of each pipeline, in the order they run and are printed.
PIPELINES = (
    ("sink", "sink ringqueue"),
    ("noop", "control: sink Python no-op"),
    ("delta", "control: sink delta"),
    ("consumer", "consumer ringqueue"),
)


class NoopSink(DataSource):
    """The control's Python sink: drops its Arrow batches, commits nothing. Defined in the
    script a child runs as ``__main__``, so cloudpickle ships it by value: the server's
    workers import nothing of it, and nothing of ``spark_queue``."""

    @classmethod
    def name(cls) -> str:
        return "benchnoop"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return NoopWriter()


class NoopWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


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
    add("--no-controls", action="store_true", help="skip the no-op and delta sink controls")
    add("--session", choices=SESSIONS, help=argparse.SUPPRESS)  # a child's kind
    add("--work", type=Path, help=argparse.SUPPRESS)  # a child's folder
    return parser.parse_args(argv)


def timed_run(spark: SparkSession, source: Path, folder: Path, args: argparse.Namespace) -> dict:
    """The sink, the controls, then the consumer into ``folder``; each timed and checked."""
    queues, messages, result = folder / "queues", count_rows(source), {}
    sink = (
        input_stream(spark, source, args)
        .writeStream.format("ringqueue")
        .option("queue", QUEUE)
        .option("checkpointLocation", str(folder / "sink-checkpoint"))
        .trigger(availableNow=True)
    )
    result |= run_query("sink", lambda: sink.start(str(queues)))
    added = QueueTable(str(queues)).stats(QUEUE)["added"]
    assert added == messages, f"the sink enqueued {added} of {messages}"

    if not args.no_controls:
        noop = (
            input_stream(spark, source, args)
            .writeStream.format(NoopSink.name())
            .option("checkpointLocation", str(folder / "noop-checkpoint"))
            .trigger(availableNow=True)
        )
        result |= run_query("noop", noop.start)
        delta = (
            input_stream(spark, source, args)
            .writeStream.format("delta")
            .option("checkpointLocation", str(folder / "delta-checkpoint"))
            .trigger(availableNow=True)
        )
        result |= run_query("delta", lambda: delta.start(str(folder / "delta")))

    consumer = (
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
    result |= run_query("consumer", lambda: consumer.start(str(folder / "out")))
    written = spark.read.format("delta").load(str(folder / "out")).count()
    stats = QueueTable(str(queues)).stats(QUEUE)
    assert written == messages and stats["ready"] == 0, (written, stats["ready"])
    return result


def input_stream(spark: SparkSession, source: Path, args: argparse.Namespace) -> Any:
    return (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", args.files_per_trigger)
        .parquet(str(source))
    )


def run_query(key: str, start: Any) -> dict:
    """Run the query ``start()`` starts to its end: ``{key}_s`` from ``start()`` to the
    return of ``awaitTermination()``, ``{key}_start_s`` until ``start()`` returned, and
    the split of :func:`progress_phases`."""
    started = time.perf_counter()
    query = start()
    returned = time.perf_counter()
    query.awaitTermination()
    ended = time.perf_counter()
    return {
        f"{key}_s": ended - started,
        f"{key}_start_s": returned - started,
        **{f"{key}_{name}": value for name, value in progress_phases(query).items()},
    }


def progress_phases(query: StreamingQuery) -> dict:
    """From the progress reports of a finished query: ``batch0_s``, the first micro-batch's
    ``triggerExecution``; ``steady_msgs_per_s``, the rows of the later micro-batches over the
    time from the end of the first to the end of the last (``None`` with one micro-batch);
    ``warm_msgs_per_s``, the same from the end of the second (``None`` with fewer than
    three): on Connect the second micro-batch still starts executor-side Python workers
    (a read task each), which a running query has done once and for all."""
    batches = sorted(
        (p for p in query.recentProgress if p.numInputRows > 0), key=lambda p: p.batchId
    )
    if not batches:
        return {"batch0_s": None, "steady_msgs_per_s": None, "warm_msgs_per_s": None}

    def end(progress: Any) -> float:
        started = datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00"))
        return started.timestamp() + progress.durationMs["triggerExecution"] / 1000

    def rate_after(first: int) -> float | None:
        if len(batches) <= first + 1:
            return None
        span = end(batches[-1]) - end(batches[first])
        return sum(p.numInputRows for p in batches[first + 1 :]) / span if span > 0 else None

    return {
        "batch0_s": batches[0].durationMs["triggerExecution"] / 1000,
        "steady_msgs_per_s": rate_after(0),
        "warm_msgs_per_s": rate_after(1),
    }


def count_rows(folder: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in folder.glob("*.parquet"))


def child(args: argparse.Namespace) -> None:
    """Warm up, then ``--repeats`` timed runs on one kind of session; prints one JSON line."""
    remote = args.session == "connect"
    spark = local_session(f"bench-connect-{args.session}", remote=remote)
    spark.dataSource.register(NoopSink)
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
        "--batch", str(args.batch), *(["--no-controls"] if args.no_controls else []),
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
    pipelines = [(k, label) for k, label in PIPELINES if f"{k}_s" in runs["classic"][0]]
    best = {kind: best_of(runs[kind], args.messages, pipelines) for kind in SESSIONS}
    ratios = {
        key: best["connect"][key] / best["classic"][key]
        for key in best["classic"]
        if best["classic"][key] and best["connect"][key]
    }
    extra = {  # the seconds Connect adds to a query, best run against best run
        key: args.messages / best["connect"][f"{key}_msgs_per_s"]
        - args.messages / best["classic"][f"{key}_msgs_per_s"]
        for key, _ in pipelines
    }
    results: dict[str, Any] = {
        "messages": args.messages,
        "body_size": args.body_size,
        "batch": args.batch,
        "files_per_trigger": args.files_per_trigger,
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "runs": runs,
        "best": best,
        "ratio_connect_over_classic": ratios,
        "connect_extra_s": extra,
    }
    write_results(args.out, results, show=False)
    print_summary(results, pipelines, len(runs["classic"]))


def best_of(runs: list[dict], messages: int, pipelines: list[tuple[str, str]]) -> dict:
    """Per pipeline: the best end-to-end rate, the best steady and warm rates (``None``
    where no run had enough micro-batches) and the median start() and first micro-batch
    seconds."""
    best: dict[str, Any] = {}
    for key, _ in pipelines:
        best[f"{key}_msgs_per_s"] = messages / min(r[f"{key}_s"] for r in runs)
        for rate in ("steady_msgs_per_s", "warm_msgs_per_s"):
            values = [r[f"{key}_{rate}"] for r in runs if r.get(f"{key}_{rate}")]
            best[f"{key}_{rate}"] = max(values) if values else None
        for phase in ("start_s", "batch0_s"):
            values = sorted(r[f"{key}_{phase}"] for r in runs if r[f"{key}_{phase}"] is not None)
            best[f"{key}_{phase}"] = values[len(values) // 2] if values else None
    return best


def print_summary(results: dict, pipelines: list[tuple[str, str]], count: int) -> None:
    best, ratios = results["best"], results["ratio_connect_over_classic"]

    def rate(value: float | None) -> str:
        return f"{value:,.0f}" if value else "-"

    def ratio(key: str) -> str:
        return f"{ratios[key]:.2f}" if key in ratios else "-"

    print(
        f"{results['messages']:,} messages of {results['body_size']} B, best of {count} "
        f"(median for start() and batch 0)"
    )
    print(
        f"{'':<28} {'classic msg/s':>13} {'connect msg/s':>13} {'ratio':>6} "
        f"{'steady ratio':>12} {'warm ratio':>10} {'extra s':>7} {'batch 0 s cl/co':>15} "
        f"{'start s cl/co':>13}"
    )
    for key, label in pipelines:
        classic, connect = best["classic"], best["connect"]
        batch0 = f"{classic[f'{key}_batch0_s']:.2f}/{connect[f'{key}_batch0_s']:.2f}"
        start = f"{classic[f'{key}_start_s']:.2f}/{connect[f'{key}_start_s']:.2f}"
        print(
            f"{label:<28} {rate(classic[f'{key}_msgs_per_s']):>13} "
            f"{rate(connect[f'{key}_msgs_per_s']):>13} {ratio(f'{key}_msgs_per_s'):>6} "
            f"{ratio(f'{key}_steady_msgs_per_s'):>12} {ratio(f'{key}_warm_msgs_per_s'):>10} "
            f"{results['connect_extra_s'][key]:>7.2f} "
            f"{batch0:>15} {start:>13}"
        )
    if "noop" in results["connect_extra_s"]:
        own = results["connect_extra_s"]["sink"] - results["connect_extra_s"]["noop"]
        print(
            f"Connect's extra per query for any Python sink (control): "
            f"{results['connect_extra_s']['noop']:.2f} s; ringqueue's sink beyond it: {own:.2f} s"
        )


if __name__ == "__main__":
    main()
