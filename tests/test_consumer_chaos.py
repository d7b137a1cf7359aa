"""Chaos: a streaming consumer SIGKILLed again and again while a producer writes.

The consumer is a real driver process (``ringqueue`` -> ``format("delta")``, availableNow,
one checkpoint throughout); each run is killed either at a failpoint drawn at random (a
window of the protocol, ``spark_queue.commit.failpoints``) or at a random moment of its work on the
queue (0-3 s after it logged its first new offset: a kill while its JVM still starts would
test nothing of the queue). Each run's driver starts while the run before it works, and its
query waits for its turn: one run at a time uses the checkpoint. Meanwhile the test's own
session enqueues batches. At the end one clean run, in the test's own session and with
larger batches, drains the queue, and the Delta output must hold every produced message
exactly once.

CI runs a short version with a fixed seed (tests/seeds.py). A long one, by hand::

    SPARK_QUEUE_CHAOS_KILLS=40 SPARK_QUEUE_TEST_SEED=random \
        .venv/bin/python -m pytest -s tests/test_consumer_chaos.py

It prints its seed and one summary line.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from spark_queue import QueueTable
from spark_queue.rules import identity_holds
from tests.crash import CONSUMER, crashed, kill, logged, restart, start
from tests.helpers import assert_identity, messages, write_batch

pytestmark = pytest.mark.spark
KILLS = int(os.environ.get("SPARK_QUEUE_CHAOS_KILLS", "3"))
PER_PRODUCED_BATCH, PER_CONSUMED_BATCH = 50, 200
DRAIN_BATCH = 2_000  # the last run's: one batch of 200 takes seconds on two cores
WORK_TIMEOUT = 300.0  # seconds for a run to log its first offset, on a loaded machine
WINDOWS = [
    "source.latest-offset",
    "source.lease-planned",
    "source.lease-committed",
    "source.partitions",
]


def wait_for_work(driver: subprocess.Popen, checkpoint: Path, before: int | None) -> None:
    """Return once ``driver`` has logged an offset past ``before`` (it works on the queue),
    or has exited."""
    deadline = time.monotonic() + WORK_TIMEOUT
    while driver.poll() is None and logged(checkpoint)[0] == before:
        assert time.monotonic() < deadline, "a consumer run logged no offset"
        time.sleep(0.05)


@dataclass
class Run:
    """A consumer run started ahead: its JVM starts while the run before it works, and its
    query waits for ``go``. ``window``: the failpoint window it dies in, or None for a kill
    at a random moment."""

    driver: subprocess.Popen
    go: Path
    window: str | None


def test_a_consumer_killed_at_random_and_in_windows_loses_and_repeats_nothing(
    spark, tmp_path, seed
):
    rng = random.Random(seed)
    producer_rng = random.Random(seed + 1)  # its own: the two threads' draws stay apart
    queue_path, output, checkpoint = tmp_path / "queues", tmp_path / "out", tmp_path / "chk"
    produced: list[str] = []
    done = threading.Event()
    failures: list[BaseException] = []

    def produce() -> None:
        batch = 0
        try:
            while batch < 2 or not done.is_set():
                rows = [f"b{batch:04d}-m{i:03d}" for i in range(PER_PRODUCED_BATCH)]
                write_batch(messages(spark, rows), str(queue_path), queue="orders")
                produced.extend(rows)
                batch += 1
                time.sleep(producer_rng.uniform(0.2, 1.5))
        except BaseException as error:  # reported by the test thread
            failures.append(error)

    write_batch(messages(spark, ["first"]), str(queue_path), queue="orders")
    produced.append("first")
    producer = threading.Thread(target=produce)
    producer.start()
    args = (queue_path, output, checkpoint, PER_CONSUMED_BATCH)
    kills: Counter[str] = Counter()
    runs: list[Run] = []

    def start_ahead() -> Run:
        window = rng.choice(WINDOWS) if rng.random() < 0.6 else None
        crash_at = f"{window}:{rng.randint(1, 5)}" if window is not None else None
        go = tmp_path / f"go-{time.monotonic_ns()}"
        runs.append(Run(start(CONSUMER, *args, crash_at=crash_at, go=go), go, window))
        return runs[-1]

    upcoming = start_ahead()
    try:
        while sum(kills.values()) < KILLS:
            run, before = upcoming, logged(checkpoint)[0]
            run.go.touch()
            upcoming = start_ahead()  # one run at a time on the checkpoint: it waits for its go
            if run.window is not None:
                if crashed(run.driver):
                    kills[run.window] += 1
                else:
                    assert run.driver.returncode == 0, "a consumer run failed"
            else:
                wait_for_work(run.driver, checkpoint, before)
                time.sleep(rng.uniform(0, 3))
                if run.driver.poll() is None:
                    kill(run.driver)
                    kills["random moment"] += 1
                else:
                    assert run.driver.returncode == 0, "a consumer run failed"
    finally:  # the run started ahead of the last is never let go; a failure leaves its run
        for started in runs:
            if started.driver.poll() is None:
                kill(started.driver)
        done.set()
        producer.join()
    assert not failures, failures
    restart(spark, CONSUMER, queue_path, output, checkpoint, DRAIN_BATCH)  # drains the rest

    rows = spark.read.format("delta").load(str(output)).collect()
    delivered = Counter(bytes(r.body).decode() for r in rows)
    lost = len(set(produced) - set(delivered))
    duplicates = sum(count - 1 for count in delivered.values())
    stats = QueueTable(str(queue_path)).stats("orders")
    print(
        f"\nchaos: seed {seed}, produced {len(produced)}, delivered {sum(delivered.values())}, "
        f"lost {lost}, duplicates {duplicates}, kills {sum(kills.values())} ({dict(kills)}), "
        f"acked {stats['acked']}, identity {'holds' if identity_holds(stats) else 'broken'}"
    )
    assert (lost, duplicates) == (0, 0)
    assert set(delivered) == set(produced)
    assert (stats["acked"], stats["leased"], stats["ready"]) == (len(produced), 0, 0)
    assert_identity(str(queue_path))
