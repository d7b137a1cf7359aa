"""Many small clients on one queue table (issue #23), direct (each process's group commit).

- **workers**: W processes, each one ``QueueTable.consumer`` whose handler does nothing,
  drain ``--messages`` messages; the aggregate rate is messages / time to drain (each
  worker's prefetch starts at one message and grows, so this includes the ramp);
- **steady**: the same for ``--seconds`` on a queue that never runs dry;
- **raw**: the issue's baseline, W processes looping ``lease(max_messages=10)`` then
  ``ack`` (two commits per 10 messages), for ``--seconds``;
- **slow**: W processes whose handler takes ``--handler-ms`` a message, for ``--seconds``;
  the aggregate rate against the ideal W x 1000 / handler-ms, with per-worker counts;
- **publishers**: P clients making single-message ``publish`` calls for ``--seconds``: P
  threads of one process (its group commit), P processes, and P threads sending through
  one ``Publisher``;
- **latency**: a consumer process waiting on an idle queue, another process publishing one
  message every 0.2 s: time from the publish call's return (and from the call) to the
  message in the handler.

Every run counts the errors that reached callers (the goal is none) and checks that each
message was acknowledged once. ``--store s3`` runs on a local moto S3 server (as the
suite's ``s3_table``). Results are printed as Markdown rows.

    .venv/bin/python benchmarks/bench_clients.py [--store local|s3] [--only workers ...]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

QUEUE = "q"


def fill(path: str, options: dict | None, messages: int) -> None:
    from spark_queue import QueueTable

    table = QueueTable(path, storage_options=options)
    table.declare(QUEUE)
    for start in range(0, messages, 10_000):
        table.publish(QUEUE, [os.urandom(200) for _ in range(min(10_000, messages - start))])


def worker(path: str, options: dict | None, name: str, handler_s: float, seconds: float, go):
    """A worker process: returns (handled, errors, time of its last handled message)."""
    from spark_queue import QueueTable

    table = QueueTable(path, storage_options=options)
    table.lease(QUEUE, name, max_messages=0)  # warm: the table opened, its state read
    handled = errors = 0
    last = 0.0
    go.wait()
    stop = time.time() + seconds if seconds else None
    with table.consumer(QUEUE, name) as consumer:
        while stop is None or time.time() < stop:
            try:
                got = consumer.receive(100, timeout=3.0 if stop is None else 0.5)
            except Exception:  # counted: the goal is none
                errors += 1
                continue
            if not got and stop is None and consumer.idle:  # its last lease found nothing
                break
            for message in got:
                if handler_s:
                    time.sleep(handler_s)
                message.ack()
                handled += 1
                last = time.time()
    return handled, errors, last


def run_workers(path, options, count, handler_s=0.0, seconds=0.0):
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(count) as pool:
        go = manager.Barrier(count + 1)
        pending = [
            pool.apply_async(worker, (path, options, f"w{n}", handler_s, seconds, go))
            for n in range(count)
        ]
        go.wait()
        start = time.time()
        results = [p.get(timeout=3600) for p in pending]
    return start, results


def bench_steady(path_of, options, counts, seconds, messages):
    """W workers for ``seconds`` on a queue deep enough that none runs dry: the rate once
    every worker's prefetch has grown, with per-worker counts."""
    from spark_queue import QueueTable

    print(f"\n| workers W, steady ({seconds:g} s) | msg/s | errors | per worker |")
    print("|---|---|---|---|")
    for count in counts:
        path = path_of(f"steady-{count}")
        fill(path, options, messages)
        _, results = run_workers(path, options, count, 0.0, seconds)
        handled = [r[0] for r in results]
        stats = QueueTable(path, storage_options=options).stats(QUEUE)
        assert stats["acked"] == sum(handled) and stats["leased"] == 0, stats
        assert stats["ready"] > 0, "the queue ran dry: raise --steady-messages"
        print(
            f"| {count} | {sum(handled) / seconds:,.0f} | {sum(r[1] for r in results)} | "
            f"{min(handled)}-{max(handled)} |"
        )


def bench_workers(path_of, options, counts, messages):
    from spark_queue import QueueTable

    print("\n| workers W, drain | messages | seconds | msg/s | errors |")
    print("|---|---|---|---|---|")
    rates = []
    for count in counts:
        path = path_of(f"workers-{count}")
        fill(path, options, messages)
        start, results = run_workers(path, options, count)
        handled = sum(r[0] for r in results)
        errors = sum(r[1] for r in results)
        elapsed = max(r[2] for r in results) - start
        stats = QueueTable(path, storage_options=options).stats(QUEUE)
        assert handled == messages == stats["acked"], (handled, stats)
        rates.append(messages / elapsed)
        print(f"| {count} | {messages} | {elapsed:.2f} | {messages / elapsed:,.0f} | {errors} |")
    return rates


def raw_loop(path, options, name, seconds, go):
    """A worker process of the issue's baseline: ``lease(max_messages=10)`` then ``ack``."""
    from spark_queue import QueueTable

    table = QueueTable(path, storage_options=options)
    table.lease(QUEUE, name, max_messages=0)  # warm: the table opened, its state read
    acked = errors = 0
    go.wait()
    stop = time.time() + seconds
    while time.time() < stop:
        try:
            seqs = table.lease(QUEUE, name, max_messages=10)["seq"].to_pylist()
            acked += table.ack(QUEUE, seqs, name)
        except Exception:  # counted: the goal is none
            errors += 1
    return acked, errors


def bench_raw(path_of, options, counts, seconds):
    print(f"\n| raw `lease(max_messages=10)` + `ack` loops, W ({seconds:g} s) | msg/s | errors |")
    print("|---|---|---|")
    for count in counts:
        path = path_of(f"raw-{count}")
        fill(path, options, 40_000)
        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager, context.Pool(count) as pool:
            go = manager.Barrier(count + 1)
            pending = [
                pool.apply_async(raw_loop, (path, options, f"w{n}", seconds, go))
                for n in range(count)
            ]
            go.wait()
            results = [p.get(timeout=3600) for p in pending]
        acked, errors = sum(r[0] for r in results), sum(r[1] for r in results)
        print(f"| {count} | {acked / seconds:,.0f} | {errors} |")


def bench_slow(path_of, options, count, handler_ms, seconds):
    path = path_of("slow")
    fill(path, options, int(count * seconds * 1000 / handler_ms * 2))
    _, results = run_workers(path, options, count, handler_ms / 1000, seconds)
    counts = [r[0] for r in results]
    rate = sum(counts) / seconds
    ideal = count * 1000 / handler_ms
    print("\n| slow handler | W | msg/s | ideal | ratio | errors | per worker |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {handler_ms} ms | {count} | {rate:.0f} | {ideal:.0f} | {rate / ideal:.2f} | "
        f"{sum(r[1] for r in results)} | {min(counts)}-{max(counts)} "
        f"(median {statistics.median(counts):.0f}) |"
    )


def publish_loop(path, options, name, seconds, go):
    from spark_queue import QueueTable

    table = QueueTable(path, storage_options=options)
    table.lease(QUEUE, name, max_messages=0)  # warm: the table opened, its state read
    sent = errors = 0
    go.wait()
    stop = time.time() + seconds
    while time.time() < stop:
        try:
            table.publish(QUEUE, [f"{name}-{sent}"])
            sent += 1
        except Exception:  # counted: the goal is none
            errors += 1
    return sent, errors


def bench_publishers(path_of, options, count, seconds):
    from spark_queue import QueueTable

    print("\n| single-message publish calls | P | msg/s | errors | commits |")
    print("|---|---|---|---|---|")
    # Threads of one process: its group commit.
    path = path_of("publish-threads")
    table = QueueTable(path, storage_options=options)
    table.declare(QUEUE)
    before = table.store.open().version()
    go = threading.Barrier(count + 1)
    results: list = []
    threads = [
        threading.Thread(
            target=lambda n=n: results.append(publish_loop(path, options, f"t{n}", seconds, go))
        )
        for n in range(count)
    ]
    for thread in threads:
        thread.start()
    go.wait()
    for thread in threads:
        thread.join()
    sent, errors = sum(r[0] for r in results), sum(r[1] for r in results)
    commits = table.store.open().version() - before
    assert table.stats(QUEUE)["added"] == sent
    print(f"| `publish`, threads | {count} | {sent / seconds:,.0f} | {errors} | {commits} |")
    # Processes: a group commit each, contending for the table.
    path = path_of("publish-processes")
    table = QueueTable(path, storage_options=options)
    table.declare(QUEUE)
    before = table.store.open().version()
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(count) as pool:
        go = manager.Barrier(count + 1)
        pending = [
            pool.apply_async(publish_loop, (path, options, f"p{n}", seconds, go))
            for n in range(count)
        ]
        go.wait()
        results = [p.get(timeout=3600) for p in pending]
    sent, errors = sum(r[0] for r in results), sum(r[1] for r in results)
    commits = table.store.open().version() - before
    assert table.stats(QUEUE)["added"] == sent
    print(f"| `publish`, processes | {count} | {sent / seconds:,.0f} | {errors} | {commits} |")
    # Threads sending through one Publisher (linger 5 ms).
    path = path_of("publisher")
    table = QueueTable(path, storage_options=options)
    table.declare(QUEUE)
    before = table.store.open().version()
    counts = [0] * count
    failures = [0]
    with table.publisher(QUEUE) as publisher:
        go = threading.Barrier(count + 1)

        def sender(n: int) -> None:
            go.wait()
            stop = time.time() + seconds
            while time.time() < stop:
                try:
                    publisher.send(f"s{n}-{counts[n]}").result()
                    counts[n] += 1
                except Exception:  # counted: the goal is none
                    failures[0] += 1

        threads = [threading.Thread(target=sender, args=(n,)) for n in range(count)]
        for thread in threads:
            thread.start()
        go.wait()
        for thread in threads:
            thread.join()
    commits = table.store.open().version() - before
    sent = sum(counts)
    assert table.stats(QUEUE)["added"] == sent
    print(
        f"| `Publisher.send(...).result()`, threads | {count} | {sent / seconds:,.0f} | "
        f"{failures[0]} | {commits} |"
    )


def latency_consumer(path, options, count, ready, out):
    """Another process: a consumer on the idle queue; puts (seq, time in the handler)."""
    from spark_queue import QueueTable

    table = QueueTable(path, storage_options=options)
    received = []
    with table.consumer(QUEUE, "timer") as consumer:
        ready.set()
        for message in consumer:
            received.append((message.seq, time.time()))
            message.ack()
            if len(received) == count:
                break
    out.put(received)


def bench_latency(path_of, options, count):
    from spark_queue import QueueTable

    path = path_of("latency")
    table = QueueTable(path, storage_options=options)
    table.declare(QUEUE)
    context = multiprocessing.get_context("spawn")
    ready, out = context.Event(), context.Queue()
    process = context.Process(target=latency_consumer, args=(path, options, count, ready, out))
    process.start()
    ready.wait()
    time.sleep(2)  # idle: the consumer is long-polling
    called, returned = {}, {}
    for _ in range(count):
        start = time.time()
        (seq,) = table.publish(QUEUE, ["x"]).seqs
        called[seq], returned[seq] = start, time.time()
        time.sleep(0.2)
    received = dict(out.get(timeout=600))
    process.join()
    from_call = sorted((received[s] - called[s]) * 1000 for s in called)
    from_return = sorted((received[s] - returned[s]) * 1000 for s in returned)
    print("\n| publish -> handler, idle queue, another process | p50 ms | p90 ms |")
    print("|---|---|---|")
    rows = (("from the publish call's return", from_return), ("from the call", from_call))
    for label, ms in rows:
        print(f"| {label} | {statistics.median(ms):.0f} | {ms[int(len(ms) * 0.9)]:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["local", "s3"], default="local")
    parser.add_argument(
        "--only", nargs="+", default=["workers", "steady", "raw", "slow", "publishers", "latency"]
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 8, 32])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--steady-messages", type=int, default=400_000)
    parser.add_argument("--slow-workers", type=int, default=16)
    parser.add_argument("--handler-ms", type=int, default=50)
    parser.add_argument("--publishers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--latency-messages", type=int, default=50)
    args = parser.parse_args()
    options = None
    server = None
    if args.store == "s3":
        sys.path.insert(0, str(ROOT))
        from tests.object_store import new_bucket, server_options, start_s3_server

        server, endpoint = start_s3_server()
        options = server_options(endpoint)

        def path_of(name: str) -> str:
            return f"s3://{new_bucket(options, name)}/queues"
    else:
        base = tempfile.mkdtemp(prefix="bench-clients-")

        def path_of(name: str) -> str:
            return f"{base}/{name}"

    print(f"store: {args.store}; {os.cpu_count()} cores")
    try:
        if "workers" in args.only:
            bench_workers(path_of, options, args.workers, args.messages)
        if "steady" in args.only:
            bench_steady(path_of, options, args.workers, args.seconds, args.steady_messages)
        if "raw" in args.only:
            bench_raw(path_of, options, args.workers, args.seconds)
        if "slow" in args.only:
            bench_slow(path_of, options, args.slow_workers, args.handler_ms, args.seconds)
        if "publishers" in args.only:
            bench_publishers(path_of, options, args.publishers, args.seconds)
        if "latency" in args.only:
            bench_latency(path_of, options, args.latency_messages)
    finally:
        if server is not None:
            server.terminate()


if __name__ == "__main__":
    main()
