"""Chaos on one queue: producers and consumers of every kind, SIGKILLed at random.

Four processes share queue ``orders`` and are killed at random moments and started again:
a streaming producer (files -> ``ringqueue``), a ``QueueTable.publish`` service (idempotent,
resuming after its last committed sequence), a streaming consumer (``ringqueue`` ->
Delta, exactly once) and a ``QueueTable.lease``/``ack`` worker (at-least-once: it records a
lease before acking it). Then the kills stop, the producers finish, and both consumers drain
the queue. Nothing may be lost; the producers and the streaming consumer may repeat nothing;
the worker's repeats are bounded by its kills (a lease it recorded but never acked comes
back after its 3 s period). It prints one summary line.

CI runs a short version. A long one, by hand::

    SPARK_QUEUE_CHAOS_SECONDS=600 .venv/bin/python -m pytest -s tests/test_chaos.py
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from spark_queue import QueueTable
from spark_queue.core import identity_holds
from tests.crash import CONSUMER, DRIVERS, PRODUCER, kill, make_input, start

pytestmark = pytest.mark.spark
SECONDS = float(os.environ.get("SPARK_QUEUE_CHAOS_SECONDS", "40"))
SEED = int(os.environ.get("SPARK_QUEUE_CHAOS_SEED", str(time.time_ns() % 1_000_000)))
LEASE_BATCH = 20  # the worker's max_messages: what one of its kills may repeat, at most
PRODUCERS = {"stream producer", "publisher"}


def test_every_kind_of_client_killed_at_random_loses_nothing(spark, tmp_path):
    rng = random.Random(SEED)
    queue_path, output = tmp_path / "queues", tmp_path / "out"
    files, per_file = max(6, int(SECONDS / 5)), 50
    streamed = make_input(spark, tmp_path / "in", files, per_file, prefix="stream-")
    publish_batches, publish_size = max(20, int(SECONDS * 2)), 25
    published = [
        f"svc-b{b:04d}-m{i:03d}" for b in range(publish_batches) for i in range(publish_size)
    ]
    QueueTable(str(queue_path)).declare("orders")
    record, stop = tmp_path / "worker.txt", tmp_path / "stop"
    roles = {
        "stream producer": (PRODUCER, (queue_path, tmp_path / "in" / "flat", tmp_path / "p")),
        "publisher": (
            DRIVERS / "publish_loop.py",
            (queue_path, "svc", publish_batches, publish_size),
        ),
        "stream consumer": (CONSUMER, (queue_path, output, tmp_path / "c", 200)),
        "worker": (DRIVERS / "lease_loop.py", (queue_path, record, stop)),
    }
    running: dict[str, subprocess.Popen] = {}
    finished: set[str] = set()
    kills: Counter[str] = Counter()

    def tend(kill_now: str | None = None) -> None:
        """Kill ``kill_now`` if it runs; start again whatever is not running, except a
        producer that finished (exit 0)."""
        for role, (script, args) in roles.items():
            process = running.get(role)
            if process is not None and process.poll() is None:
                if role != kill_now:
                    continue
                kill(process)
                kills[role] += 1
            elif process is not None and process.returncode == 0 and role in PRODUCERS:
                finished.add(role)
            if role not in finished:
                running[role] = start(script, *args)

    deadline = time.monotonic() + SECONDS
    tend()
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(2, 8))
        tend(kill_now=rng.choice(list(roles)))
    # The kills stop: the producers finish, the worker drains and exits, then one more
    # streaming run takes whatever is left.
    while PRODUCERS - finished:
        time.sleep(0.5)
        tend()
    stop.touch()
    assert running["worker"].wait(timeout=600) == 0
    assert running["stream consumer"].wait(timeout=600) in (0, -signal.SIGKILL)
    assert start(CONSUMER, *roles["stream consumer"][1]).wait(timeout=600) == 0

    produced = streamed + published
    rows = spark.read.format("delta").load(str(output)).collect()
    exactly_once = Counter(bytes(r.body).decode() for r in rows)
    worker = Counter(Path(record).read_text().splitlines())
    delivered = exactly_once + worker
    lost = len(set(produced) - set(delivered))
    repeats = sum(count - 1 for count in delivered.values())
    table = QueueTable(str(queue_path))
    stats = table.stats("orders")
    assert spark.read.format("delta").load(str(queue_path)).count() > 0  # delta-spark reads it
    print(
        f"\nchaos: seed {SEED}, {SECONDS:g} s, produced {len(produced)}, delivered "
        f"{sum(delivered.values())} (stream {sum(exactly_once.values())}, worker "
        f"{sum(worker.values())}), lost {lost}, duplicates {repeats}, kills "
        f"{sum(kills.values())} ({dict(kills)}), identity "
        f"{'holds' if identity_holds(stats) else 'broken'}"
    )
    assert lost == 0, f"seed {SEED}"
    assert stats["added"] == len(produced)  # no producer enqueued anything twice
    assert sum(exactly_once.values()) > 0  # the streaming consumer had its share
    assert set(exactly_once.values()) == {1}  # and the exactly-once path repeats nothing
    assert repeats <= (kills["worker"] + 1) * LEASE_BATCH, f"seed {SEED}"
    assert (stats["ready"], stats["leased"]) == (0, 0)
    assert identity_holds(stats)
