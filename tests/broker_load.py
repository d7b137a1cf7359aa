"""A publisher or a consumer of the queue ``jobs``, as a process of its own, for the broker
fault tests: ``python -m tests.broker_load publish|consume ...``.

Each writes one line per event to its output file, flushed at once, so that what it was
told survives its own death: ``P <body>`` once a publish returned, ``D <body> <count>`` for
each message a lease returned (with its delivery count), ``A <n>`` once an ack of n messages
returned, ``done`` at the end. Both go through whatever broker their ``QueueTable`` finds
(``--broker``: a given one).
"""

from __future__ import annotations

import argparse
import os
import time

from spark_queue import CommitConflictError, QueueTable

QUEUE = "jobs"
LEASE_PERIOD = "3 seconds"  # a lease lost with a killed broker comes back after this
IDLE_SECONDS = 0.05  # an idle consumer polls this often


def publish(table: QueueTable, out, producer: str, count: int) -> None:
    """One message per publish, idempotent (producer, sequence): a publish retried after its
    broker died, or after it lost every commit race, enqueues once."""
    for sequence in range(1, count + 1):
        body = f"{producer}-{sequence}"
        while True:
            try:
                table.publish(QUEUE, [body], producer=producer, sequence=sequence)
                break
            except CommitConflictError:
                continue
        out.write(f"P {body}\n")


def consume(table: QueueTable, out, name: str, stop_file: str) -> None:
    """Lease, ack, until the stop file exists and the queue holds nothing at all."""
    while True:
        leased = table.lease(QUEUE, name, max_messages=5, lease_period=LEASE_PERIOD)
        if not leased.num_rows:
            if os.path.exists(stop_file):
                stats = table.stats(QUEUE)
                if stats["ready"] + stats["leased"] + stats["scheduled"] == 0:
                    return
            time.sleep(IDLE_SECONDS)
            continue
        for body, count in zip(
            leased["body"].to_pylist(), leased["delivery_count"].to_pylist(), strict=True
        ):
            out.write(f"D {bytes(body).decode()} {count}\n")
        while True:
            try:
                table.ack(QUEUE, leased["seq"].to_pylist(), name)
                break
            except CommitConflictError:
                continue
        out.write(f"A {leased.num_rows}\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["publish", "consume"])
    parser.add_argument("path")
    parser.add_argument("out")
    parser.add_argument("name")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--stop-file")
    parser.add_argument("--broker")
    args = parser.parse_args()
    table = QueueTable(args.path, broker=args.broker)
    with open(args.out, "w", buffering=1) as out:
        if args.role == "publish":
            publish(table, out, args.name, args.count)
        else:
            consume(table, out, args.name, args.stop_file)
        out.write("done\n")


if __name__ == "__main__":
    main()
