"""Scale of one queue table: K competing consumers on one queue.

A queue of ``--messages`` messages (200 random bytes each) is drained by K competing
consumers, each under its own consumer name, and the aggregate rate of acknowledged
messages is measured:

- **workers**: K processes looping ``QueueTable.lease(max_messages=--batch)`` then
  ``QueueTable.ack`` (two commits per batch);
- **queries**: K streaming queries of one Spark application (``readStream.format
  ("ringqueue")`` with ``maxMessagesPerTrigger=--batch``, ``noop`` sink; one commit per
  micro-batch leases it and acknowledges the one before), sharing its 2 cores.

Every commit to the table conflicts with any concurrent one; attempts per commit (1 = no
conflict) come from the ``attempt`` each connector commit records in its ``commitInfo``.
Each run checks that every message was acknowledged once and nothing is left.

    .venv/bin/python benchmarks/bench_scale.py [--consumers 1 2 4 8] [--messages 100000]
        [--batch 1000] [--kinds workers queries]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import attempts_by_operation, fill, write_results

QUEUE = "q"


def work(path: str, consumer: str, batch: int, go) -> int:
    """One worker process: lease and ack until the queue stays empty; returns acked."""
    from spark_queue import QueueTable

    table = QueueTable(path)
    go.wait()
    acked = empty = 0
    while empty < 3:
        rows = table.lease(QUEUE, consumer, max_messages=batch)
        if not rows.num_rows:
            empty += 1
            continue
        empty = 0
        acked += table.ack(QUEUE, rows["seq"].to_pylist(), consumer)
    return acked


def run_workers(k: int, path: str, args: argparse.Namespace) -> float:
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(k) as pool:
        go = manager.Barrier(k + 1)
        pending = [pool.apply_async(work, (path, f"w{i}", args.batch, go)) for i in range(k)]
        go.wait()
        started = time.perf_counter()
        acked = sum(p.get() for p in pending)
        elapsed = time.perf_counter() - started
    assert acked == args.messages, f"acked {acked} of {args.messages}"
    return elapsed


def run_queries(k: int, path: str, work_dir: Path, args: argparse.Namespace) -> float:
    from spark_queue import local_session

    spark = local_session("bench-scale")  # started before the clock: one JVM for all runs
    queries = []
    started = time.perf_counter()
    for i in range(k):
        queries.append(
            spark.readStream.format("ringqueue")
            .option("path", path)
            .option("queue", QUEUE)
            .option("consumer", f"s{i}")
            .option("maxMessagesPerTrigger", args.batch)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(work_dir / f"checkpoint-{k}-{i}"))
            .trigger(availableNow=True)
            .start()
        )
    for query in queries:
        query.awaitTermination()
    elapsed = time.perf_counter() - started
    return elapsed


def run(kind: str, k: int, args: argparse.Namespace) -> dict:
    from spark_queue import QueueTable

    with tempfile.TemporaryDirectory(prefix="bench-scale-") as folder:
        path = str(Path(folder) / "queues")
        fill(path, args.messages, queue=QUEUE)
        if kind == "workers":
            elapsed = run_workers(k, path, args)
        else:
            elapsed = run_queries(k, path, Path(folder), args)
        stats = QueueTable(path).stats(QUEUE)
        delivered = stats["acked"] + stats["leased"]  # a query's last batch stays leased
        assert delivered == args.messages and stats["ready"] == 0, stats
        attempts = {
            op: a
            for op, a in attempts_by_operation(path).items()
            if op in ("LEASE", "ACK", "CONSUME")
        }
    commits = sum(len(a) for a in attempts.values())
    return {
        "kind": kind,
        "consumers": k,
        "rate": args.messages / elapsed,
        "commits": commits,
        "commits_per_s": commits / elapsed,
        "attempts": statistics.mean(x for a in attempts.values() for x in a),
        "max_attempts": max(x for a in attempts.values() for x in a),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--kinds", nargs="+", default=["workers", "queries"])
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    if "queries" in args.kinds:
        from spark_queue import local_session

        local_session("bench-scale")
    print(f"{args.messages} messages of 200 B, batches of {args.batch}")
    print("| consumers | kind | acked msg/s | commits | commits/s | attempts/commit (max) |")
    print("|---|---|---|---|---|---|")
    results = []
    for kind in args.kinds:
        for k in args.consumers:
            r = run(kind, k, args)
            results.append(r)
            print(
                f"| {k} | {kind} | {r['rate']:,.0f} | {r['commits']} | {r['commits_per_s']:.1f} | "
                f"{r['attempts']:.2f} ({r['max_attempts']}) |",
                flush=True,
            )
    target = write_results("scale.json", {"arguments": vars(args), "results": results}, show=False)
    print(f"figures: {target}")


if __name__ == "__main__":
    main()
