"""A worker for the chaos test: ``QueueTable.lease``, record, ``ack``, until told to stop.

    python tests/drivers/lease_loop.py QUEUE_PATH RECORD_FILE STOP_FILE

Each lease of up to 20 messages (lease period 3 s; one lease every 0.3 s) is appended to
``RECORD_FILE`` (one body per line, flushed to disk) before it is acknowledged: a kill
between the two delivers those messages again, at-least-once. It exits once ``STOP_FILE``
exists, a lease finds nothing and no lease of a killed run is still out.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from spark_queue import QueueTable


def main(queue_path: str, record: str, stop: str) -> None:
    table = QueueTable(queue_path)
    with open(record, "a", encoding="utf-8") as out:
        while True:
            leased = table.lease("orders", "worker", max_messages=20, lease_period="3 seconds")
            if not leased.num_rows:
                held = table.stats("orders")["leased_by_consumer"].get("worker", 0)
                if Path(stop).exists() and not held:  # a killed run's leases came back
                    return
                time.sleep(0.1)
                continue
            out.writelines(bytes(b).decode() + "\n" for b in leased["body"].to_pylist())
            out.flush()
            os.fsync(out.fileno())
            table.ack("orders", leased["seq"].to_pylist(), "worker")
            time.sleep(0.3)  # a slow worker: the streaming consumer gets its share


if __name__ == "__main__":
    main(*sys.argv[1:4])
