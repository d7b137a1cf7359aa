"""Many producers on one queue: what contention costs.

K producer processes (``QueueTable.publish``, no Spark) each publish BATCHES batches of
MESSAGES messages to one queue table, either all to **one** queue or each to **its own**
queue of the same table, in one run, the two layouts taking turns. Every commit to a queue
table conflicts with any concurrent one (Delta's optimistic commit), so both layouts retry;
only producers of one queue also renumber their batch when another committed first.

Reports, per layout and K: aggregate messages per second, publish latency p50 / p99, and
attempts per commit (1 = no conflict); and the ratio one-queue / own-queues (goal >= 0.8).

    .venv/bin/python benchmarks/bench_producers.py [--producers 2 4] [--batches 20]
        [--messages 10000] [--body-bytes 200] [--repeats 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from common import median, percentile, write_results


def produce(path: str, queue: str, batches: int, messages: int, body: int, go) -> list:
    """One producer process: publish, return (seconds, attempt) per publish."""
    from spark_queue import QueueTable

    table = QueueTable(path)
    # Random bodies: a repeated byte compresses to nothing and would make every file
    # "small", which real payloads are not.
    rows = pa.table({"body": pa.array([os.urandom(body) for _ in range(messages)], pa.binary())})
    go.wait()
    timings = []
    for _ in range(batches):
        started = time.perf_counter()
        result = table.publish(queue, rows)
        timings.append((time.perf_counter() - started, result.attempts))
    return timings


def run_layout(k: int, shared: bool, args: argparse.Namespace) -> dict:
    from spark_queue import QueueTable

    with tempfile.TemporaryDirectory(prefix="bench-producers-") as folder:
        path = str(Path(folder) / "queues")
        table = QueueTable(path)
        queues = ["q"] * k if shared else [f"q{i}" for i in range(k)]
        for name in sorted(set(queues)):
            table.declare(name)
        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager, context.Pool(k) as pool:
            go = manager.Barrier(k + 1)
            pending = [
                pool.apply_async(
                    produce, (path, q, args.batches, args.messages, args.body_bytes, go)
                )
                for q in queues
            ]
            go.wait()
            started = time.perf_counter()
            timings = [t for p in pending for t in p.get()]
            elapsed = time.perf_counter() - started
        total = sum(table.stats(q)["added"] for q in sorted(set(queues)))
        assert total == k * args.batches * args.messages, "a message was lost or doubled"
    latencies = [t for t, _ in timings]
    return {
        "rate": total / elapsed,
        "p50": median(latencies),
        "p99": percentile(latencies, 0.99),
        "attempts": statistics.mean(a for _, a in timings),
        "max_attempts": max(a for _, a in timings),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--body-bytes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(
        f"{args.batches} batches x {args.messages} messages x {args.body_bytes} B per producer; "
        f"best of {args.repeats}"
    )
    print("| producers | layout | messages/s | p50 s | p99 s | attempts/commit (max) |")
    print("|---|---|---|---|---|---|")
    results = []
    for k in args.producers:
        best: dict[bool, dict] = {}
        for _ in range(args.repeats):
            for shared in (True, False):
                result = run_layout(k, shared, args)
                if shared not in best or result["rate"] > best[shared]["rate"]:
                    best[shared] = result
        for shared in (True, False):
            r = best[shared]
            print(
                f"| {k} | {'one queue' if shared else 'own queues'} | {r['rate']:,.0f} | "
                f"{r['p50']:.3f} | {r['p99']:.3f} | {r['attempts']:.2f} ({r['max_attempts']}) |"
            )
        ratio = best[True]["rate"] / best[False]["rate"]
        print(f"| {k} | ratio one / own | {ratio:.2f} | | | |")
        results.append({"producers": k, "one_queue": best[True], "own_queues": best[False]})
    target = write_results(
        f"producers-{args.messages}x{args.batches}.json",
        {"arguments": vars(args), "results": results},
        show=False,
    )
    print(f"figures: {target}")


if __name__ == "__main__":
    main()
