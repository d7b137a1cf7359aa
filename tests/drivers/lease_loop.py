"""A worker for the chaos test: ``QueueTable.lease``, record, ``ack``, until told to stop.

    python tests/drivers/lease_loop.py QUEUE_PATH RECORD_FILE LATE_FILE STOP_FILE

Each lease of up to 20 messages (lease period 3 s) is appended to ``RECORD_FILE`` (one body
per line, flushed to disk) before it is acknowledged: a kill between the two delivers those
messages again, at-least-once. Where the ack ends fewer leases than were taken (they ran out
before it reached the table, and may have gone to another consumer), it appends how many to
``LATE_FILE``: those repeats are the lease period's, not a loss of exactly-once. It exits
once ``STOP_FILE`` exists, a lease finds nothing and no lease of a killed run is still out.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TextIO

from spark_queue import QueueTable


def append(out: TextIO, lines: list[str]) -> None:
    """Append ``lines`` durably: a SIGKILL right after must not lose them."""
    out.writelines(line + "\n" for line in lines)
    out.flush()
    os.fsync(out.fileno())


def main(queue_path: str, record: str, late: str, stop: str) -> None:
    table = QueueTable(queue_path)
    with open(record, "a", encoding="utf-8") as out, open(late, "a", encoding="utf-8") as lates:
        while True:
            leased = table.lease("orders", "worker", max_messages=20, lease_period="3 seconds")
            if not leased.num_rows:
                held = table.stats("orders")["leased_by_consumer"].get("worker", 0)
                if Path(stop).exists() and not held:  # a killed run's leases came back
                    return
                time.sleep(0.1)
                continue
            append(out, [bytes(b).decode() for b in leased["body"].to_pylist()])
            acked = table.ack("orders", leased["seq"].to_pylist(), "worker")
            if acked < leased.num_rows:
                append(lates, [str(leased.num_rows - acked)])
            time.sleep(0.3)  # a handler's work between leases


if __name__ == "__main__":
    main(*sys.argv[1:5])
