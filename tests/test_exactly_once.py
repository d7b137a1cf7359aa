"""Exactly-once enqueue: a replayed micro-batch commits nothing twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_queue import QueueTable
from tests.helpers import assert_identity, bodies

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "drivers" / "produce_stream.py"
FILES, PER_FILE = 6, 50


def make_input(spark, folder: Path) -> list[str]:
    everything = []
    for f in range(FILES):
        rows = [f"file{f}-msg{i}" for i in range(PER_FILE)]
        everything += rows
        spark.createDataFrame([(r,) for r in rows], "body string").coalesce(1).write.parquet(
            str(folder / f"part{f}")
        )
    # One flat folder of files, in name order, for the file source.
    flat = folder / "flat"
    flat.mkdir()
    for f in range(FILES):
        (produced,) = list((folder / f"part{f}").glob("*.parquet"))
        produced.rename(flat / f"{f:03d}.parquet")
    return everything


def committed_paths(queue_path: Path) -> set[str]:
    found = set()
    for log in (queue_path / "_delta_log").glob("*.json"):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                found.add(action["add"]["path"])
    return found


def staged_only(queue_path: Path) -> set[str]:
    """Message files on disk that no commit references yet."""
    on_disk = {
        f"record=message/{p.name}" for p in (queue_path / "record=message").glob("*.parquet")
    }
    return on_disk - committed_paths(queue_path)


def start(script: Path, *args: Path) -> subprocess.Popen:
    """Run a driver script as its own process group (so a SIGKILL takes the JVM and workers
    with it), logging beside its first argument."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    log = open(args[0].parent / f"{script.stem}-{time.monotonic_ns()}.log", "w")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, str(script), *map(str, args)],
        env=env,
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def run_driver(queue_path: Path, source: Path, checkpoint: Path) -> subprocess.Popen:
    return start(DRIVER, queue_path, source, checkpoint)


def kill_between_write_and_commit(queue_path: Path, driver: subprocess.Popen) -> bool:
    """SIGKILL the driver once a batch's files are staged but not committed."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None:
        log = queue_path / "_delta_log"
        if (
            log.exists()
            and len(list(log.glob("*.json"))) >= 3
            and (queue_path / "record=message").exists()
            and staged_only(queue_path)
        ):
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
            return True
        time.sleep(0.005)
    driver.wait()
    return False


def test_sigkill_between_data_write_and_commit_then_restart(spark, tmp_path):
    for attempt in range(3):
        base = tmp_path / f"attempt{attempt}"
        base.mkdir()
        expected = make_input(spark, base)
        queue_path, checkpoint = base / "queues", base / "checkpoint"
        driver = run_driver(queue_path, base / "flat", checkpoint)
        killed = kill_between_write_and_commit(queue_path, driver)
        # The kill landed in the window if staged files were left behind uncommitted.
        if killed and staged_only(queue_path):
            break
    else:
        pytest.fail("could not kill the driver between a data write and its commit")
    before = sorted(bodies(spark, str(queue_path), "orders"))
    assert len(before) < len(expected)  # the run was cut short
    restarted = run_driver(queue_path, base / "flat", checkpoint)
    assert restarted.wait(timeout=300) == 0
    after = bodies(spark, str(queue_path), "orders")
    assert sorted(after) == sorted(expected)  # each message exactly once
    assert QueueTable(str(queue_path)).stats("orders")["added"] == len(expected)
    assert_identity(str(queue_path))


def test_replayed_batch_after_its_commit_is_a_no_op(spark, tmp_path):
    expected = make_input(spark, tmp_path)
    queue_path, checkpoint = tmp_path / "queues", tmp_path / "checkpoint"
    driver = run_driver(queue_path, tmp_path / "flat", checkpoint)
    assert driver.wait(timeout=300) == 0
    table = QueueTable(str(queue_path))
    version = table.store.open().version()
    # As if the driver died after the Delta commit but before Spark's commit log entry.
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)  # Hadoop's checksum
    replay = run_driver(queue_path, tmp_path / "flat", checkpoint)
    assert replay.wait(timeout=300) == 0
    assert (checkpoint / "commits" / str(last)).exists()  # Spark did replay the batch
    assert table.store.open().version() == version  # and the replay committed nothing
    assert sorted(bodies(spark, str(queue_path), "orders")) == sorted(expected)
    assert staged_only(queue_path) == set()  # the replay's own files were removed


CONSUMER = ROOT / "tests" / "drivers" / "consume_stream.py"


def run_consumer(queue_path: Path, output: Path, checkpoint: Path) -> subprocess.Popen:
    return start(CONSUMER, queue_path, output, checkpoint)


def test_consumer_killed_mid_stream_then_restarted_delivers_each_once(spark, tmp_path):
    expected = [f"msg-{i}" for i in range(200)]
    queue_path, output, checkpoint = tmp_path / "queues", tmp_path / "out", tmp_path / "chk"
    spark.createDataFrame([(b,) for b in expected], "body string").coalesce(1).write.format(
        "ringqueue"
    ).option("queue", "orders").mode("append").save(str(queue_path))
    table = QueueTable(str(queue_path))
    consumer = run_consumer(queue_path, output, checkpoint)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and consumer.poll() is None:
        # Mid-stream: some batches are in the output, and a batch is leased, not committed.
        if (
            (output / "_delta_log").exists()
            and len(list((output / "_delta_log").glob("*.json"))) >= 3
            and table.stats("orders")["leased"] > 0
        ):
            os.killpg(consumer.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    consumer.wait()
    assert consumer.returncode == -signal.SIGKILL, "the consumer finished before the kill"
    partial = spark.read.format("delta").load(str(output)).count()
    assert 0 < partial < len(expected)
    assert table.stats("orders")["leased"] > 0  # the killed batch is still leased
    restarted = run_consumer(queue_path, output, checkpoint)
    assert restarted.wait(timeout=300) == 0
    rows = spark.read.format("delta").load(str(output)).collect()
    assert sorted(bytes(r.body).decode() for r in rows) == sorted(expected)  # each once
    stats = table.stats("orders")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (len(expected), 0, 0)
    assert_identity(str(queue_path))
