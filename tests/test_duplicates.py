"""De-duplication by message id: a queue with a ``duplicate_window`` enqueues a
``message_id`` once within it, across producers, batches and restarts, as JetStream does
with ``Nats-Msg-Id`` and its ``Duplicates`` window (Artemis: the duplicate-id cache; SQS
FIFO: a five-minute window). Duplicates are counted, never stored."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql.streaming import StreamingQuery

from spark_queue import InvalidOptionError, QueueTable
from spark_queue.model.policies import load_policies
from spark_queue.rules import SeenRun, id_hashes, identity_holds
from spark_queue.storage import dedup_window
from tests.clock import now_micros, wait_past


def _messages(ids: list[str | None], prefix: str = "m") -> pa.Table:
    return pa.table(
        {
            "message_id": pa.array(ids, pa.string()),
            "body": pa.array([f"{prefix}{i}" for i in range(len(ids))], pa.string()),
        }
    )


def _seen_files(path: str) -> list[str]:
    return [f for f in DeltaTable(path).file_uris() if "record=seen" in f]


def test_jetstream_a_message_id_published_twice_within_the_window_is_stored_once(tmp_path):
    """JetStream: publishing with the same Nats-Msg-Id twice within the Duplicates window
    stores one message; the second publish is acknowledged as a duplicate."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare("ORDERS", duplicate_window="2 minutes")
    first = table.publish("ORDERS", _messages(["order-1"]))
    again = table.publish("ORDERS", _messages(["order-1"]))
    assert (first.duplicates, len(first.seqs)) == (0, 1)
    assert (again.duplicates, again.seqs) == (1, [])
    stats = table.stats("ORDERS")
    assert (stats["added"], stats["ready"], stats["duplicates"]) == (1, 1, 1)
    assert identity_holds(stats)


def test_the_first_of_a_batch_wins_and_nulls_are_never_duplicates(tmp_path):
    table = QueueTable(str(tmp_path / "q"))
    table.declare("q", duplicate_window=60_000)
    result = table.publish("q", _messages(["a", "b", "a", None, None, "b", "c"]))
    assert result.duplicates == 2
    bodies = table.peek("q", limit=10).column("body").to_pylist()
    assert bodies == [b"m0", b"m1", b"m3", b"m4", b"m6"]


def test_ids_hold_across_producers_and_restarts(tmp_path):
    """Two producers (table objects) and a restarted process (the in-memory window gone)
    all see the ids the others enqueued."""
    path = str(tmp_path / "q")
    one, two = QueueTable(path), QueueTable(path)
    one.declare("q", duplicate_window="1 hour")
    one.publish("q", _messages(["a", "b"]))
    assert two.publish("q", _messages(["b", "c"])).duplicates == 1
    dedup_window.forget()  # as a new process: read from the table's seen files
    assert QueueTable(path).publish("q", _messages(["a", "c", "d"])).duplicates == 2
    assert QueueTable(path).stats("q")["added"] == 4


def test_an_id_is_enqueued_again_once_the_window_has_passed(tmp_path):
    """The window counts from when the id was enqueued. Declared an hour long, so the
    second publish is inside it however slow the machine; then shortened to 300 ms, which
    the clock is left to pass (the window is read at each check)."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare("q", duplicate_window="1 hour")
    table.publish("q", _messages(["a"]))
    enqueued = now_micros()  # after the first publish: the id was recorded before this
    assert table.publish("q", _messages(["a"])).duplicates == 1
    table.alter("q", duplicate_window=300)
    wait_past(enqueued + 300_000)
    assert table.publish("q", _messages(["a"])).duplicates == 0
    assert table.stats("q")["added"] == 2


def test_seen_files_out_of_the_window_are_removed_from_the_table(tmp_path):
    """The stored window is bounded: a commit removes the seen files older than the window.
    An hour long while the files are written (none may fall out of it meanwhile, however
    slow the machine), then 200 ms, which the clock is left to pass."""
    path = str(tmp_path / "q")
    table = QueueTable(path)
    table.declare("q", duplicate_window="1 hour")
    table.publish("q", _messages(["a", "b"]))
    table.publish("q", _messages(["c"]))
    written = now_micros()
    assert len(_seen_files(path)) == 2
    table.alter("q", duplicate_window=200)
    assert len(_seen_files(path)) == 2  # only an enqueue with ids removes them
    wait_past(written + 200_000)
    table.publish("q", _messages(["d"]))
    assert len(_seen_files(path)) == 1
    rows = DeltaTable(path).to_pyarrow_table(
        filters=[("record", "=", "seen")], columns=["queue", "seq", "body"]
    )
    browsed = table.peek("q", limit=4)
    (d_seq,) = browsed.filter(pc.equal(browsed["message_id"], "d"))["seq"].to_pylist()
    assert rows.column("seq").to_pylist() == [d_seq]
    first, second, _ = id_hashes(pa.array(["d"]))
    stored = SeenRun.of_digests(rows["body"], np.zeros(1, np.int64))
    assert (stored.first.tolist(), stored.second.tolist()) == ([first[0]], [second[0]])


def test_an_id_a_reject_policy_refused_was_never_enqueued(tmp_path):
    """A message refused at a limit was not enqueued, so its id may come again."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare("q", max_length=1, overflow="reject-publish", duplicate_window="1 hour")
    table.publish("q", _messages(["a"]))
    assert table.publish("q", _messages(["b"])).rejected == 1
    leased = table.lease("q", "w")
    table.ack("q", leased.column("seq").to_pylist(), "w")
    again = table.publish("q", _messages(["b"]))
    assert (again.rejected, again.duplicates, len(again.seqs)) == (0, 0, 1)
    assert table.publish("q", _messages(["a"])).duplicates == 1  # consumed, still seen


def test_duplicates_are_counted_in_history(tmp_path):
    table = QueueTable(str(tmp_path / "q"))
    table.declare("q", duplicate_window="1 hour")
    table.publish("q", _messages(["a", "a", "a"]))
    assert table.history("q").column("duplicates").to_pylist()[-1] == 2


@pytest.mark.parametrize("value", ["soon", -1, "5 fortnights"])
def test_a_bad_duplicate_window_names_the_argument_and_writes_nothing(tmp_path, value):
    table = QueueTable(str(tmp_path / "q"))
    table.declare("other")
    version = DeltaTable(table.path).version()
    with pytest.raises(InvalidOptionError, match="duplicate_window"):
        table.publish("q", _messages(["a"]), duplicate_window=value)
    assert DeltaTable(table.path).version() == version
    assert table.queues() == ["other"]


def _publish_ids(path: str, producer: int, rounds: int) -> None:
    table = QueueTable(path)
    for round_ in range(rounds):
        ids = [f"id-{round_}-{i}" for i in range(10)]
        table.publish("q", _messages(ids, prefix=f"p{producer}-"))


def test_two_processes_racing_the_same_ids_enqueue_each_once(tmp_path):
    path = str(tmp_path / "q")
    QueueTable(path).declare("q", duplicate_window="1 hour")
    context = multiprocessing.get_context("spawn")
    racers = [context.Process(target=_publish_ids, args=(path, n, 20)) for n in range(2)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(120)
        assert racer.exitcode == 0
    stats = QueueTable(path).stats("q")
    assert (stats["added"], stats["duplicates"]) == (200, 200)
    ids = QueueTable(path).peek("q", limit=1000).column("message_id").to_pylist()
    assert sorted(ids) == sorted(f"id-{r}-{i}" for r in range(20) for i in range(10))


def test_two_streaming_producers_enqueue_a_shared_id_once(spark, tmp_path: Path):
    """Two streaming queries write overlapping message ids into one queue at once."""
    path = str(tmp_path / "q")
    QueueTable(path).declare("q", duplicate_window="1 hour")

    def source(name: str, ids: range) -> Path:
        folder = tmp_path / f"in-{name}"
        rows = [(f"id-{i}", f"{name}-{i}") for i in ids]
        spark.createDataFrame(rows, "message_id string, body string").coalesce(1).write.parquet(
            str(folder)
        )
        return folder

    def start(folder: Path) -> StreamingQuery:
        return (
            spark.readStream.schema("message_id string, body string")
            .parquet(str(folder))
            .writeStream.format("ringqueue")
            .option("queue", "q")
            .option("checkpointLocation", str(folder) + "-checkpoint")
            .trigger(availableNow=True)
            .start(path)
        )

    # Both run at once; started from this thread, one after the other: the shape
    # test_groups moved to after threads starting Python data source queries on a fresh
    # session at once failed a task now and then (java.io.OptionalDataException).
    inputs = [source("left", range(0, 600)), source("right", range(400, 1000))]
    queries = [start(folder) for folder in inputs]
    for query in queries:
        query.awaitTermination()
        assert query.exception() is None
    stats = QueueTable(path).stats("q")
    assert (stats["added"], stats["duplicates"]) == (1000, 200)
    browsed = spark.read.format("ringqueue").option("queue", "q").load(path)
    expected = spark.createDataFrame([(f"id-{i}",) for i in range(1000)], "message_id string")
    assert_df_equality(
        browsed.select("message_id"), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_a_policy_caps_the_window_of_queues_that_have_one(tmp_path):
    """A policy bounds the state de-duplication keeps: a longer window is cut to the cap,
    and a queue without a window gets none."""
    policies = tmp_path / "policies.toml"
    policies.write_text('[policy.bounded]\nmatch = "#"\nduplicate-window = "5 minutes"\n')
    table = QueueTable(str(tmp_path / "q"), policies=load_policies(str(policies)))
    table.declare("long", duplicate_window="1 day")
    table.declare("none")
    assert table.arguments("long").duplicate_window == 300_000
    assert table.arguments("none").duplicate_window is None
