"""Exactly once across a crash, window by window, batch 0 included.

Each case runs a real driver process (Spark, Delta, the connector) that SIGKILLs itself at a
named failpoint (``spark_queue.failpoints``): deterministic, not a timer racing the query.
The checkpoint is checked to be in the window the case names, then the query is restarted
from it and must end with every message exactly once. The window "after the sink commit,
before Spark's commit log" has no failpoint of ours inside it (Spark writes the commit log
right after the sink returns): the driver dies at the start of the next batch and the
batch's commit log entry is removed, which leaves the checkpoint as that crash does.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from spark_queue import QueueTable
from tests.crash import (
    CONSUMER,
    PRODUCER,
    crashed,
    forget_commit,
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


# -- the producer: file source -> ringqueue ---------------------------------------------------

# (failpoint, (offset log, commit log) after the crash, messages committed after the crash)
PRODUCER_WINDOWS = {
    "batch0-files-staged": ("sink.staged:1", (0, None), 0),
    "batch0-committed-no-commit-log": ("sink.committed:1", (0, None), PER_FILE),
    "batch1-files-staged": ("sink.staged:2", (1, 0), PER_FILE),
    "batch1-committed-no-commit-log": ("sink.committed:2", (1, 0), 2 * PER_FILE),
}


@pytest.mark.parametrize("window", PRODUCER_WINDOWS)
def test_a_producer_killed_in_each_window_enqueues_each_message_once(spark, tmp_path, window):
    failpoint, in_logs, committed = PRODUCER_WINDOWS[window]
    expected = make_input(spark, tmp_path, FILES, PER_FILE)
    queue_path, checkpoint = tmp_path / "queues", tmp_path / "checkpoint"
    args = (queue_path, tmp_path / "flat", checkpoint)
    assert crashed(start(PRODUCER, *args, crash_at=failpoint))
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


@pytest.mark.parametrize("window", CONSUMER_WINDOWS)
def test_a_consumer_killed_in_each_window_delivers_each_message_once(spark, tmp_path, window):
    failpoint, forget, in_logs, leased = CONSUMER_WINDOWS[window]
    queue_path, output, checkpoint = tmp_path / "queues", tmp_path / "out", tmp_path / "chk"
    expected = fill_queue(spark, queue_path)
    args = (queue_path, output, checkpoint, PER_BATCH)
    assert crashed(start(CONSUMER, *args, crash_at=failpoint))
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


def test_a_fresh_checkpoint_returns_what_the_consumer_name_held(spark, tmp_path):
    """A new query under a known consumer name (its checkpoint lost) gets back the batch the
    old query held and never wrote: delivered once more, with its delivery count raised."""
    queue_path, out = tmp_path / "queues", tmp_path / "out"
    expected = fill_queue(spark, queue_path)
    first = (queue_path, out, tmp_path / "chk", PER_BATCH)
    assert crashed(start(CONSUMER, *first, crash_at="source.partitions:2"))  # batch 1
    held = QueueTable(str(queue_path)).stats("orders")
    assert (held["leased"], held["acked"]) == (PER_BATCH, PER_BATCH)

    again = (queue_path, out, tmp_path / "chk-new", PER_BATCH)
    restart(spark, CONSUMER, *again)
    assert delivered(out) == expected
    (counts,) = output_columns(out, "delivery_count")
    counts.sort()
    assert counts == [1] * (MESSAGES - PER_BATCH) + [2] * PER_BATCH
    stats = QueueTable(str(queue_path)).stats("orders")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (MESSAGES, 0, 0)
    assert_identity(str(queue_path))
