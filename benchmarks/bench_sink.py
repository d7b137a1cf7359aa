"""Benchmark of the ``ringqueue`` sink: throughput against Delta, depth, and commit creep.

One run measures, on inputs it generates itself (random, incompressible message bodies):

1. **Throughput.** For each body size (``--body-sizes``, default 200 B and 10 KB) a Parquet
   folder of N rows with one binary ``body`` column is written first (``--input-files``
   files). It is then streamed with ``spark.readStream.schema(...).parquet(folder)``
   (``maxFilesPerTrigger`` = ``--files-per-trigger``, so there are several micro-batches,
   ``trigger(availableNow=True)``, a fresh checkpoint and target every run) into

   - ``writeStream.format("ringqueue")`` with ``queue=bench`` and a ring limit smaller than
     N (``ringSize`` = N x ``--ring-fraction``), so the last micro-batches evict, and
   - ``writeStream.format("delta")`` (delta-spark), the baseline.

   The time is from ``start()`` to the return of ``awaitTermination()``. The sinks run
   alternately, ``--repeats`` times each; the best time gives messages/s, and the ratio
   ringqueue/delta of those rates is reported (1.0 = as fast as Delta). Every run is checked
   afterwards: the queue must hold ``added = N`` and ``ready = ringSize``, the Delta table
   N rows.

2. **Depth.** Two queue tables are filled with batch writes (``df.write.format("ringqueue")``
   of at most ``--fill-rows`` rows each) to ``--depth-small`` and ``--depth-large`` messages
   of 200 B, each with ``ringSize`` equal to its depth. Then a batch of ``--depth-batch``
   messages is written ``--depth-batches`` times into each (alternating): every batch
   evicts as many messages as it adds. Reported: the median batch time at each depth and
   the ratio large/small (goal <= 1.2). When the batch is larger than the small depth,
   part of the batch itself is evicted there.

3. **Creep.** ``--creep-batches`` consecutive batch writes of ``--creep-size`` messages
   (200 B) into one queue with ``ringSize`` = ``--creep-ring``, each one Delta commit,
   each timed. Reported: the median of the first and of the last ``--creep-window``
   batches and their ratio (last/first), plus a linear trend.

A Spark session (``spark_queue.local_session``: ``local[2]``, Delta, ``ringqueue``) is warmed
up with one tiny streaming write to each sink before anything is timed. Everything is written
under a temporary folder (``--tmp-dir``, default /tmp) that is deleted at the end.
Results are printed as a table and written as JSON to ``--out``.

Run it from the project root::

    .venv/bin/python benchmarks/bench_sink.py            # full size: long, needs ~3 GB disk
    .venv/bin/python benchmarks/bench_sink.py --messages 20000 --depth-large 200000 \\
        --creep-batches 30 --repeats 1                   # smoke run, a few minutes
    .venv/bin/python benchmarks/bench_sink.py --help
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from common import (
    OUT,
    environment,
    fraction,
    int_list,
    median,
    positive_int,
    progress,
    write_results,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import BinaryType, StructField, StructType

from spark_queue import QueueTable, local_session

QUEUE = "bench"
SMALL_BODY = 200  # bytes: the depth and creep messages
CHUNK_BYTES = 64 * 1024 * 1024  # body bytes per generated Arrow array / row group
INPUT_SCHEMA = StructType([StructField("body", BinaryType(), nullable=False)])
DEFAULT_OUT = OUT / "sink.json"


# -- arguments --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark format('ringqueue'): throughput vs Delta, depth, commit creep.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    add("--tmp-dir", default="/tmp", help="where the temporary work folder is made")
    add(
        "--sections",
        default="throughput,depth,creep",
        help="comma-separated subset of throughput,depth,creep to run",
    )
    add(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration for the session (repeatable)",
    )
    # throughput
    add("--body-sizes", type=int_list, default="200,10240", help="body sizes in bytes")
    add(
        "--messages",
        type=int_list,
        default="2000000,100000",
        help="messages per body size, one per --body-sizes entry; a single N is the count for "
        "the first size and the others get the same input bytes (N x first / size)",
    )
    add("--input-files", type=positive_int, default=10, help="Parquet files of each input")
    add("--files-per-trigger", type=positive_int, default=2, help="maxFilesPerTrigger")
    add(
        "--ring-fraction",
        type=fraction,
        default=0.5,
        help="ringSize of the throughput queue as a fraction of the messages",
    )
    add("--repeats", type=positive_int, default=2, help="timed runs of each sink per size")
    # depth
    add("--depth-small", type=positive_int, default=10_000, help="messages in the shallow queue")
    add("--depth-large", type=positive_int, default=10_000_000, help="messages in the deep queue")
    add("--depth-batch", type=positive_int, default=100_000, help="messages per timed batch")
    add("--depth-batches", type=positive_int, default=3, help="timed batches per depth")
    add("--fill-rows", type=positive_int, default=1_000_000, help="messages per fill write")
    # creep
    add("--creep-batches", type=positive_int, default=1000, help="consecutive timed commits")
    add("--creep-size", type=positive_int, default=100, help="messages per creep batch")
    add("--creep-ring", type=positive_int, default=10_000, help="ringSize of the creep queue")
    add(
        "--creep-window",
        type=positive_int,
        default=50,
        help="batches in the first and last window (at most half of --creep-batches)",
    )
    add("--seed", type=int, default=7, help="seed of the random bodies")
    args = parser.parse_args(argv)

    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - {"throughput", "depth", "creep"}
    if unknown or not sections:
        parser.error(f"--sections: unknown {sorted(unknown)}; use throughput,depth,creep")
    args.sections = sections
    bad = [c for c in args.conf if "=" not in c]
    if bad:
        parser.error(f"--conf needs KEY=VALUE, got {bad[0]!r}")
    if len(args.messages) == 1:
        first = args.body_sizes[0]
        args.messages = [
            max(args.input_files, args.messages[0] * first // size) for size in args.body_sizes
        ]
    elif len(args.messages) != len(args.body_sizes):
        parser.error("--messages needs one value, or one per --body-sizes entry")
    if any(n < args.input_files for n in args.messages):
        parser.error("--messages must be at least --input-files")
    if args.files_per_trigger > args.input_files:
        parser.error("--files-per-trigger must not exceed --input-files")
    if args.depth_small >= args.depth_large:
        parser.error("--depth-small must be smaller than --depth-large")
    return args


# -- inputs -----------------------------------------------------------------------------------


def write_bodies(folder: Path, rows: int, body_size: int, files: int, seed: int) -> int:
    """Write ``rows`` random ``body`` values of ``body_size`` bytes as ``files`` Parquet files.

    Returns the bytes on disk.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    schema = pa.schema([pa.field("body", pa.binary(), nullable=False)])
    chunk_rows = max(1, CHUNK_BYTES // body_size)
    for index, count in enumerate(split(rows, files)):
        path = folder / f"part-{index:05d}.parquet"
        with pq.ParquetWriter(path, schema, compression="snappy") as writer:
            done = 0
            while done < count:
                n = min(chunk_rows, count - done)
                data = rng.bytes(n * body_size)
                offsets = np.arange(0, (n + 1) * body_size, body_size, dtype=np.int32)
                body = pa.Array.from_buffers(
                    pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
                )
                writer.write_table(pa.Table.from_arrays([body], schema=schema))
                done += n
    return sum(p.stat().st_size for p in folder.glob("*.parquet"))


def split(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` near-equal whole numbers (no zeros unless total < parts)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts) if base or i < extra]


# -- timing helpers ---------------------------------------------------------------------------


def stream(
    spark: SparkSession,
    sink: str,
    source: Path,
    target: Path,
    checkpoint: Path,
    *,
    files_per_trigger: int,
    ring_size: int,
) -> dict[str, Any]:
    """Stream the Parquet folder ``source`` into ``sink`` until it is drained; timed."""
    frame = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", files_per_trigger)
        .parquet(str(source))
    )
    writer = (
        frame.writeStream.format(sink)
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .option("path", str(target))
        .trigger(availableNow=True)
    )
    if sink == "ringqueue":
        writer = writer.option("queue", QUEUE).option("ringSize", str(ring_size))
    start = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    seconds = time.perf_counter() - start
    batches = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    return {
        "seconds": seconds,
        "micro_batches": len(batches),
        "input_rows": sum(int(p["numInputRows"]) for p in batches),
        "add_batch_ms": [p["durationMs"].get("addBatch") for p in batches],
        "trigger_ms": [p["durationMs"].get("triggerExecution") for p in batches],
    }


def write_batch(frame: DataFrame, path: Path, ring_size: int) -> float:
    """One ``df.write.format("ringqueue")`` append (one Delta commit); returns its seconds."""
    start = time.perf_counter()
    (
        frame.write.format("ringqueue")
        .mode("append")
        .option("path", str(path))
        .option("queue", QUEUE)
        .option("ringSize", str(ring_size))
        .save()
    )
    return time.perf_counter() - start


def queue_check(path: Path, added: int, ready: int) -> str:
    """``"ok"``, or what differs, after comparing the queue's stats with expectations."""
    try:
        stats = QueueTable(str(path)).stats(QUEUE)
    except Exception as error:  # report, do not lose the other figures
        return f"FAILED: stats raised {type(error).__name__}: {error}"
    wrong = [
        f"{name}={stats[name]} (expected {want})"
        for name, want in (("added", added), ("ready", ready))
        if stats[name] != want
    ]
    return "ok" if not wrong else "FAILED: " + ", ".join(wrong)


def table_shape(path: Path) -> dict[str, int]:
    """The Delta version and active file count of a table (delta-rs, driver process)."""
    from deltalake import DeltaTable

    table = DeltaTable(str(path))
    return {"version": table.version(), "active_files": len(table.file_uris())}


# -- sections ---------------------------------------------------------------------------------


def warm_up(spark: SparkSession, work: Path, seed: int) -> None:
    """One tiny streaming write to each sink, so JVM, Python workers and Delta are warm."""
    source = work / "warmup-input"
    write_bodies(source, 100, SMALL_BODY, 2, seed)
    for sink in ("ringqueue", "delta"):
        result = stream(
            spark,
            sink,
            source,
            work / f"warmup-{sink}",
            work / f"warmup-{sink}-checkpoint",
            files_per_trigger=1,
            ring_size=50,
        )
        progress(f"warm-up {sink}: {result['seconds']:.2f}s")
    for name in (
        "warmup-input",
        "warmup-ringqueue",
        "warmup-delta",
        "warmup-ringqueue-checkpoint",
        "warmup-delta-checkpoint",
    ):
        shutil.rmtree(work / name, ignore_errors=True)


def bench_throughput(
    spark: SparkSession, args: argparse.Namespace, work: Path
) -> list[dict[str, Any]]:
    results = []
    for body_size, messages in zip(args.body_sizes, args.messages, strict=True):
        source = work / f"input-{body_size}"
        started = time.perf_counter()
        on_disk = write_bodies(source, messages, body_size, args.input_files, args.seed)
        progress(
            f"input {body_size} B: {messages:,} messages, {on_disk / 1e6:,.1f} MB in "
            f"{args.input_files} files ({time.perf_counter() - started:.1f}s)"
        )
        ring_size = max(1, int(messages * args.ring_fraction))
        runs: dict[str, list[dict[str, Any]]] = {"ringqueue": [], "delta": []}
        for repeat in range(args.repeats):
            order = ("ringqueue", "delta") if repeat % 2 == 0 else ("delta", "ringqueue")
            for sink in order:
                name = f"{sink}-{body_size}-{repeat}"
                target, checkpoint = work / name, work / f"{name}-checkpoint"
                run = stream(
                    spark,
                    sink,
                    source,
                    target,
                    checkpoint,
                    files_per_trigger=args.files_per_trigger,
                    ring_size=ring_size,
                )
                run["rate"] = messages / run["seconds"]
                if run["input_rows"] != messages:
                    run["check"] = f"FAILED: streamed {run['input_rows']} rows of {messages}"
                elif sink == "ringqueue":
                    run["check"] = queue_check(target, messages, min(messages, ring_size))
                else:
                    count = spark.read.format("delta").load(str(target)).count()
                    run["check"] = (
                        "ok"
                        if count == messages
                        else (f"FAILED: Delta table holds {count} rows, expected {messages}")
                    )
                runs[sink].append(run)
                progress(
                    f"{body_size} B {sink} run {repeat + 1}/{args.repeats}: "
                    f"{run['seconds']:.2f}s, {run['rate']:,.0f} msg/s, "
                    f"{run['micro_batches']} micro-batches, check {run['check']}"
                )
                shutil.rmtree(target, ignore_errors=True)
                shutil.rmtree(checkpoint, ignore_errors=True)
        shutil.rmtree(source, ignore_errors=True)
        best = {sink: min(r["seconds"] for r in sink_runs) for sink, sink_runs in runs.items()}
        rate = {sink: messages / seconds for sink, seconds in best.items()}
        results.append(
            {
                "body_size": body_size,
                "messages": messages,
                "input_bytes_on_disk": on_disk,
                "ring_size": ring_size,
                "runs": runs,
                "best_seconds": best,
                "messages_per_second": rate,
                "mb_per_second": {s: r * body_size / 1e6 for s, r in rate.items()},
                "ratio_ringqueue_to_delta": rate["ringqueue"] / rate["delta"],
                "checks_ok": all(r["check"] == "ok" for rs in runs.values() for r in rs),
            }
        )
    return results


def timed_fill(frame: DataFrame, chunk: int, path: Path, depth: int) -> list[float]:
    """Batch-write ``depth`` messages into a queue whose ringSize is ``depth``; the seconds of
    each write."""
    times = []
    remaining = depth
    while remaining > 0:
        n = min(chunk, remaining)
        times.append(write_batch(frame if n == chunk else frame.limit(n), path, depth))
        remaining -= n
        progress(f"fill depth {depth:,}: {depth - remaining:,} messages ({times[-1]:.2f}s)")
    return times


def bench_depth(spark: SparkSession, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    chunk = min(args.fill_rows, args.depth_large)
    fill_source, batch_source = work / "depth-fill-input", work / "depth-batch-input"
    write_bodies(fill_source, chunk, SMALL_BODY, 2, args.seed + 1)
    write_bodies(batch_source, args.depth_batch, SMALL_BODY, 2, args.seed + 2)
    fill_frame = spark.read.schema(INPUT_SCHEMA).parquet(str(fill_source))
    batch_frame = spark.read.schema(INPUT_SCHEMA).parquet(str(batch_source))
    depths = {"small": args.depth_small, "large": args.depth_large}
    paths = {label: work / f"depth-{label}" for label in depths}
    fills: dict[str, list[float]] = {}
    for label, depth in depths.items():
        fill_chunk = min(chunk, depth)
        frame = fill_frame if fill_chunk == chunk else fill_frame.limit(fill_chunk)
        fills[label] = timed_fill(frame, fill_chunk, paths[label], depth)
    times: dict[str, list[float]] = {label: [] for label in depths}
    for index in range(args.depth_batches):
        order = ("small", "large") if index % 2 == 0 else ("large", "small")
        for label in order:
            seconds = write_batch(batch_frame, paths[label], depths[label])
            times[label].append(seconds)
            progress(f"depth {depths[label]:,} batch {index + 1}: {seconds:.2f}s")
    checks = {
        label: queue_check(paths[label], depth + args.depth_batches * args.depth_batch, depth)
        for label, depth in depths.items()
    }
    shapes = {label: table_shape(path) for label, path in paths.items()}
    for folder in (fill_source, batch_source, *paths.values()):
        shutil.rmtree(folder, ignore_errors=True)
    medians = {label: median(values) for label, values in times.items()}
    return {
        "depths": depths,
        "batch_messages": args.depth_batch,
        "body_size": SMALL_BODY,
        "fill_seconds": fills,
        "batch_seconds": times,
        "median_seconds": medians,
        "ratio_large_to_small": medians["large"] / medians["small"],
        "goal_ratio_max": 1.2,
        "tables": shapes,
        "checks": checks,
        "checks_ok": all(c == "ok" for c in checks.values()),
    }


def bench_creep(spark: SparkSession, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    source, path = work / "creep-input", work / "creep"
    write_bodies(source, args.creep_size, SMALL_BODY, 1, args.seed + 3)
    frame = spark.read.schema(INPUT_SCHEMA).parquet(str(source))
    times: list[float] = []
    every = max(1, args.creep_batches // 10)
    for index in range(args.creep_batches):
        times.append(write_batch(frame, path, args.creep_ring))
        if (index + 1) % every == 0 or index + 1 == args.creep_batches:
            progress(
                f"creep batch {index + 1}/{args.creep_batches}: {times[-1] * 1000:.0f} ms "
                f"(median of the last {every}: {median(times[-every:]) * 1000:.0f} ms)"
            )
    window = min(args.creep_window, max(1, args.creep_batches // 2))
    first, last = median(times[:window]), median(times[-window:])
    slope = float(np.polyfit(np.arange(len(times)), times, 1)[0]) if len(times) > 1 else 0.0
    total = args.creep_batches * args.creep_size
    check = queue_check(path, total, min(total, args.creep_ring))
    shape = table_shape(path)
    shutil.rmtree(source, ignore_errors=True)
    shutil.rmtree(path, ignore_errors=True)
    return {
        "batches": args.creep_batches,
        "batch_messages": args.creep_size,
        "ring_size": args.creep_ring,
        "window": window,
        "median_first_seconds": first,
        "median_last_seconds": last,
        "ratio_last_to_first": last / first,
        "trend_seconds_per_100_batches": slope * 100,
        "batch_seconds": times,
        "table": shape,
        "check": check,
        "checks_ok": check == "ok",
    }


# -- report -----------------------------------------------------------------------------------


def summary(results: dict[str, Any]) -> str:
    lines = ["", "=" * 78, "ringqueue sink benchmark", "=" * 78]
    throughput = results.get("throughput")
    if throughput:
        lines += [
            "",
            "1. Throughput: writeStream, availableNow, best of "
            f"{results['config']['repeats']} (all runs in the JSON)",
            f"{'body':>7} {'messages':>11} {'sink':<10} {'best s':>8} {'msg/s':>11} "
            f"{'MB/s':>8} {'batches':>7}  ratio rq/delta  checks",
        ]
        for entry in throughput:
            for sink in ("ringqueue", "delta"):
                runs = entry["runs"][sink]
                ratio = (
                    f"{entry['ratio_ringqueue_to_delta']:14.2f}"
                    if sink == "ringqueue"
                    else (" " * 14)
                )
                lines.append(
                    f"{entry['body_size']:>6}B {entry['messages']:>11,} {sink:<10} "
                    f"{entry['best_seconds'][sink]:>8.2f} "
                    f"{entry['messages_per_second'][sink]:>11,.0f} "
                    f"{entry['mb_per_second'][sink]:>8.1f} {runs[0]['micro_batches']:>7}  "
                    f"{ratio}  {'ok' if all(r['check'] == 'ok' for r in runs) else 'FAILED'}"
                )
            lines.append(
                f"{'':>7} ringSize {entry['ring_size']:,}; all times (s): "
                + "; ".join(
                    f"{s} " + ", ".join(f"{r['seconds']:.2f}" for r in entry["runs"][s])
                    for s in ("ringqueue", "delta")
                )
            )
    depth = results.get("depth")
    if depth:
        lines += [
            "",
            f"2. Depth: one batch write of {depth['batch_messages']:,} x "
            f"{depth['body_size']} B into a full ring (median of "
            f"{len(depth['batch_seconds']['small'])})",
            f"{'depth':>12} {'median s':>9}  {'all s':<30} {'versions/files':>15}  check",
        ]
        for label in ("small", "large"):
            shape = depth["tables"][label]
            lines.append(
                f"{depth['depths'][label]:>12,} {depth['median_seconds'][label]:>9.2f}  "
                f"{', '.join(f'{t:.2f}' for t in depth['batch_seconds'][label]):<30} "
                f"{shape['version']:>7}/{shape['active_files']:<7}  {depth['checks'][label]}"
            )
        ratio = depth["ratio_large_to_small"]
        verdict = "meets" if ratio <= depth["goal_ratio_max"] else "MISSES"
        lines.append(
            f"{'':>12} ratio large/small = {ratio:.2f} ({verdict} the goal <= "
            f"{depth['goal_ratio_max']})"
        )
    creep = results.get("creep")
    if creep:
        shape = creep["table"]
        lines += [
            "",
            f"3. Creep: {creep['batches']:,} consecutive batch writes of "
            f"{creep['batch_messages']} x {SMALL_BODY} B, ringSize {creep['ring_size']:,}",
            f"   median of the first {creep['window']}: "
            f"{creep['median_first_seconds'] * 1000:8.1f} ms",
            f"   median of the last  {creep['window']}: "
            f"{creep['median_last_seconds'] * 1000:8.1f} ms",
            f"   ratio last/first = {creep['ratio_last_to_first']:.2f}; linear trend "
            f"{creep['trend_seconds_per_100_batches'] * 1000:+.1f} ms per 100 batches",
            f"   final table: version {shape['version']}, {shape['active_files']} active "
            f"files; check {creep['check']}",
        ]
    lines += ["", f"results: {results['out']}", f"total time: {results['seconds']:.0f}s", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-sink-", dir=args.tmp_dir))
    results: dict[str, Any] = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": environment(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    sections: dict[str, Callable[[SparkSession, argparse.Namespace, Path], Any]] = {
        "throughput": bench_throughput,
        "depth": bench_depth,
        "creep": bench_creep,
    }
    conf = dict(item.split("=", 1) for item in args.conf)
    conf.setdefault("spark.sql.streaming.numRecentProgressUpdates", "100000")  # count rows
    spark = local_session(app_name="bench-sink", conf=conf)
    try:
        progress(f"Spark {spark.version}, work folder {work}")
        warm_up(spark, work, args.seed)
        for name in args.sections:
            progress(f"--- {name}")
            results[name] = sections[name](spark, args, work)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    results["seconds"] = time.perf_counter() - started
    results["checks_ok"] = all(
        entry["checks_ok"]
        for name in args.sections
        for entry in (results[name] if isinstance(results[name], list) else [results[name]])
    )
    results["out"] = str(args.out)
    write_results(args.out, results, show=False)
    print(summary(results))
    if not results["checks_ok"]:
        print("WARNING: some result checks FAILED (see above and the JSON)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
