"""Many small clients through a queue broker: W worker processes loop
``QueueTable.lease(max_messages=10)`` then ``ack`` on one queue, each under its own consumer
name, for ``--seconds``; once committing directly (``broker="off"``) and once through one
``spark-queue broker`` process (``broker=host:port``), side by side.

Reports acknowledged messages a second over the timed window, the ``CommitConflictError``s
that reached callers (a worker counts one and goes on), and checks after each run that the
counters still hold (``added = acked + ready + leased ...``) and that no message was
acknowledged twice.

    .venv/bin/python benchmarks/bench_broker.py [--workers 8] [--seconds 20] [--batch 10]
        [--modes direct broker] [--path DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import fill, write_results

QUEUE = "q"


def work(path: str, broker: str, consumer: str, batch: int, seconds: float, go) -> dict:
    """One worker process: lease and ack for ``seconds`` after the start signal."""
    from spark_queue import CommitConflictError, QueueTable

    table = QueueTable(path, broker=broker)
    go.wait()
    deadline = time.monotonic() + seconds
    acked, errors, seqs = 0, 0, []
    while time.monotonic() < deadline:
        try:
            rows = table.lease(QUEUE, consumer, max_messages=batch, lease_period="10 minutes")
            if not rows.num_rows:
                continue
            leased = rows["seq"].to_pylist()
            acked += table.ack(QUEUE, leased, consumer)
            seqs += leased
        except CommitConflictError:
            errors += 1
    return {"acked": acked, "errors": errors, "seqs": seqs}


def run(mode: str, args: argparse.Namespace, root: Path) -> dict:
    from spark_queue import QueueTable
    from spark_queue.rules import identity_holds

    path = str(root / f"{mode}-queues")
    fill(path, args.messages, queue=QUEUE, body_bytes=100, batch=20_000)
    broker = None
    address = "off"
    if mode == "broker":
        broker = subprocess.Popen(
            [sys.executable, "-m", "spark_queue.cli", "broker", path],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert broker.stdout is not None
        address = broker.stdout.readline().split(" at ", 1)[1].split()[0]
    try:
        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager, context.Pool(args.workers) as pool:
            go = manager.Barrier(args.workers + 1)
            pending = [
                pool.apply_async(work, (path, address, f"w{i}", args.batch, args.seconds, go))
                for i in range(args.workers)
            ]
            go.wait()
            started = time.perf_counter()
            results = [p.get() for p in pending]
            elapsed = time.perf_counter() - started
    finally:
        if broker is not None:
            broker.terminate()
            broker.wait(timeout=60)
    seqs = [s for r in results for s in r["seqs"]]
    assert len(seqs) == len(set(seqs)), "a message was acknowledged twice"
    stats = QueueTable(path, broker="off").stats(QUEUE)
    assert identity_holds(stats) and stats["acked"] == sum(r["acked"] for r in results)
    acked = sum(r["acked"] for r in results)
    return {
        "mode": mode,
        "workers": args.workers,
        "batch": args.batch,
        "seconds": round(elapsed, 1),
        "acked": acked,
        "msg_per_s": round(acked / elapsed),
        "errors": sum(r["errors"] for r in results),
        "per_worker": [r["acked"] for r in results],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--modes", nargs="+", default=["direct", "broker"])
    parser.add_argument("--path", help="where the tables go (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.path) as folder:
        rows = [run(mode, args, Path(folder)) for mode in args.modes]
    print("| mode | W | batch | msg/s | errors reaching callers | per worker |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['mode']} | {row['workers']} | {row['batch']} | {row['msg_per_s']} | "
            f"{row['errors']} | {row['per_worker']} |"
        )
    write_results("bench_broker.json", rows, show=False)


if __name__ == "__main__":
    main()
