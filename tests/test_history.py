"""`QueueTable.history`: every queue's gauges and counters after each commit, from the Delta log.

The oracle is delta-spark: time travel to each version and read the `record = 'queue'` state
rows and the `record = 'lease'` index with Spark SQL, a second reader of the same table that
shares no code with `spark_queue.storage.history`.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable, write_deltalake

from spark_queue import (
    InvalidOptionError,
    NotAQueueTableError,
    QueueError,
    QueueNotFoundError,
    QueueTable,
)
from spark_queue.rules import COUNTERS, identity_holds
from spark_queue.storage.history import HISTORY_SCHEMA
from tests.helpers import messages, write_batch

COLUMNS = ["version", "operation", "queue", "ready", "leased", "added", "acked", "dropped"]
COLUMNS += ["dead_lettered", "max_length"]


def _scenario(spark, path: str) -> QueueTable:
    """Declare, enqueue past a limit (drop-head into a DLQ), lease, ack, cancel, compact,
    lower the limit: versions 1 to 8, of which compaction (7) writes no state."""
    table = QueueTable(path)
    table.declare("q", max_length=5, dead_letter_queue="dlq")  # v1
    write_batch(messages(spark, list("abc")), path, queue="q")  # v2
    write_batch(messages(spark, list("defg")), path, queue="q")  # v3: a, b dropped
    leased = table.lease("q", "worker", max_messages=2)["seq"].to_pylist()  # v4: c, d
    assert table.ack("q", leased[:1], consumer="worker") == 1  # v5
    assert table.cancel("q", leased[1:], consumer="worker") == 1  # v6: d back
    compacted = table.compact()  # v7: files only, no state change
    assert compacted["dropped"] + compacted["rewritten"] > 0
    assert DeltaTable(path).version() == 7
    table.alter("q", max_length=3)  # v8: drop-head trims d at once
    return table


def _rows(history: pa.Table) -> list[tuple]:
    return [tuple(row[c] for c in COLUMNS) for row in history.select(COLUMNS).to_pylist()]


@pytest.mark.spark
def test_history_of_a_queue_follows_every_commit(spark, queue_path):
    table = _scenario(spark, queue_path)
    history = table.history()
    assert history.schema == HISTORY_SCHEMA
    # version, operation, queue, ready, leased, added, acked, dropped, dead_lettered, limit
    assert _rows(history) == [
        (1, "DECLARE q", "q", 0, 0, 0, 0, 0, 0, 5),
        (2, "ENQUEUE", "q", 3, 0, 3, 0, 0, 0, 5),
        (3, "ENQUEUE", "dlq", 2, 0, 2, 0, 0, 0, None),
        (3, "ENQUEUE", "q", 5, 0, 7, 0, 2, 2, 5),
        (4, "LEASE q worker", "dlq", 2, 0, 2, 0, 0, 0, None),
        (4, "LEASE q worker", "q", 3, 2, 7, 0, 2, 2, 5),
        (5, "ACK q", "dlq", 2, 0, 2, 0, 0, 0, None),
        (5, "ACK q", "q", 3, 1, 7, 1, 2, 2, 5),
        (6, "CANCEL q", "dlq", 2, 0, 2, 0, 0, 0, None),
        (6, "CANCEL q", "q", 4, 0, 7, 1, 2, 2, 5),
        (8, "ALTER q", "dlq", 3, 0, 3, 0, 0, 0, None),
        (8, "ALTER q", "q", 3, 0, 7, 1, 3, 3, 3),
    ]
    for row in history.to_pylist():
        assert identity_holds(row), row
    timestamps = history["timestamp"].to_pylist()
    assert timestamps == sorted(timestamps) and None not in timestamps
    # The last row of each queue is what stats() says now (nothing scheduled or expiring).
    for name in ("q", "dlq"):
        last = [r for r in history.to_pylist() if r["queue"] == name][-1]
        stats = table.stats(name)
        assert {k: last[k] for k in (*COUNTERS, "ready", "ready_bytes", "leased")} == {
            k: stats[k] for k in (*COUNTERS, "ready", "ready_bytes", "leased")
        }


@pytest.mark.spark
def test_history_equals_delta_spark_time_travel(spark, queue_path):
    table = _scenario(spark, queue_path)
    history = table.history()
    ours = spark.createDataFrame(history).select(
        "version", "queue", "ready", "ready_bytes", "leased", "scheduled", *COUNTERS
    )
    counters = ", ".join(f"coalesce(s.counters['{c}'], 0) AS {c}" for c in COUNTERS)
    state_type = "struct<counters: map<string, bigint>, levels: map<string, array<bigint>>>"
    parts = []
    for version in sorted(set(history["version"].to_pylist())):
        spark.read.format("delta").option("versionAsOf", version).load(
            queue_path
        ).createOrReplaceTempView("at_version")
        parts.append(
            spark.sql(
                f"""
                WITH states AS (
                  SELECT queue, from_json(queue_state, '{state_type}') AS s
                  FROM at_version WHERE record = 'queue'),
                leases AS (
                  SELECT queue, count(*) AS n FROM at_version WHERE record = 'lease'
                  GROUP BY queue),
                waiting AS (
                  SELECT queue, count(*) AS n FROM at_version WHERE record = 'scheduled'
                  GROUP BY queue)
                SELECT CAST({version} AS BIGINT) AS version, states.queue,
                  aggregate(map_values(s.levels), 0L, (acc, l) -> acc + l[1]) AS ready,
                  aggregate(map_values(s.levels), 0L, (acc, l) -> acc + l[2]) AS ready_bytes,
                  coalesce(leases.n, 0) AS leased, coalesce(waiting.n, 0) AS scheduled,
                  {counters}
                FROM states
                LEFT JOIN leases ON leases.queue = states.queue
                LEFT JOIN waiting ON waiting.queue = states.queue
                """
            )
        )
    theirs = parts[0]
    for part in parts[1:]:
        theirs = theirs.unionByName(part)
    assert_df_equality(
        ours, theirs, ignore_row_order=True, ignore_nullable=True, ignore_column_order=True
    )


@pytest.mark.spark
def test_history_selects_queue_and_versions_and_skips_what_is_gone(spark, queue_path):
    table = _scenario(spark, queue_path)
    only_q = table.history("q")
    assert set(only_q["queue"].to_pylist()) == {"q"}
    assert only_q["version"].to_pylist() == [1, 2, 3, 4, 5, 6, 8]
    some = table.history("dlq", versions=range(4, 7))
    assert some["version"].to_pylist() == [4, 5, 6]
    assert table.history(versions=[7]).num_rows == 0  # compaction changed no state
    assert table.history(versions=[99]).num_rows == 0  # not reached yet

    # A vacuum deletes state files removed long ago: that version has no rows, the rest do.
    log = Path(queue_path) / "_delta_log"
    added = (log / f"{2:020d}.json").read_text()
    state_file = next(
        line.split('"path":"')[1].split('"')[0]
        for line in added.splitlines()
        if '"add"' in line and "record=queue/" in line
    )
    (Path(queue_path) / state_file).unlink()
    assert table.history("q")["version"].to_pylist() == [1, 3, 4, 5, 6, 8]

    # Log cleanup: history starts at the oldest commit file the log still holds.
    DeltaTable(queue_path).create_checkpoint()
    for version in range(0, 4):
        (log / f"{version:020d}.json").unlink()
    assert table.history("q")["version"].to_pylist() == [4, 5, 6, 8]


def test_history_refuses_bad_arguments_and_other_tables(tmp_path):
    path = str(tmp_path / "queues")
    with pytest.raises(QueueError, match="no queue table at"):
        QueueTable(path).history()
    table = QueueTable(path)
    table.declare("a", ring_size=3)
    for bad in ([-1], [True], [1.5], "3"):
        with pytest.raises(InvalidOptionError, match="versions must be whole numbers"):
            table.history(versions=bad)
    with pytest.raises(QueueNotFoundError, match=r"'nope' does not exist.*queues: \['a'\]"):
        table.history("nope")
    other = str(tmp_path / "plain")
    write_deltalake(other, pa.table({"x": [1, 2]}))
    with pytest.raises(NotAQueueTableError):
        QueueTable(other).history()


def test_history_of_declarations_needs_no_spark(tmp_path):
    table = QueueTable(str(tmp_path / "queues"))
    table.declare("a", ring_size=3)
    table.declare("b", max_length_bytes=1000)
    table.alter("a", ring_size=2)
    history = table.history()
    assert [(r["version"], r["operation"], r["queue"]) for r in history.to_pylist()] == [
        (1, "DECLARE a", "a"),
        (2, "DECLARE b", "a"),
        (2, "DECLARE b", "b"),
        (3, "ALTER a", "a"),
        (3, "ALTER a", "b"),
    ]
    assert history.column("max_length").to_pylist() == [3, 3, None, 2, None]
    assert history.column("max_length_bytes").to_pylist() == [None, None, 1000, None, 1000]


def test_history_gauges_are_the_states_gauges(tmp_path):
    """Each row's gauges come from the whole state the commit wrote (its queue record and its
    indexes), as ``stats`` computes them: leased, scheduled and ready, per queue."""
    table = QueueTable(str(tmp_path / "queues"))
    table.declare("a")
    table.declare("b")
    table.publish("a", [f"m{i}" for i in range(10)])
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    table.publish("a", [{"body": b"later", "deliver_at": later}])
    table.publish("b", ["x", "y"])
    table.lease("a", "worker", max_messages=3)
    table.lease("b", "other", max_messages=1)
    last = {row["queue"]: row for row in table.history().to_pylist()}
    for name in ("a", "b"):
        stats = table.stats(name)
        assert {k: last[name][k] for k in ("ready", "ready_bytes", "leased", "scheduled")} == {
            k: stats[k] for k in ("ready", "ready_bytes", "leased", "scheduled")
        }
    assert (last["a"]["leased"], last["a"]["scheduled"], last["b"]["leased"]) == (3, 1, 1)
