"""A publishing service for the chaos test: idempotent batches, resumed after a crash.

    python tests/drivers/publish_loop.py QUEUE_PATH NAME BATCHES PER_BATCH

Publishes batch ``b`` (messages ``NAME-b<b>-m<i>``) as sequence ``b`` of producer ``NAME``
to queue ``orders``, starting after the last sequence the table has committed for it, so a
run killed at any point and started again enqueues every batch exactly once.
"""

from __future__ import annotations

import sys
import time

from spark_queue import QueueTable


def main(queue_path: str, name: str, batches: str, per_batch: str) -> None:
    table = QueueTable(queue_path)
    last = table.last_sequence(name)
    for batch in range(0 if last is None else last + 1, int(batches)):
        rows = [f"{name}-b{batch:04d}-m{i:03d}" for i in range(int(per_batch))]
        table.publish("orders", rows, producer=name, sequence=batch)
        time.sleep(0.25)


if __name__ == "__main__":
    main(*sys.argv[1:5])
