"""A queue table on object storage against one on local disk, and what a commit costs in
requests.

One run, side by side: a local S3-compatible server (moto's, started here on 127.0.0.1 with
its request log on) and a local folder. For each batch size:

- **enqueue**: ``QueueTable.publish`` of a batch of random 100-byte bodies, repeated;
- **consume**: ``QueueTable.lease`` of a batch, then ``ack`` of it, repeated;
- **commit latency**: p50 and p99 of each publish (the p99 of a few runs is their maximum);
- **requests per commit**: the server's log between two marks, by method and by what was
  touched (the Delta log, message files, state files), for a publish, a lease, an ack, and
  a plain delta-rs append of the same rows (``write_deltalake(mode="append")``), the yardstick
  of the goal: no request per commit that a plain append would not make, beyond the state.

moto keeps objects in memory and answers in well under a millisecond, so the throughput
ratios here measure the client's request pattern and CPU, not a network: on a real store
every request is a round trip of ~10-30 ms, and the request counts are what predict cost.

    .venv/bin/python benchmarks/bench_storage.py [--sizes 10000 1000000] [--repeats 20 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
from common import median, percentile, write_results
from deltalake import write_deltalake

from spark_queue import QueueTable
from tests.object_store import RequestLog, new_bucket, server_options, start_s3_server


def rows(count: int) -> pa.Table:
    return pa.table({"body": pa.array([os.urandom(100) for _ in range(count)], pa.binary())})


def counted(requests: list[tuple[str, str]]) -> Counter:
    """Requests by method, and by method and what they touch."""
    counts: Counter = Counter()
    for method, target in requests:
        if "_delta_log" in target or "list-type" in target:
            what = "log"
        elif "record%3Dmessage" in target or "record=message" in target:
            what = "messages"
        elif "record" in target:
            what = "state"
        else:
            what = "other"
        counts[method] += 1
        counts[f"{method} {what}"] += 1
    return counts


def measure(table: QueueTable, size: int, repeats: int) -> dict:
    batch = rows(size)
    table.publish("q", batch)  # creates the table and the queue: not measured
    latencies = []
    started = time.perf_counter()
    for _ in range(repeats):
        begun = time.perf_counter()
        table.publish("q", batch)
        latencies.append(time.perf_counter() - begun)
    enqueue = size * repeats / (time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(repeats):
        leased = table.lease("q", consumer="bench", max_messages=size)
        table.ack("q", leased.column("seq"), consumer="bench")
    consume = size * repeats / (time.perf_counter() - started)
    return {
        "enqueue_msgs_per_s": round(enqueue),
        "consume_msgs_per_s": round(consume),
        "commit_p50_ms": round(1000 * median(latencies), 1),
        "commit_p99_ms": round(1000 * percentile(latencies, 0.99), 1),
    }


def requests_per_commit(table: QueueTable, uri: str, options: dict, log: RequestLog) -> dict:
    batch = rows(10_000)
    table.publish("r", batch)  # creates the table and the queue: not counted
    table.ack("r", table.lease("r", consumer="count", max_messages=10_000).column("seq"))
    counts = {}
    log.mark()
    table.publish("r", batch)
    counts["publish"] = counted(log.since_mark())
    log.mark()
    leased = table.lease("r", consumer="count", max_messages=10_000)
    counts["lease"] = counted(log.since_mark())
    log.mark()
    table.ack("r", leased.column("seq"), consumer="count")
    counts["ack"] = counted(log.since_mark())
    log.mark()
    table.lease("r", consumer="count", max_messages=10_000)
    counts["idle lease"] = counted(log.since_mark())
    plain = uri.rsplit("/", 1)[0] + "/plain"
    write_deltalake(plain, batch, storage_options=options)  # creates it: not counted
    log.mark()
    write_deltalake(plain, batch, mode="append", storage_options=options)
    counts["delta append"] = counted(log.since_mark())
    return {name: dict(sorted(c.items())) for name, c in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--repeats", type=int, nargs="+", default=[20, 3])
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    log_path = scratch / "s3.log"
    server, endpoint = start_s3_server(str(log_path))
    try:
        options = server_options(endpoint)
        results: dict = {"sizes": {}}
        for size, repeats in zip(args.sizes, args.repeats, strict=True):
            bucket = new_bucket(options, f"bench-{size}")
            s3 = measure(QueueTable(f"s3://{bucket}/q", storage_options=options), size, repeats)
            disk = measure(QueueTable(str(scratch / f"disk-{size}")), size, repeats)
            results["sizes"][size] = {"s3": s3, "disk": disk, "repeats": repeats}
            print(f"batch {size:>9,}: s3 {s3}\n{'':17}disk {disk}", flush=True)
        bucket = new_bucket(options, "requests")
        uri = f"s3://{bucket}/lake/queues"
        results["requests"] = requests_per_commit(
            QueueTable(uri, storage_options=options), uri, options, RequestLog(str(log_path))
        )
        for name, counts in results["requests"].items():
            print(f"{name:>13}: {counts}")
        write_results("storage.json", results, show=False)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
