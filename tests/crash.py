"""Driver processes for the crash tests: started as session leaders, killed whole."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

from spark_queue.commit.failpoints import CRASH_AT, CRASH_DIR

ROOT = Path(__file__).resolve().parent.parent
DRIVERS = ROOT / "tests" / "drivers"
PRODUCER = DRIVERS / "produce_stream.py"
CONSUMER = DRIVERS / "consume_stream.py"


# A driver started with this set starts its session, then waits for the file it names to
# exist before its query starts (tests/drivers/consume_stream.py): a test starts the next
# run's JVM while the current run still works.
GO_FILE = "SPARK_QUEUE_TEST_GO_FILE"


def start(
    script: Path, *args: object, crash_at: str | None = None, go: Path | None = None
) -> subprocess.Popen:
    """Run a driver script as a new session (so a SIGKILL takes the JVM and every Python
    worker with it), logging beside its first argument. ``crash_at`` (``point:n``) makes
    it die at that failpoint (``spark_queue.commit.failpoints``). ``go``: the driver's query waits
    for this file (a driver that supports it: :data:`GO_FILE`)."""
    first = Path(str(args[0]))
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
    }
    env.pop(CRASH_AT, None)
    env.pop(GO_FILE, None)
    if crash_at is not None:
        env[CRASH_AT] = crash_at
        env[CRASH_DIR] = str(first.parent / f"crash-hits-{time.monotonic_ns()}")
    if go is not None:
        env[GO_FILE] = str(go)
    log = open(first.parent / f"{script.stem}-{time.monotonic_ns()}.log", "w")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, str(script), *map(str, args)],
        env=env,
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def restart(spark: SparkSession, script: Path, *args: object) -> None:
    """Run a driver script's query again from its checkpoint, in this process's session:
    what a restarted driver does, without starting another JVM."""
    spec = importlib.util.spec_from_file_location(script.stem, script)
    assert spec is not None and spec.loader is not None
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    driver.run(spark, *map(str, args))


def kill(driver: subprocess.Popen) -> None:
    """SIGKILL a driver's process group (the JVM and the workers it started directly)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()


def crashed(driver: subprocess.Popen, timeout: float = 300) -> bool:
    """Wait for a driver run with ``crash_at``: True if its failpoint killed it."""
    return driver.wait(timeout=timeout) == -signal.SIGKILL


def forget_commit(checkpoint: Path, batch: int) -> None:
    """Remove Spark's commit log entry of ``batch``: the checkpoint as a driver killed after
    the sink committed the batch, before Spark logged the commit, leaves it."""
    (checkpoint / "commits" / str(batch)).unlink()
    (checkpoint / "commits" / f".{batch}.crc").unlink(missing_ok=True)  # Hadoop's checksum


def make_input(
    spark: SparkSession, folder: Path, files: int, per_file: int, prefix: str = ""
) -> list[str]:
    """``files`` Parquet files of ``per_file`` string bodies in one flat folder, in name
    order (the file source's batch order with ``maxFilesPerTrigger`` 1)."""
    everything = []
    flat = folder / "flat"
    flat.mkdir(parents=True)
    for f in range(files):
        rows = [f"{prefix}file{f}-msg{i}" for i in range(per_file)]
        everything += rows
        spark.createDataFrame([(r,) for r in rows], "body string").coalesce(1).write.parquet(
            str(folder / f"part{f}")
        )
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
    """Message files on disk that no commit references."""
    on_disk = {
        f"record=message/{p.name}" for p in (queue_path / "record=message").glob("*.parquet")
    }
    return on_disk - committed_paths(queue_path)


def logged(checkpoint: Path) -> tuple[int | None, int | None]:
    """The last batch in Spark's offset log and in its commit log (None: none)."""

    def last(folder: Path) -> int | None:
        batches = [int(p.name) for p in folder.glob("*") if p.name.isdigit()]
        return max(batches, default=None)

    return last(checkpoint / "offsets"), last(checkpoint / "commits")
