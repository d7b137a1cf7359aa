"""The Python API (`QueueTable`) and compaction, on real Delta tables."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from spark_queue import InvalidOptionError, QueueNotFoundError, QueueTable
from spark_queue.commit.maintenance import SMALL_FILE_LIMIT
from spark_queue.storage.store import QueueStore
from tests.helpers import assert_identity, bodies, messages, write_batch


def test_declare_queues_stats_and_arguments(queue_path):
    table = QueueTable(queue_path)
    assert table.queues() == []
    table.declare("b", max_length=10, overflow="reject-publish", reject_threshold=0.8)
    table.declare("a", ring_size=3)
    assert table.queues() == ["a", "b"]
    assert table.arguments("a").overflow == "ring"
    assert table.arguments("b").reject_threshold == 0.8
    stats = table.stats("a")
    assert set(stats) == {
        "added",
        "acked",
        "replaced",
        "dropped",
        "rejected",
        "expired",
        "killed",
        "dead_lettered",
        "purged",
        "duplicates",
        "ready",
        "ready_bytes",
        "leased",
        "scheduled",
        "leased_by_consumer",
        "groups_by_consumer",
    }
    assert stats.pop("leased_by_consumer") == {}
    assert stats.pop("groups_by_consumer") == {}
    assert all(v == 0 for v in stats.values())
    with pytest.raises(InvalidOptionError, match="max_length"):
        table.declare("c", max_length=-7)
    with pytest.raises(InvalidOptionError, match="unknown queue argument 'maxlen'"):
        table.declare("c", maxlen=3)
    with pytest.raises(QueueNotFoundError, match="'zzz' does not exist"):
        table.stats("zzz")


def test_peek_and_purge(spark, queue_path):
    write_batch(messages(spark, list("abcde")), queue_path, queue="q", maxLength=4)
    table = QueueTable(queue_path)
    peeked = table.peek("q", 2)
    assert [bytes(b).decode() for b in peeked["body"].to_pylist()] == ["b", "c"]
    assert table.peek("q", 0).num_rows == 0
    assert table.stats("q")["ready"] == 4  # peek has no side effects
    assert table.purge("q") == 4
    assert bodies(spark, queue_path, "q") == []
    stats = table.stats("q")
    assert (stats["purged"], stats["ready"], stats["dropped"]) == (4, 0, 1)
    write_batch(messages(spark, ["f"]), queue_path, queue="q")
    assert bodies(spark, queue_path, "q") == ["f"]
    assert_identity(queue_path)


def test_alter_drop_head_dead_letters_what_it_trims(spark, queue_path):
    write_batch(messages(spark, list("abc")), queue_path, queue="q", deadLetterQueue="q.dlq")
    QueueTable(queue_path).alter("q", max_length=1)
    assert bodies(spark, queue_path, "q") == ["c"]
    assert bodies(spark, queue_path, "q.dlq") == ["a", "b"]
    assert_identity(queue_path)


def test_compaction_keeps_every_live_message_and_drops_dead_files(spark, queue_path):
    table = QueueTable(queue_path)
    table.declare("q", ring_size=5)
    for i in range(12):
        write_batch(messages(spark, [f"m{i}-{j}" for j in range(3)]), queue_path, queue="q")
    before = bodies(spark, queue_path, "q")
    result = table.compact()
    assert result["dropped"] >= 8 and result["written"] >= 1
    assert bodies(spark, queue_path, "q") == before
    files = QueueStore(queue_path).snapshot().files
    message_files = files.filter(pc.equal(files["record"], "message"))
    assert message_files.num_rows == 1
    assert_identity(queue_path)


def test_auto_compaction_bounds_the_number_of_files(spark, queue_path):
    QueueTable(queue_path).declare("q", ring_size=10)
    df = messages(spark, ["x", "y"])
    for _ in range(SMALL_FILE_LIMIT + 3):
        write_batch(df, queue_path, queue="q")
    files = QueueStore(queue_path).snapshot().files
    assert files.num_rows < SMALL_FILE_LIMIT + 4  # compaction ran inside the writes
    assert bodies(spark, queue_path, "q") == ["x", "y"] * 5
    assert_identity(queue_path)
