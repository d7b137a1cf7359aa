"""The broker's SQS API against its Flight protocol, on one broker and one table, in one run
(docs/SQS.md "Performance"):

- send: W processes loop boto3 ``SendMessageBatch`` of 10 messages, against W processes
  looping ``QueueTable.publish`` of 10 through the broker (Flight), for ``--seconds`` each;
- receive: W processes loop ``ReceiveMessage(MaxNumberOfMessages=10)`` +
  ``DeleteMessageBatch``, against W processes looping ``QueueTable.lease(max_messages=10)``
  + ``ack`` through the broker, on queues filled beforehand;
- long poll: a ``ReceiveMessage(WaitTimeSeconds=20)`` on an empty queue, idle for
  ``--idle`` seconds (the table's version is read before and after: no commits), then a
  ``SendMessage``; the time from the send's answer to the receive's, ``--polls`` times.

Reports messages a second of each shape, the SQS/Flight ratio, and the long poll's wake
latencies (p50, p90) and the commits made while it waited.

    .venv/bin/python benchmarks/bench_sqs.py [--workers 8] [--seconds 10] [--polls 20]
        [--idle 1] [--messages 60000] [--path DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import ROOT, median, percentile  # puts this checkout first on sys.path

OUT = ROOT / "benchmarks" / "out"
BODY = 100  # bytes of each message body


def sqs_client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=Config(retries={"max_attempts": 1}, max_pool_connections=4),
    )


def body() -> str:
    return os.urandom(BODY // 2).hex()


def work(shape: str, path: str, address: str, endpoint: str, worker: int, seconds: float, go):
    """One worker process: its shape's loop for ``seconds`` after the start signal."""
    from spark_queue import QueueTable

    queue = shape
    table = QueueTable(path, broker=address)
    client = sqs_client(endpoint)
    url = f"{endpoint}/000000000000/{queue}"
    go.wait()
    deadline = time.monotonic() + seconds
    done = 0
    while time.monotonic() < deadline:
        if shape == "sqs-send":
            entries = [{"Id": str(i), "MessageBody": body()} for i in range(10)]
            done += len(client.send_message_batch(QueueUrl=url, Entries=entries)["Successful"])
        elif shape == "flight-send":
            done += len(table.publish(queue, [body().encode() for _ in range(10)]).seqs)
        elif shape == "sqs-receive":
            got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages")
            if got:
                entries = [
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
                ]
                client.delete_message_batch(QueueUrl=url, Entries=entries)
                done += len(got)
        else:
            consumer = f"w{worker}"
            rows = table.lease(queue, consumer, max_messages=10, lease_period="60s")
            if rows.num_rows:
                done += table.ack(queue, rows["seq"].to_pylist(), consumer)
    return done


def timed(shape: str, args: argparse.Namespace, path: str, address: str, endpoint: str) -> dict:
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(args.workers) as pool:
        go = manager.Barrier(args.workers + 1)
        pending = [
            pool.apply_async(work, (shape, path, address, endpoint, i, args.seconds, go))
            for i in range(args.workers)
        ]
        go.wait()
        started = time.perf_counter()
        counts = [p.get() for p in pending]
        elapsed = time.perf_counter() - started
    return {"shape": shape, "messages": sum(counts), "msg_per_s": round(sum(counts) / elapsed)}


def long_poll(args: argparse.Namespace, path: str, endpoint: str) -> dict:
    from spark_queue import QueueTable

    client, sender = sqs_client(endpoint), sqs_client(endpoint)
    url = client.create_queue(QueueName="idle")["QueueUrl"]
    log = QueueTable(path, broker="off").store.location

    def version() -> int:
        return log.delta_table().version()

    wakes, commits = [], 0
    for _ in range(args.polls):
        answered: list[float] = []

        def poll(into: list[float] = answered) -> None:
            client.receive_message(QueueUrl=url, WaitTimeSeconds=20)
            into.append(time.perf_counter())

        waiter = threading.Thread(target=poll)
        before = version()
        waiter.start()
        time.sleep(args.idle)  # the poll waits on an empty queue meanwhile
        commits += version() - before
        sender.send_message(QueueUrl=url, MessageBody="wake")
        sent = time.perf_counter()
        waiter.join(30)
        wakes.append(max(0.0, answered[0] - sent) * 1000)
        for message in client.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get(
            "Messages", []
        ):  # a poll that ran out before the send: leave the queue empty for the next
            client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    wakes.sort()
    return {
        "polls": args.polls,
        "wake_ms_p50": round(median(wakes), 1),
        "wake_ms_p90": round(percentile(wakes, 0.9), 1),
        "commits_while_waiting": commits,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--messages", type=int, default=60_000, help="per receive queue")
    parser.add_argument("--polls", type=int, default=20)
    parser.add_argument("--idle", type=float, default=1.0)
    parser.add_argument("--path", help="where the table goes (default: a temporary folder)")
    args = parser.parse_args()
    from spark_queue import QueueTable

    with tempfile.TemporaryDirectory(dir=args.path) as folder:
        path = str(Path(folder) / "queues")
        table = QueueTable(path, broker="off")
        for queue in ("sqs-send", "flight-send", "sqs-receive", "flight-receive"):
            table.declare(queue)
        for queue in ("sqs-receive", "flight-receive"):
            for start in range(0, args.messages, 20_000):
                count = min(20_000, args.messages - start)
                table.publish(queue, [body().encode() for _ in range(count)])
        broker = subprocess.Popen(
            [sys.executable, "-m", "spark_queue.cli", "broker", path, "--sqs", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert broker.stdout is not None
        line = broker.stdout.readline()
        address = line.split(" at ", 1)[1].split()[0]
        endpoint = line.split("SQS API at ", 1)[1].split()[0]
        try:
            rows = [
                timed(shape, args, path, address, endpoint)
                for shape in ("flight-send", "sqs-send", "flight-receive", "sqs-receive")
            ]
            poll = long_poll(args, path, endpoint)
        finally:
            broker.terminate()
            broker.wait(timeout=60)
    rates = {row["shape"]: row["msg_per_s"] for row in rows}
    print(f"| shape | W | Flight msg/s | SQS msg/s | SQS / Flight |  ({args.seconds:g} s each)")
    print("|---|---|---|---|---|")
    for shape in ("send", "receive"):
        flight, sqs = rates[f"flight-{shape}"], rates[f"sqs-{shape}"]
        print(f"| {shape} | {args.workers} | {flight} | {sqs} | {sqs / flight:.2f} |")
    print(
        f"long poll: wake p50 {poll['wake_ms_p50']} ms, p90 {poll['wake_ms_p90']} ms over "
        f"{poll['polls']} polls; commits while waiting: {poll['commits_while_waiting']}"
    )
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_sqs.json").write_text(json.dumps({"rates": rows, "long_poll": poll}, indent=2))


if __name__ == "__main__":
    main()
