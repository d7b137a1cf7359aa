"""Chaos: a streaming consumer SIGKILLed again and again while a producer writes.

The consumer is a real driver process (``ringqueue`` -> ``format("delta")``, availableNow,
one checkpoint throughout); each run is killed either at a failpoint drawn at random (a
window of the protocol, ``spark_queue.failpoints``) or at a random moment of its work on the
queue (0-3 s after it logged its first new offset: a kill while its JVM still starts would
test nothing of the queue). Meanwhile the test's own session enqueues batches. At the end
one clean run, in the test's own session and with larger batches, drains the queue, and the
Delta output must hold every produced message exactly once.

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
from pathlib import Path

import pytest

from spark_queue import QueueTable
from spark_queue.core import identity_holds
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


def wait_for_work(driver: subprocess.Popen, checkpoint: Path) -> None:
    """Return once ``driver`` has logged an offset past the checkpoint's last (it works on
    the queue), or has exited."""
    before, _ = logged(checkpoint)
    deadline = time.monotonic() + WORK_TIMEOUT
    while driver.poll() is None and logged(checkpoint)[0] == before:
        assert time.monotonic() < deadline, "a consumer run logged no offset"
        time.sleep(0.05)


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
    try:
        while sum(kills.values()) < KILLS:
            if rng.random() < 0.6:
                window = rng.choice(WINDOWS)
                driver = start(CONSUMER, *args, crash_at=f"{window}:{rng.randint(1, 5)}")
                if crashed(driver):
                    kills[window] += 1
                else:
                    assert driver.returncode == 0, "a consumer run failed"
            else:
                driver = start(CONSUMER, *args)
                wait_for_work(driver, checkpoint)
                time.sleep(rng.uniform(0, 3))
                if driver.poll() is None:
                    kill(driver)
                    kills["random moment"] += 1
                else:
                    assert driver.returncode == 0, "a consumer run failed"
    finally:
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
