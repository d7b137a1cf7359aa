"""Chaos on one queue: producers and consumers of every kind, SIGKILLed at random.

Four processes share queue ``orders`` and are killed at random moments and started again:
a streaming producer (files -> ``ringqueue``), a ``QueueTable.publish`` service (idempotent,
resuming after its last committed sequence), a streaming consumer (``ringqueue`` ->
Delta, exactly once) and a ``QueueTable.lease``/``ack`` worker (at-least-once: it records a
lease before acking it).

The run has three phases, so that each guarantee is checked on work that happened by
construction, not by the scheduler's favour:

1. no kills, no worker: the producers start, and the streaming consumer runs until it has
   delivered something, so its exactly-once path always has work to check;
2. chaos: the worker joins, and one process at a time is killed at random moments (drawn
   from the test's seed) and started again;
3. the random kills stop, the producers finish, the streaming consumer's driver is killed
   once more, the worker drains and exits, and one more streaming run (in the test's own
   session) takes whatever is left.

Then: nothing is lost; the producers enqueued nothing twice; the streaming consumer
repeated nothing; every repeat of the worker is explained by a kill between its record and
its ack (at most one lease of ``LEASE_BATCH`` each) or by a lease that ran out before its
ack reached the table (the worker counts those); the counter identity holds. It prints one
summary line.

CI runs a short version with a fixed seed (tests/seeds.py). A long one, by hand::

    SPARK_QUEUE_CHAOS_SECONDS=600 SPARK_QUEUE_TEST_SEED=random \
        .venv/bin/python -m pytest -s tests/test_chaos.py
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from spark_queue import QueueTable
from spark_queue.rules import identity_holds
from tests.crash import CONSUMER, DRIVERS, PRODUCER, kill, make_input, restart, start

pytestmark = pytest.mark.spark
SECONDS = float(os.environ.get("SPARK_QUEUE_CHAOS_SECONDS", "25"))
FIRST_DELIVERY_TIMEOUT = 600.0  # seconds: phase 1 on a loaded machine, generously
LEASE_BATCH = 20  # the worker's max_messages: what one of its kills may repeat, at most
PRODUCERS = {"stream producer", "publisher"}


def delivered_rows(output: Path) -> int:
    """Rows the streaming consumer's Delta output holds (0 before its first commit)."""
    try:
        return DeltaTable(str(output)).to_pyarrow_dataset().count_rows()
    except TableNotFoundError:  # no log yet, or a log folder with no commit in it yet
        return 0


def test_every_kind_of_client_killed_at_random_loses_nothing(spark, tmp_path, seed):
    rng = random.Random(seed)
    queue_path, output = tmp_path / "queues", tmp_path / "out"
    files, per_file = max(6, int(SECONDS / 5)), 50
    streamed = make_input(spark, tmp_path / "in", files, per_file, prefix="stream-")
    publish_batches, publish_size = max(20, int(SECONDS * 2)), 25
    published = [
        f"svc-b{b:04d}-m{i:03d}" for b in range(publish_batches) for i in range(publish_size)
    ]
    QueueTable(str(queue_path)).declare("orders")
    record, late, stop = tmp_path / "worker.txt", tmp_path / "late.txt", tmp_path / "stop"
    roles = {
        "stream producer": (PRODUCER, (queue_path, tmp_path / "in" / "flat", tmp_path / "p")),
        "publisher": (
            DRIVERS / "publish_loop.py",
            (queue_path, "svc", publish_batches, publish_size),
        ),
        "stream consumer": (CONSUMER, (queue_path, output, tmp_path / "c", 200)),
        "worker": (DRIVERS / "lease_loop.py", (queue_path, record, late, stop)),
    }
    running: dict[str, subprocess.Popen] = {}
    finished: set[str] = set()
    kills: Counter[str] = Counter()

    def tend(kill_now: str | None = None, roles_now: tuple[str, ...] = tuple(roles)) -> None:
        """Kill ``kill_now`` if it runs; start again whatever of ``roles_now`` is not
        running, except a producer that finished (exit 0)."""
        for role in roles_now:
            script, args = roles[role]
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

    # Phase 1: no kills and no worker until the streaming consumer has delivered.
    before_worker = ("stream producer", "publisher", "stream consumer")
    give_up = time.monotonic() + FIRST_DELIVERY_TIMEOUT
    tend(roles_now=before_worker)
    while delivered_rows(output) == 0:
        assert time.monotonic() < give_up, "the streaming consumer delivered nothing"
        time.sleep(0.5)
        tend(roles_now=before_worker)
    # Phase 2: chaos.
    deadline = time.monotonic() + SECONDS
    tend()
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(2, 8))
        tend(kill_now=rng.choice([role for role in roles if role not in finished]))
    # Phase 3: the random kills stop; the producers finish, the worker drains and exits, and
    # the streaming consumer's run in this session (no JVM to start) takes whatever is left.
    # Its driver is killed rather than waited for: a run restarted by the last kill may still
    # be starting its JVM, and the exactly-once path is the same either way.
    while PRODUCERS - finished:
        time.sleep(0.5)
        tend()
    if running["stream consumer"].poll() is None:
        kill(running["stream consumer"])
        kills["stream consumer"] += 1
    stop.touch()
    assert running["worker"].wait(timeout=600) == 0
    restart(spark, CONSUMER, *roles["stream consumer"][1])

    produced = streamed + published
    rows = spark.read.format("delta").load(str(output)).collect()
    exactly_once = Counter(bytes(r.body).decode() for r in rows)
    worker = Counter(record.read_text().splitlines())
    acked_late = sum(map(int, late.read_text().split())) if late.exists() else 0
    delivered = exactly_once + worker
    lost = len(set(produced) - set(delivered))
    repeats = sum(count - 1 for count in delivered.values())
    table = QueueTable(str(queue_path))
    stats = table.stats("orders")
    assert spark.read.format("delta").load(str(queue_path)).count() > 0  # delta-spark reads it
    print(
        f"\nchaos: seed {seed}, {SECONDS:g} s, produced {len(produced)}, delivered "
        f"{sum(delivered.values())} (stream {sum(exactly_once.values())}, worker "
        f"{sum(worker.values())}), lost {lost}, duplicates {repeats}, leases run out before "
        f"their ack {acked_late}, kills "
        f"{sum(kills.values())} ({dict(kills)}), identity "
        f"{'holds' if identity_holds(stats) else 'broken'}"
    )
    assert lost == 0
    assert stats["added"] == len(produced)  # no producer enqueued anything twice
    assert sum(exactly_once.values()) > 0  # phase 1 made sure of it
    assert set(exactly_once.values()) == {1}  # the exactly-once path repeats nothing
    # The streaming consumer's leases never run out (no lease period): only the worker's
    # kills and its late acks can deliver a message twice.
    assert repeats <= kills["worker"] * LEASE_BATCH + acked_late
    assert (stats["ready"], stats["leased"]) == (0, 0)
    assert identity_holds(stats)
