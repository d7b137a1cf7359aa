"""Many clients on one table stay cheap and exact: counts, idle polls, compaction."""

from __future__ import annotations

import json
import time

import pytest

from spark_queue import QueueTable
from spark_queue.commit.group import group_of
from spark_queue.commit.maintenance import SMALL_FILE_LIMIT, compact
from spark_queue.rules import identity_holds
from spark_queue.storage.files import REMOVAL


@pytest.fixture
def table(tmp_path) -> QueueTable:
    table = QueueTable(str(tmp_path / "queues"))
    table.publish("q", [f"m{i}" for i in range(SMALL_FILE_LIMIT + 8)])
    return table


def version(table: QueueTable) -> int:
    return table.store.open().version()


def test_ack_and_release_count_only_what_the_call_ended(table):
    """Another consumer's lease that runs out is returned by the same commit, uncounted."""
    table.lease("q", "slow", max_messages=5, lease_period=1)  # runs out in 1 ms
    mine = table.lease("q", "fast", max_messages=10)["seq"].to_pylist()
    time.sleep(0.01)
    assert table.ack("q", mine[:4], "fast") == 4
    assert table.stats("q")["leased"] == 6  # the slow lease went back in that commit
    table.lease("q", "slow", max_messages=5, lease_period=1)
    time.sleep(0.01)
    assert table.release(consumer="fast") == 6
    assert table.cancel("q", mine[:4], "fast") == 0  # acked before: nothing to end
    stats = table.stats("q")
    assert (stats["leased"], stats["acked"]) == (0, 4)
    assert identity_holds(stats)


def test_a_lease_that_finds_nothing_writes_nothing(table):
    table.ack("q", table.lease("q", "c", max_messages=1000)["seq"].to_pylist(), "c")
    before = version(table)
    for _ in range(5):
        assert table.lease("q", "c").num_rows == 0
    assert version(table) == before  # an idle poll leaves no commit

    table.publish("q", ["late"])
    table.lease("q", "gone", lease_period=1)
    time.sleep(0.01)
    before = version(table)
    assert table.lease("q", "other", max_messages=0).num_rows == 0
    assert version(table) == before + 1  # a lease that ran out is settled and committed
    assert table.stats("q")["ready"] == 1


def test_consumer_commits_compact_the_files_they_leave(table):
    """Every ack writes a small removal file and only consumers commit here: compaction
    follows their commits too, not only producers'."""
    for _ in range(SMALL_FILE_LIMIT + 4):
        table.ack("q", table.lease("q", "c", max_messages=1)["seq"].to_pylist(), "c")
    group_of(table.store.location).settle()  # compaction runs after the answers
    files = table.store.snapshot().files
    assert sum(1 for r in files["record"].to_pylist() if r == REMOVAL) < SMALL_FILE_LIMIT
    operations = [
        json.loads(c.get("spark_queue", "{}")).get("operation")
        for c in table.store.open().history()
    ]
    assert "COMPACT" in operations
    stats = table.stats("q")
    assert stats["acked"] == SMALL_FILE_LIMIT + 4 and identity_holds(stats)


def test_a_compaction_overtaken_by_other_writers_still_lands(table):
    """A compaction planned before a publish and an ack commits on the newer version: it
    keeps only rows live when planned, and nothing it keeps or drops changed meanwhile."""
    for n in range(SMALL_FILE_LIMIT - 4):
        table.publish("small", [f"s{n}"])  # small files, fewer than trigger a compaction
    table.ack("small", table.lease("small", "c", max_messages=3)["seq"].to_pylist(), "c")
    leased = table.lease("small", "c", max_messages=2)
    planned_on = table.store.snapshot()
    table.publish("small", ["late"])  # other writers commit first
    table.cancel("small", leased["seq"].to_pylist(), "c")
    counts = compact(table.store, planned_on)
    assert counts["rewritten"] + counts["dropped"] > 0
    assert json.loads(table.store.open().history(1)[0]["spark_queue"])["operation"] == "COMPACT"
    remaining = [bytes(b).decode() for b in table.peek("small", 100)["body"].to_pylist()]
    assert remaining == [f"s{n}" for n in range(3, SMALL_FILE_LIMIT - 4)] + ["late"]
    assert identity_holds(table.stats("small"))
