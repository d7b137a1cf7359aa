"""Lease extension (``QueueTable.extend``): slow work keeps its leases, as JetStream's
``AckProgress`` and SQS's ``ChangeMessageVisibility`` do; nothing else changes."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from spark_queue import InvalidOptionError, QueueNotFoundError, QueueTable
from spark_queue.storage.store import QueueStore


def until_of(table: QueueTable, queue: str) -> dict[int, int]:
    leases = QueueStore(table.path).snapshot().states[queue].leases
    return dict(zip(leases.seq.tolist(), leases.until.tolist(), strict=True))


def test_extend_moves_only_the_holders_leases_forward(tmp_path):
    table = QueueTable(str(tmp_path / "queues"))
    table.declare("jobs")
    table.publish("jobs", ["a", "b", "c"])
    # Periods of minutes: every lease must still be held when extended and counted, however
    # slow the machine (a lease that ran out is not extended).
    mine = table.lease("jobs", "slow", max_messages=2, lease_period="5 minutes")["seq"]
    theirs = table.lease("jobs", "other", max_messages=1, lease_period="5 minutes")["seq"]
    before = until_of(table, "jobs")
    assert table.extend("jobs", [*mine.to_pylist(), 12345], "slow", "1 hour") == 2
    after = until_of(table, "jobs")
    for seq in mine.to_pylist():
        assert after[seq] - before[seq] >= 55 * 60 * 1_000_000  # microseconds
    assert after[theirs[0].as_py()] == before[theirs[0].as_py()]
    assert table.extend("jobs", theirs.to_pylist(), "slow", "1 hour") == 0  # not its lease
    stats = table.stats("jobs")
    assert (stats["leased"], stats["ready"], stats["added"]) == (3, 0, 3)


def test_an_extend_that_changes_nothing_commits_nothing(tmp_path):
    table = QueueTable(str(tmp_path / "queues"))
    table.declare("jobs")
    table.publish("jobs", ["a"])
    version = DeltaTable(table.path).version()
    assert table.extend("jobs", [1, 2, 3], "nobody", 60_000) == 0
    assert DeltaTable(table.path).version() == version


@pytest.mark.parametrize(
    ("queue", "consumer", "period", "error", "named"),
    [
        ("jobs", "slow", 0, InvalidOptionError, "period"),
        ("jobs", "slow", "soon", InvalidOptionError, "period"),
        ("jobs", "", "1m", InvalidOptionError, "consumer"),
        ("nope", "slow", "1m", QueueNotFoundError, "nope"),
    ],
)
def test_extend_refuses_bad_input_and_commits_nothing(
    tmp_path, queue, consumer, period, error, named
):
    table = QueueTable(str(tmp_path / "queues"))
    table.declare("jobs")
    table.publish("jobs", ["a"])
    seqs = table.lease("jobs", "slow", lease_period="1 minute")["seq"].to_pylist()
    version = DeltaTable(table.path).version()
    with pytest.raises(error, match=named):
        table.extend(queue, seqs, consumer, period)
    assert DeltaTable(table.path).version() == version
