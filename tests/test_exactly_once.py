"""Exactly once across a crash, window by window, batch 0 included.

Each case runs a real driver process (Spark, Delta, the connector) that SIGKILLs itself at a
named failpoint (``spark_queue.commit.failpoints``): deterministic, not a timer racing the query.
The checkpoint is checked to be in the window the case names, then the query is restarted
from it and must end with every message exactly once. The window "after the sink commit,
before Spark's commit log" has no failpoint of ours inside it (Spark writes the commit log
right after the sink returns): the driver dies at the start of the next batch and the
batch's commit log entry is removed, which leaves the checkpoint as that crash does.

Each case's crashing driver is started one case ahead (:class:`CrashRuns`): while a case
waits for its driver, the next case's driver starts on a queue and checkpoint of its own. A
driver's start keeps ~1.2 of two cores busy, so two at a time take less time than one after
another; more at once gained little and loaded the machine with JVMs. Cases that crash at
the same failpoint (and differ in what happens after) share one driver run, each case on a
copy of its folder made as the driver dies.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spark_queue import QueueTable
from spark_queue.model.partitions import partition_uri
from tests.crash import (
    CONSUMER,
    PRODUCER,
    crashed,
    forget_commit,
    kill,
    logged,
    make_input,
    restart,
    staged_only,
    start,
)
from tests.helpers import (
    assert_identity,
    bodies,
    delivered,
    messages,
    output_columns,
    write_batch,
)

pytestmark = pytest.mark.spark
FILES, PER_FILE = 4, 50  # producer: one file a batch
MESSAGES, PER_BATCH = 60, 20  # consumer
CRASH_TIMEOUT = 600.0  # seconds for a driver to reach its failpoint, two starting at once


class Crash:
    """A driver started with a failpoint, and the folders of the cases that start from where
    it crashed: cases with the same failpoint share one run, each on a copy of its folder."""

    def __init__(self, driver: subprocess.Popen, folder: Path, copies: list[Path]) -> None:
        self.driver, self.folder, self.copies = driver, folder, copies
        self.copied = False

    def wait(self) -> None:
        """Wait for the failpoint's kill, then copy the folder for the other cases (before
        any case changes it); fail with the driver's exit and log if it ended another way."""
        if not crashed(self.driver, timeout=CRASH_TIMEOUT):
            logs = sorted(self.folder.glob("*.log"))  # start() logs in the folder
            tail = logs[-1].read_text()[-3000:] if logs else "(no log)"
            pytest.fail(
                f"the driver exited {self.driver.returncode}, not at its failpoint:\n{tail}"
            )
        if not self.copied:
            for copy in self.copies:
                shutil.copytree(self.folder, copy, dirs_exist_ok=True)
            self.copied = True


@dataclass
class CrashRun:
    """A case's run: the messages it expects, the driver's arguments (a restart takes the
    same) and the crash it starts from."""

    expected: list[str]
    args: tuple[Any, ...]
    shared: Crash

    def crash(self) -> None:
        """Wait for the crash (:meth:`Crash.wait`)."""
        self.shared.wait()


class CrashRuns:
    """The crashing driver runs of one kind of case, each started one case ahead.

    ``cases`` maps a case to its failpoint, in the order pytest runs the cases; ``prepare``
    fills a case's folder and returns what the case expects and its driver's arguments,
    every path among them inside the folder. Cases with the same failpoint share the run
    of the first of them.
    """

    def __init__(
        self,
        script: Path,
        cases: dict[str, str],
        prepare: Callable[[Path], tuple[list[str], tuple[Any, ...]]],
        folders: pytest.TempPathFactory,
    ) -> None:
        self.script, self.cases, self.prepare, self.folders = script, cases, prepare, folders
        self.runs: dict[str, CrashRun] = {}

    def take(self, case: str) -> CrashRun:
        """``case``'s run, started now if it is not yet, and the next case's started."""
        order = list(self.cases)
        for ahead in order[order.index(case) : order.index(case) + 2]:
            if ahead not in self.runs:
                self._start(ahead)
        return self.runs[case]

    def _start(self, case: str) -> None:
        """Start the run of ``case`` and of every case with its failpoint."""
        sharing = [c for c, point in self.cases.items() if point == self.cases[case]]
        folders = {c: self.folders.mktemp(f"{self.script.stem}-{c}") for c in sharing}
        first = folders[sharing[0]]
        expected, args = self.prepare(first)
        driver = start(self.script, *args, crash_at=self.cases[case])
        shared = Crash(driver, first, [folders[c] for c in sharing[1:]])
        for c, folder in folders.items():
            moved = tuple(folder / a.relative_to(first) if isinstance(a, Path) else a for a in args)
            self.runs[c] = CrashRun(expected, moved, shared)

    def close(self) -> None:
        """Kill whatever still runs (a case that failed leaves its driver, the last case's
        successor is never taken)."""
        for driver in {run.shared.driver for run in self.runs.values()}:
            if driver.poll() is None:
                kill(driver)


# -- the producer: file source -> ringqueue ---------------------------------------------------

# (failpoint, (offset log, commit log) after the crash, messages committed after the crash)
PRODUCER_WINDOWS = {
    "batch0-files-staged": ("sink.staged:1", (0, None), 0),
    "batch0-committed-no-commit-log": ("sink.committed:1", (0, None), PER_FILE),
    "batch1-files-staged": ("sink.staged:2", (1, 0), PER_FILE),
    "batch1-committed-no-commit-log": ("sink.committed:2", (1, 0), 2 * PER_FILE),
}


@pytest.fixture(scope="module")
def producer_crashes(spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashRuns]:
    """The producer windows' drivers, each on its own input files and queue."""

    def prepare(folder: Path) -> tuple[list[str], tuple[Any, ...]]:
        expected = make_input(spark, folder, FILES, PER_FILE)
        return expected, (folder / "queues", folder / "flat", folder / "checkpoint")

    failpoints = {window: failpoint for window, (failpoint, _, _) in PRODUCER_WINDOWS.items()}
    runs = CrashRuns(PRODUCER, failpoints, prepare, tmp_path_factory)
    yield runs
    runs.close()


@pytest.mark.parametrize("window", PRODUCER_WINDOWS)
def test_a_producer_killed_in_each_window_enqueues_each_message_once(
    spark, producer_crashes, window
):
    _, in_logs, committed = PRODUCER_WINDOWS[window]
    run = producer_crashes.take(window)
    expected, args = run.expected, run.args
    queue_path, _, checkpoint = args
    run.crash()
    assert logged(checkpoint) == in_logs
    table = QueueTable(str(queue_path))
    exists = table.store.open() is not None and "orders" in table.queues()
    assert (table.stats("orders")["added"] if exists else 0) == committed

    restart(spark, PRODUCER, *args)
    after = bodies(spark, str(queue_path), "orders")
    assert sorted(after) == sorted(expected)  # each message exactly once
    assert after == expected  # in arrival order
    assert table.stats("orders")["added"] == len(expected)
    assert_identity(str(queue_path))
    assert enqueue_commits(queue_path) == [f"ENQUEUE batch {b}" for b in range(FILES)]
    if window.endswith("no-commit-log"):
        assert staged_only(queue_path) == set()  # the replay removed its own files


def enqueue_commits(queue_path: Path) -> list[str]:
    """The enqueue operations in the queue table's log, in commit order."""
    found = []
    for log in sorted((queue_path / "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            info = json.loads(line).get("commitInfo", {})
            operation = json.loads(info.get("spark_queue", "{}")).get("operation", "")
            if operation.startswith("ENQUEUE"):
                found.append(operation)
    return found


# -- the consumer: ringqueue -> Delta ----------------------------------------------------------

# (failpoint, batch whose commit log entry to remove, (offset log, commit log) after it all,
# messages leased after the crash)
CONSUMER_WINDOWS = {
    "batch0-lease-planned": ("source.lease-planned:1", None, (None, None), 0),
    "batch0-leased-offset-not-logged": ("source.lease-committed:1", None, (None, None), 20),
    "batch0-offset-logged-not-written": ("source.partitions:1", None, (0, None), 20),
    "batch0-written-no-commit-log": ("source.latest-offset:2", 0, (0, None), 20),
    "batch0-commit-logged-not-acked": ("source.latest-offset:2", None, (0, 0), 20),
    "batch1-leased-offset-not-logged": ("source.lease-committed:2", None, (0, 0), 20),
    "batch1-offset-logged-not-written": ("source.partitions:2", None, (1, 0), 20),
    "batch1-written-no-commit-log": ("source.latest-offset:3", 1, (1, 0), 20),
}


def fill_queue(spark, queue_path: Path) -> list[str]:
    expected = [f"msg-{i:03d}" for i in range(MESSAGES)]
    write_batch(messages(spark, expected), str(queue_path), queue="orders")
    return expected


# A consumer whose checkpoint is lost after it logged batch 1 and before it wrote it.
CHECKPOINT_LOST = "checkpoint-lost"
CONSUMER_CRASHES = {
    **{window: failpoint for window, (failpoint, *_) in CONSUMER_WINDOWS.items()},
    CHECKPOINT_LOST: "source.partitions:2",
}


@pytest.fixture(scope="module")
def consumer_crashes(spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashRuns]:
    """The consumer cases' drivers, each on its own queue."""

    def prepare(folder: Path) -> tuple[list[str], tuple[Any, ...]]:
        expected = fill_queue(spark, folder / "queues")
        return expected, (folder / "queues", folder / "out", folder / "chk", PER_BATCH)

    runs = CrashRuns(CONSUMER, CONSUMER_CRASHES, prepare, tmp_path_factory)
    yield runs
    runs.close()


@pytest.mark.parametrize("window", CONSUMER_WINDOWS)
def test_a_consumer_killed_in_each_window_delivers_each_message_once(
    spark, consumer_crashes, window
):
    _, forget, in_logs, leased = CONSUMER_WINDOWS[window]
    run = consumer_crashes.take(window)
    expected, args = run.expected, run.args
    queue_path, output, checkpoint, _ = args
    run.crash()
    if forget is not None:
        forget_commit(checkpoint, forget)
    assert logged(checkpoint) == in_logs
    table = QueueTable(str(queue_path))
    assert table.stats("orders")["leased"] == leased

    restart(spark, CONSUMER, *args)
    copies = Counter(delivered(output))
    assert [body for body, count in copies.items() if count > 1] == []  # no duplicates
    assert sorted(copies) == expected  # nothing lost
    stats = table.stats("orders")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (MESSAGES, 0, 0)
    assert_identity(str(queue_path))


def test_a_fresh_checkpoint_returns_what_the_consumer_name_held(spark, consumer_crashes):
    """A new query under a known consumer name (its checkpoint lost) gets back the batch the
    old query held and never wrote: delivered once more, with its delivery count raised."""
    run = consumer_crashes.take(CHECKPOINT_LOST)
    expected = run.expected
    queue_path, out, checkpoint, _ = run.args
    run.crash()  # logged batch 1, never wrote it
    held = QueueTable(str(queue_path)).stats("orders")
    assert (held["leased"], held["acked"]) == (PER_BATCH, PER_BATCH)

    again = (queue_path, out, checkpoint.with_name("chk-new"), PER_BATCH)
    restart(spark, CONSUMER, *again)
    assert delivered(out) == expected
    (counts,) = output_columns(out, "delivery_count")
    counts.sort()
    assert counts == [1] * (MESSAGES - PER_BATCH) + [2] * PER_BATCH
    stats = QueueTable(str(queue_path)).stats("orders")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (MESSAGES, 0, 0)
    assert_identity(str(queue_path))


# -- the consumer of a partitioned queue -------------------------------------------------------

PARTITIONS = 4
# (failpoint, batch whose commit log entry to remove, (offset log, commit log) after it all)
PARTITIONED_WINDOWS = {
    # Killed between two partitions' lease commits of batch 0: some partitions hold leases
    # no offset names.
    "batch0-some-partitions-leased": ("source.lease-planned:2", None, (None, None)),
    "batch0-offset-logged-not-written": ("source.partitions:1", None, (0, None)),
    "batch1-leased-offset-not-logged": ("source.lease-committed:2", None, (0, 0)),
    "batch1-written-no-commit-log": ("source.latest-offset:3", 1, (1, 0)),
}


def fill_partitioned_queue(queue_path: Path) -> list[str]:
    """Keyed messages over the partitions of a queue of :data:`PARTITIONS`."""
    expected = [f"msg-{i:03d}" for i in range(MESSAGES)]
    table = QueueTable(str(queue_path), broker="off")
    table.declare("orders", partitions=PARTITIONS)
    table.publish(
        "orders", [{"body": b, "key": f"customer-{i % 12}"} for i, b in enumerate(expected)]
    )
    assert all(s["added"] for s in table.partition_stats("orders"))  # every partition has some
    return expected


@pytest.fixture(scope="module")
def partitioned_crashes(spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashRuns]:
    """The partitioned consumer cases' drivers, each on its own queue."""

    def prepare(folder: Path) -> tuple[list[str], tuple[Any, ...]]:
        expected = fill_partitioned_queue(folder / "queues")
        return expected, (folder / "queues", folder / "out", folder / "chk", PER_BATCH)

    failpoints = {window: point for window, (point, *_) in PARTITIONED_WINDOWS.items()}
    runs = CrashRuns(CONSUMER, failpoints, prepare, tmp_path_factory)
    yield runs
    runs.close()


@pytest.mark.parametrize("window", PARTITIONED_WINDOWS)
def test_a_consumer_of_a_partitioned_queue_killed_delivers_each_message_once(
    spark, partitioned_crashes, window
):
    _, forget, in_logs = PARTITIONED_WINDOWS[window]
    run = partitioned_crashes.take(window)
    expected, args = run.expected, run.args
    queue_path, output, checkpoint, _ = args
    run.crash()
    if forget is not None:
        forget_commit(checkpoint, forget)
    assert logged(checkpoint) == in_logs

    restart(spark, CONSUMER, *args)
    copies = Counter(delivered(output))
    assert [body for body, count in copies.items() if count > 1] == []  # no duplicates
    assert sorted(copies) == expected  # nothing lost
    table = QueueTable(str(queue_path))
    for stats in table.partition_stats("orders"):  # each partition acknowledged its own
        assert (stats["acked"], stats["leased"], stats["ready"]) == (stats["added"], 0, 0)
    assert table.stats("orders")["acked"] == MESSAGES
    assert_identity(str(queue_path))


# -- the producer of a partitioned queue: file source -> ringqueue -----------------------------

# (failpoint, (offset log, commit log) after the crash); a batch's rows are keyed over every
# partition, so each batch commits PARTITIONS tables, one after another or at once.
PARTITIONED_PRODUCER_WINDOWS = {
    "batch0-some-partitions-committed": ("sink.partition-committed:1", (0, None)),
    "batch0-committed-no-commit-log": ("sink.committed:1", (0, None)),
    "batch1-some-partitions-committed": (f"sink.partition-committed:{PARTITIONS + 1}", (1, 0)),
}


@pytest.fixture(scope="module")
def partitioned_producer_crashes(
    spark, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CrashRuns]:
    """The partitioned producer windows' drivers, each on its own input files and queue."""

    def prepare(folder: Path) -> tuple[list[str], tuple[Any, ...]]:
        expected = make_input(spark, folder, FILES, PER_FILE)
        return expected, (folder / "queues", folder / "flat", folder / "checkpoint", PARTITIONS)

    failpoints = {window: point for window, (point, _) in PARTITIONED_PRODUCER_WINDOWS.items()}
    runs = CrashRuns(PRODUCER, failpoints, prepare, tmp_path_factory)
    yield runs
    runs.close()


@pytest.mark.parametrize("window", PARTITIONED_PRODUCER_WINDOWS)
def test_a_producer_to_a_partitioned_queue_killed_enqueues_each_message_once(
    spark, partitioned_producer_crashes, window
):
    _, in_logs = PARTITIONED_PRODUCER_WINDOWS[window]
    run = partitioned_producer_crashes.take(window)
    expected, args = run.expected, run.args
    queue_path, _, checkpoint, _ = args
    run.crash()
    assert logged(checkpoint) == in_logs
    crashed_in = f"ENQUEUE batch {in_logs[0]}"
    tables = [Path(partition_uri(str(queue_path), "orders", k)) for k in range(PARTITIONS)]
    assert any(crashed_in in enqueue_commits(t) for t in tables)  # killed after a commit

    restart(spark, PRODUCER, *args)
    table = QueueTable(str(queue_path))
    leased = table.lease("orders", "check", max_messages=None)
    copies = Counter(bytes(b).decode() for b in leased["body"].to_pylist())
    assert [body for body, count in copies.items() if count > 1] == []  # no duplicates
    assert sorted(copies) == sorted(expected)  # nothing lost
    added = [stats["added"] for stats in table.partition_stats("orders")]
    assert sum(added) == len(expected) and all(added)
    for store in tables:  # each table: one enqueue a batch, none twice
        assert enqueue_commits(store) == [f"ENQUEUE batch {b}" for b in range(FILES)]
    assert_identity(str(queue_path))
