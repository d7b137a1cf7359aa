"""What de-duplication by message id costs (docs/BENCHMARKS.md,
"De-duplication"): a publish of 1,000,000 messages into a queue whose window already holds
10,000,000 ids, against the same publish into a queue without a window, in one table,
alternating, side by side in one run. Goal: at most 1.5x.

Each publish carries new UUID message ids (so nothing is refused and both queues store the
same rows), 16-byte bodies. The window is filled first by publishes of a million ids each.
The window's process cache is warm, as in a producer that keeps publishing; a cold start
(another process's ids read from the table) is measured once and reported apart.

    .venv/bin/python benchmarks/bench_duplicates.py [--batch 1000000] [--window-ids 10000000]
        [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid

import pyarrow as pa
from common import median, timed, write_results

from spark_queue import QueueTable
from spark_queue.storage import dedup_window


def batch_of(count: int) -> pa.Table:
    return pa.table(
        {
            "message_id": pa.array([str(uuid.uuid4()) for _ in range(count)], pa.string()),
            "body": pa.array([os.urandom(16) for _ in range(count)], pa.binary()),
        }
    )


def timed_publish(table: QueueTable, queue: str, rows: pa.Table) -> float:
    elapsed, result = timed(lambda: table.publish(queue, rows))
    assert len(result.seqs) == rows.num_rows and result.duplicates == 0, result
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1_000_000)
    parser.add_argument("--window-ids", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    folder = tempfile.mkdtemp(prefix="bench-duplicates-")
    table = QueueTable(f"{folder}/queues")
    table.declare("plain")
    table.declare("deduplicated", duplicate_window="1 hour")
    filled = 0
    while filled < args.window_ids:
        count = min(args.batch, args.window_ids - filled)
        table.publish("deduplicated", batch_of(count))
        filled += count
    table.publish("plain", batch_of(args.batch))  # warm the plain queue too

    times: dict[str, list[float]] = {"plain": [], "deduplicated": []}
    for round_ in range(args.repeats):
        order = ("plain", "deduplicated") if round_ % 2 == 0 else ("deduplicated", "plain")
        for queue in order:
            times[queue].append(timed_publish(table, queue, batch_of(args.batch)))
    dedup_window.forget()  # a process that has not read the window yet
    cold = timed_publish(table, "deduplicated", batch_of(args.batch))

    window_ids = args.window_ids + args.repeats * args.batch
    results = {
        "batch": args.batch,
        "window_ids_at_start": args.window_ids,
        "window_ids_at_end": window_ids,
        "plain_s": [round(t, 3) for t in times["plain"]],
        "deduplicated_s": [round(t, 3) for t in times["deduplicated"]],
        "ratio": median(times["deduplicated"]) / median(times["plain"]),
        "cold_window_s": round(cold, 3),
        "duplicates_counted": table.stats("deduplicated")["duplicates"],
    }
    write_results("duplicates.json", results)


if __name__ == "__main__":
    main()
