"""Round trips on object storage: what each operation costs in requests, in all and in a row,
and in time when every request costs D ms more, side by side with a plain delta-rs append.

A latency proxy (``tests/latency_proxy.py``) in front of a local S3 server (moto's) holds the
first chunk of each HTTP request ``D`` ms, for each of ``--delays`` (a proxy each), and records
each request's start and end. A window's requests **in a row** are the longest chain of
requests each of which started after the one before it ended: the round trips a caller waits
for. Each part runs on a table of its own (a bucket each), one writer, warmed up first:

- **operations** (``ops``), ``--repeats`` times in turn: a one-message ``publish`` (into a
  queue of its own), then on another queue (not measured) a publish of 10 messages (one
  message file), ``lease(max_messages=10)`` of them, ``ack`` of them, an idle ``lease``
  (nothing to do), and a plain delta-rs ``write_deltalake`` append of one row (the
  yardstick; in a bucket of its own, to a table of one version each time, as delta-rs
  reads the whole log after its last checkpoint, so its cost grows with the log). Each
  call starts once the one before has left no request running (upkeep in a thread).
  p50 and p90 ms of each, and its requests in all and in a row (median and range); the
  breakdown by method and by what the request touched is that of the most frequent count.
  ``QueueTable(broker="off")``;
- **threads**: ``--threads`` threads of one process making one-message ``publish`` calls on
  one table for ``--seconds``, direct (the process's group commit) and through a broker (a
  ``spark-queue broker`` process on the table, also behind the proxy, the threads its
  clients): msg/s, commits/s and requests per commit;
- **spark** (takes a SparkSession: run it under ``flock /tmp/spark-tests.lock``): a streaming
  sink's micro-batch of 10 rows (a file source into ``writeStream.format("ringqueue")`` on
  ``s3://``; the trigger's ms and requests), and a streaming source's lease of 10
  (``readStream.format("ringqueue")`` on ``s3://``, a ``noop`` sink; Spark's
  ``latestOffset`` ms and the requests in it, and the rest of the trigger: planning and
  reading the batch), ``--batches`` micro-batches after a first one that starts the Python
  workers, with the median of each of Spark's phases. A trigger's window is its progress's
  timestamp and durations (one clock: one machine).

moto, on the same machine, takes a few milliseconds of CPU a request (its time is in the
figures at every delay), so ``D`` stands for a store's round trip (~10-30 ms on S3 in a
region); new connections cost nothing here (clients keep theirs alive). Results go
to ``benchmarks/out/round_trips.json`` (``round_trips-PARTS.json`` for some parts), with the
figures ``benchmarks/plots.py`` draws (``figures``: copy them into
``docs/benchmarks/figures.json``).

    .venv/bin/python benchmarks/bench_round_trips.py [--delays 0,10,20,50] [--repeats 12]
        [--threads 32] [--seconds 5] [--batches 8] [--parts ops threads spark]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from bench_clients import QUEUE, publish_loop, run_threads, serving
from common import environment, median, percentile, progress, write_results

from tests.latency_proxy import LatencyProxy, RoundTrips
from tests.object_store import new_bucket, server_options, start_s3_server

PARTS = ("ops", "threads", "spark")
PUBLISHED = "published"  # the one-message publishes go here, never leased
CONSUMER = "bench"
OPERATIONS = ("publish", "lease(10)", "ack of 10", "idle lease", "delta-rs append")
PLOTTED = (
    "publish",
    "lease(10)",
    "ack of 10",
    "delta-rs append",
    "sink micro-batch",
    "source lease",
)
BODY = b"x" * 200


# -- counting -----------------------------------------------------------------------------------


def kind_of(target: str) -> str:
    """What a request touched: the Delta log (entries, checkpoints, a listing), a message
    file, a state file (leases, queue states, ...), or another data file."""
    if "list-type=" in target:
        return "log listing"
    if "/_delta_log/" in target:
        return "checkpoint" if "checkpoint" in target else "log entry"
    if "record%3Dmessage" in target or "record=message" in target:
        return "message file"
    if "record%3D" in target or "record=" in target:
        return "state file"
    return "data file"


def breakdown(trips: RoundTrips) -> dict[str, int]:
    """Requests by method and what they touched (``GET log entry``: 7)."""
    counts = Counter(f"{r.method} {kind_of(r.target)}" for r in trips.requests)
    return dict(sorted(counts.items()))


def summary(samples: list[tuple[float, RoundTrips]]) -> dict[str, Any]:
    """p50/p90 ms of ``(seconds, trips)`` samples, their requests in all, in a row and left
    running after the call returned (median, min, max), and the most frequent (in all, in a
    row) with its breakdown."""
    seconds = [s for s, _ in samples]
    trips = [t for _, t in samples]
    pairs = Counter((t.in_all, t.in_a_row) for t in trips)
    (in_all, row), seen = pairs.most_common(1)[0]
    typical = next(t for t in trips if (t.in_all, t.in_a_row) == (in_all, row))

    def spread(values: list[int]) -> dict[str, float]:
        return {"median": median(values), "min": min(values), "max": max(values)}

    return {
        "samples": len(samples),
        "p50_ms": round(1000 * median(seconds), 1),
        "p90_ms": round(1000 * percentile(seconds, 0.9), 1),
        "in_all": spread([t.in_all for t in trips]),
        "in_a_row": spread([t.in_a_row for t in trips]),
        # Requests the call started and left running when it returned (upkeep in a thread).
        "after_return": spread([len(t.after_return) for t in trips]),
        "typical": {
            "in_all": in_all,
            "in_a_row": row,
            "of_samples": seen,
            "by_method": typical.by_method,
            "by_kind": breakdown(typical),
        },
    }


def through(proxy: LatencyProxy, options: dict[str, str]) -> dict[str, str]:
    """``options`` reaching the S3 server through ``proxy``."""
    return {**options, "AWS_ENDPOINT_URL": proxy.endpoint}


# -- operations ---------------------------------------------------------------------------------


def measure_operations(
    proxy: LatencyProxy, direct: dict[str, str], delay_ms: int, repeats: int
) -> dict:
    from deltalake import write_deltalake

    from spark_queue import QueueTable

    bucket = new_bucket(direct, "round-trips-ops")
    plain_bucket = new_bucket(direct, "round-trips-delta-rs")  # apart from the queue's upkeep
    options = through(proxy, direct)
    table = QueueTable(f"s3://{bucket}/lake/queues", storage_options=options, broker="off")
    table.publish(PUBLISHED, [BODY])  # creates the table and the queues; warms the path
    table.publish(QUEUE, [BODY])
    table.ack(QUEUE, table.lease(QUEUE, CONSUMER, max_messages=10)["seq"], CONSUMER)
    row = pa.table({"body": pa.array([BODY], pa.binary())})
    samples: dict[str, list[tuple[float, RoundTrips]]] = {name: [] for name in OPERATIONS}
    quiet = 0.1 + 4 * delay_ms / 1000  # no request for this long: the last call's are done

    def sample(name: str, action: Callable[[], Any], where: str = bucket) -> Any:
        proxy.quiet(where, quiet)
        with proxy.counting(where) as trips:
            began = time.perf_counter()
            result = action()
            took = time.perf_counter() - began
        samples[name].append((took, trips))
        return result

    for n in range(repeats):
        sample("publish", lambda: table.publish(PUBLISHED, [BODY]))
        table.publish(QUEUE, [BODY] * 10)  # one message file
        leased = sample("lease(10)", lambda: table.lease(QUEUE, CONSUMER, max_messages=10))
        assert leased.num_rows == 10, leased.num_rows
        seqs = leased["seq"]
        acked = sample("ack of 10", lambda seqs=seqs: table.ack(QUEUE, seqs, CONSUMER))
        assert acked == 10, acked
        idle = sample("idle lease", lambda: table.lease(QUEUE, CONSUMER, max_messages=10))
        assert idle.num_rows == 0, idle.num_rows
        plain = f"s3://{plain_bucket}/plain-{n}"
        write_deltalake(plain, row, storage_options=options)  # its version 0
        sample(
            "delta-rs append",
            lambda plain=plain: write_deltalake(plain, row, mode="append", storage_options=options),
            plain_bucket,
        )
    return {name: summary(values) for name, values in samples.items()}


# -- threads ------------------------------------------------------------------------------------


def measure_threads(
    proxy: LatencyProxy, direct: dict[str, str], via: str, count: int, seconds: float, logs: Path
) -> dict:
    """``count`` threads' one-message publishes on a table of their own for ``seconds``,
    ``via`` ``direct`` or ``broker``."""
    from spark_queue import QueueTable

    bucket = new_bucket(direct, f"round-trips-{via}")
    path = f"s3://{bucket}/lake/queues"
    options = through(proxy, direct)
    table = QueueTable(path, storage_options=direct, broker="off")  # reads, not through it
    QueueTable(path, storage_options=options, broker="off").declare(QUEUE)
    started = 0.0

    def release() -> int:
        nonlocal started
        version = table.store.open().version()
        started = time.time()
        return version

    with serving(path, options, via, logs) as target:
        loops, before = run_threads(
            count, lambda n, go: publish_loop(target, f"t{n}", seconds, go), release
        )
        ended = time.time()
    trips = proxy.between(started, ended, bucket)
    sent, errors = sum(s for s, _ in loops), sum(e for _, e in loops)
    assert table.stats(QUEUE)["added"] == sent, (table.stats(QUEUE), sent)
    commits = table.store.open().version() - before
    elapsed = ended - started
    result = {
        "msg_per_s": round(sent / elapsed, 1),
        "commits_per_s": round(commits / elapsed, 2),
        "requests_per_commit": round(trips.in_all / commits, 2) if commits else None,
        "errors": errors,
        "seconds": round(elapsed, 2),
    }
    progress(f"  {count} threads, {via}: {result}")
    return result


# -- Spark --------------------------------------------------------------------------------------


def storage(options: dict[str, str]) -> dict[str, str]:
    """Storage options as data source options."""
    return {f"storage.{key.lower()}": value for key, value in options.items()}


def epoch(stamp: str) -> float:
    """A progress timestamp (``2026-01-01T00:00:00.123Z``) in ``time.time()`` seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def batches_with_rows(query: Any) -> list[dict]:
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def phases(batches: list[dict]) -> dict[str, float]:
    """The median ms of each of Spark's phases of ``batches`` (their ``durationMs``)."""
    names = sorted({name for batch in batches for name in batch["durationMs"]})
    return {n: median([b["durationMs"].get(n, 0) for b in batches]) for n in names}


def run_batches(query: Any, batches: int, feed: Callable[[int], None]) -> list[dict]:
    """``feed(n)`` then wait for its micro-batch, ``batches + 1`` times, then for a trigger
    that finds nothing more; the progress of each batch after the first (which starts the
    Python workers)."""
    for n in range(batches + 1):
        feed(n)
        deadline = time.monotonic() + 120
        while len(batches_with_rows(query)) <= n:
            assert time.monotonic() < deadline, "no micro-batch for the fed rows"
            assert query.exception() is None, query.exception()
            time.sleep(0.01)
        query.processAllAvailable()  # a trigger after it (the source's acknowledges it)
    return batches_with_rows(query)[1:]


def measure_sink(
    spark: Any, proxy: LatencyProxy, direct: dict[str, str], batches: int, work: Path
) -> dict:
    bucket = new_bucket(direct, "round-trips-sink")
    files = work / "sink-input"
    files.mkdir()
    query = (
        spark.readStream.schema("body binary")
        .parquet(str(files))
        .writeStream.format("ringqueue")
        .option("queue", QUEUE)
        .options(**storage(through(proxy, direct)))
        .option("checkpointLocation", str(work / "sink-checkpoint"))
        .trigger(processingTime="0 seconds")
        .start(f"s3://{bucket}/lake/queues")
    )

    def feed(n: int) -> None:
        staged = work / f"rows-{n}.parquet"
        pq.write_table(pa.table({"body": pa.array([BODY] * 10, pa.binary())}), staged)
        os.replace(staged, files / staged.name)  # whole, or not at all, in the folder

    try:
        measured = run_batches(query, batches, feed)
    finally:
        query.stop()
    samples = []
    for batch in measured:
        start = epoch(batch["timestamp"])
        end = start + batch["durationMs"]["triggerExecution"] / 1000
        trips = proxy.between(start - 0.001, end + 0.002, bucket)
        samples.append((batch["durationMs"]["triggerExecution"] / 1000, trips))
    return {"sink micro-batch": {**summary(samples), "phases_p50_ms": phases(measured)}}


def measure_source(
    spark: Any, proxy: LatencyProxy, direct: dict[str, str], batches: int, work: Path
) -> dict:
    from spark_queue import QueueTable

    bucket = new_bucket(direct, "round-trips-source")
    uri = f"s3://{bucket}/lake/queues"
    producer = QueueTable(uri, storage_options=direct, broker="off")  # not through the proxy
    producer.declare(QUEUE)
    query = (
        spark.readStream.format("ringqueue")
        .option("queue", QUEUE)
        .option("consumer", CONSUMER)
        .options(**storage(through(proxy, direct)))
        .load(uri)
        .writeStream.format("noop")
        .option("checkpointLocation", str(work / "source-checkpoint"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        measured = run_batches(query, batches, lambda _: producer.publish(QUEUE, [BODY] * 10))
    finally:
        query.stop()
    leases, reads = [], []
    for batch in measured:
        assert batch["numInputRows"] == 10, batch["numInputRows"]
        durations = batch["durationMs"]
        start = epoch(batch["timestamp"])
        leased = start + durations["latestOffset"] / 1000 + 0.002
        end = start + durations["triggerExecution"] / 1000 + 0.002
        lease_time = durations["latestOffset"] / 1000
        leases.append((lease_time, proxy.between(start - 0.001, leased, bucket)))
        read_time = (durations["triggerExecution"] - durations["latestOffset"]) / 1000
        reads.append((read_time, proxy.between(leased, end, bucket)))
    return {
        "source lease": {**summary(leases), "phases_p50_ms": phases(measured)},
        "source read": summary(reads),
    }


# -- the run ------------------------------------------------------------------------------------


def markdown(delay: int, rows: dict[str, dict]) -> str:
    lines = [
        f"\n| at {delay} ms a request | p50 ms | p90 ms | requests in all | in a row | "
        "typical breakdown |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        typical = row["typical"]
        lines.append(
            f"| {name} | {row['p50_ms']} | {row['p90_ms']} | "
            f"{row['in_all']['median']:g} ({row['in_all']['min']}-{row['in_all']['max']}) | "
            f"{row['in_a_row']['median']:g} ({row['in_a_row']['min']}-{row['in_a_row']['max']}) | "
            f"{typical['in_all']}/{typical['in_a_row']}: {typical['by_kind']} |"
        )
    return "\n".join(lines)


def figures(results: dict) -> dict:
    """The plot's figures (docs/benchmarks/figures.json, key ``round_trips``)."""
    delays = results["delays_ms"]
    latency = {}
    for part in ("operations", "spark"):
        for name in PLOTTED:
            if name in results.get(part, {}).get(str(delays[0]), {}):
                latency[name] = [results[part][str(d)][name]["p50_ms"] for d in delays]
    figure: dict[str, Any] = {
        "source": "bench_round_trips.py: p50 ms of one call, and 32 threads' one-message "
        "publishes, against the delay the proxy adds to each request",
        "delays_ms": delays,
        "p50_ms": latency,
    }
    if "threads" in results:
        figure["threads"] = {
            f"{measure}, {via}": [results["threads"][str(d)][via][measure] for d in delays]
            for measure in ("msg_per_s", "commits_per_s")
            for via in ("direct", "broker")
        }
    return figure


def delays(text: str) -> list[int]:
    """``"0,10,20"`` -> ``[0, 10, 20]``: whole milliseconds, 0 or more."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole ms separated by commas: {text!r}"
        ) from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected ms, 0 or more: {text!r}")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--delays", type=delays, default=[0, 10, 20, 50], help="ms added to each request"
    )
    parser.add_argument("--repeats", type=int, default=12, help="samples of each operation")
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0, help="of each threads measure")
    parser.add_argument("--batches", type=int, default=8, help="measured Spark micro-batches")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-round-trips-"))
    server, endpoint = start_s3_server()
    spark = None
    if "spark" in args.parts:
        from spark_queue import local_session

        spark = local_session("bench-round-trips")
    results: dict[str, Any] = {"environment": environment(), "args": vars(args)}
    results["delays_ms"] = args.delays
    try:
        direct = server_options(endpoint)
        for delay in args.delays:
            progress(f"delay {delay} ms")
            with LatencyProxy(endpoint, delay) as proxy:
                rows: dict[str, dict] = {}
                if "ops" in args.parts:
                    measured = measure_operations(proxy, direct, delay, args.repeats)
                    results.setdefault("operations", {})[str(delay)] = measured
                    rows.update(measured)
                if spark is not None:
                    work = scratch / f"spark-{delay}"
                    work.mkdir()
                    measured = measure_sink(spark, proxy, direct, args.batches, work)
                    measured.update(measure_source(spark, proxy, direct, args.batches, work))
                    results.setdefault("spark", {})[str(delay)] = measured
                    rows.update(measured)
                print(markdown(delay, rows), flush=True)
                if "threads" in args.parts:
                    results.setdefault("threads", {})[str(delay)] = {
                        via: measure_threads(
                            proxy, direct, via, args.threads, args.seconds, scratch
                        )
                        for via in ("direct", "broker")
                    }
        results["figures"] = figures(results)
        name = (
            "round_trips"
            if set(args.parts) == set(PARTS)
            else "round_trips-" + "-".join(args.parts)
        )
        print(f"\nwrote {write_results(f'{name}.json', results, show=False)}")
    finally:
        if spark is not None:
            spark.stop()
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
