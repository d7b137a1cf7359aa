"""A service client for the service chaos test: a ``Publisher`` or a ``Consumer`` of queue
``jobs``, through whatever broker the table records (or directly, where none is live).

    python tests/drivers/service_client.py publish QUEUE_PATH OUT NAME COUNT
    python tests/drivers/service_client.py consume QUEUE_PATH OUT NAME STOP_FILE

Each appends one line per event to ``OUT``, flushed to disk, so that what it was told
survives its own SIGKILL:

- the publisher sends ``NAME-00000`` ... in windows of ``WINDOW`` messages, ``PAUSE``
  seconds apart (a service's trickle, spread over the chaos), and writes ``P <body>`` once
  a message's future says it landed. Started again, it sends what its file does not hold
  yet, so a kill repeats at most one window (sent, not yet answered);
- the consumer writes ``D <body> <seq> <delivery count>`` for each message received, then
  acknowledges it (batched by the client). It exits once ``STOP_FILE`` exists and the queue
  holds nothing ready, leased or scheduled.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TextIO

from spark_queue import QueueTable

QUEUE = "jobs"
WINDOW = 20  # the publisher's messages in flight at most
PAUSE = 0.5  # seconds between two of its windows
MAX_PREFETCH = 20  # the consumer's messages held at most
ACK_BATCH = 20
# Far above a loaded machine's pauses: a live consumer extends its leases long before they
# run out, so only a kill makes a message come back.
LEASE_PERIOD = "20 seconds"


def append(out: TextIO, lines: list[str]) -> None:
    """Append ``lines`` durably: a SIGKILL right after must not lose them."""
    out.writelines(line + "\n" for line in lines)
    out.flush()
    os.fsync(out.fileno())


def publish(table: QueueTable, out_path: str, name: str, count: int) -> None:
    done = set()
    if os.path.exists(out_path):
        done = {line.split()[1] for line in Path(out_path).read_text().splitlines() if line}
    bodies = [f"{name}-{i:05d}" for i in range(count) if f"{name}-{i:05d}" not in done]
    with (
        open(out_path, "a", encoding="utf-8") as out,
        table.publisher(QUEUE, linger=5, max_batch=WINDOW) as publisher,
    ):
        for start in range(0, len(bodies), WINDOW):
            window = bodies[start : start + WINDOW]
            futures = [publisher.send(body) for body in window]
            for future in futures:
                assert future.result(timeout=600) is not None  # stored: no limits here
            append(out, [f"P {body}" for body in window])
            time.sleep(PAUSE)


def consume(table: QueueTable, out_path: str, name: str, stop_file: str) -> None:
    with (
        open(out_path, "a", encoding="utf-8") as out,
        table.consumer(
            QUEUE,
            name,
            max_prefetch=MAX_PREFETCH,
            ack_batch=ACK_BATCH,
            lease_period=LEASE_PERIOD,
        ) as consumer,
    ):
        while True:
            messages = consumer.receive(max_messages=10, wait_time="500ms")
            if messages:
                append(
                    out,
                    [f"D {bytes(m.body).decode()} {m.seq} {m.delivery_count}" for m in messages],
                )
                for message in messages:
                    consumer.ack(message)
            elif os.path.exists(stop_file):
                stats = table.stats(QUEUE)
                if stats["ready"] + stats["leased"] + stats["scheduled"] == 0:
                    return


if __name__ == "__main__":
    role, path, output, client = sys.argv[1:5]
    queue_table = QueueTable(path)
    if role == "publish":
        publish(queue_table, output, client, int(sys.argv[5]))
    else:
        consume(queue_table, output, client, sys.argv[5])
