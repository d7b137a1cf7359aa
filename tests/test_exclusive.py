"""Exclusive queues, after Artemis's exclusive queues ("all messages go to one
consumer until it disconnects") and RabbitMQ's single active consumer: one consumer name
holds the queue; another gets nothing until the holder releases or its last lease runs out.
No Spark: ``QueueTable`` runs the same core as the streaming source."""

from __future__ import annotations

import pytest

from spark_queue import InvalidOptionError, QueueTable
from spark_queue.rules import identity_holds
from tests.helpers import consume, delivered


def _bodies(table: QueueTable, consumer: str, count: int = 10) -> list[str]:
    leased = table.lease("jobs", consumer=consumer, max_messages=count)
    return [bytes(b).decode() for b in leased.column("body").to_pylist()]


def test_artemis_exclusive_queue_one_consumer_until_it_releases(tmp_path):
    table = QueueTable(str(tmp_path / "q"))
    table.declare("jobs", exclusive=True)
    table.publish("jobs", [f"m{i}" for i in range(6)])
    assert _bodies(table, "first", 2) == ["m0", "m1"]
    assert _bodies(table, "second") == []  # the first holds the queue
    table.ack("jobs", [0, 1], consumer="first")
    assert _bodies(table, "second") == []  # acks do not end the hold
    assert _bodies(table, "first", 1) == ["m2"]
    assert table.release("jobs", consumer="first") == 1
    assert _bodies(table, "second") == ["m2", "m3", "m4", "m5"]  # m2 back at its place
    assert _bodies(table, "first") == []  # now the second holds it
    stats = table.stats("jobs")
    assert (stats["acked"], stats["leased"]) == (2, 4) and identity_holds(stats)


def test_a_queue_that_is_not_exclusive_shares_its_messages(tmp_path):
    table = QueueTable(str(tmp_path / "q"))
    table.publish("jobs", [f"m{i}" for i in range(4)])
    assert _bodies(table, "first", 2) == ["m0", "m1"]
    assert _bodies(table, "second", 2) == ["m2", "m3"]


def test_exclusive_is_a_queue_argument_that_alter_can_set(tmp_path):
    table = QueueTable(str(tmp_path / "q"))
    table.publish("jobs", ["a", "b"])
    assert table.alter("jobs", exclusive="true").exclusive is True
    assert _bodies(table, "first", 1) == ["a"]
    assert _bodies(table, "second") == []


def test_a_bad_exclusive_value_names_it_and_writes_nothing(tmp_path):
    table = QueueTable(str(tmp_path / "q"))
    with pytest.raises(InvalidOptionError, match="exclusive must be true or false"):
        table.declare("jobs", exclusive="maybe")
    assert table.queues() == []


@pytest.mark.spark
def test_streaming_consumers_take_turns_on_an_exclusive_queue(spark, tmp_path):
    """Two streaming queries on one exclusive queue, with no options of their own: the
    first takes everything and keeps the queue after its acks; the second takes nothing
    until the first's name is released."""
    path = str(tmp_path / "q")
    table = QueueTable(path)
    table.declare("jobs", exclusive=True)
    table.publish("jobs", [f"m{i}" for i in range(30)])

    def consume_as(consumer: str) -> list[str]:
        out = tmp_path / f"out-{consumer}-{len(list(tmp_path.glob('out-*')))}"
        options = {"consumer": consumer, "maxMessagesPerTrigger": 10}
        consume(spark, path, out, tmp_path / f"{out.name}-checkpoint", queue="jobs", **options)
        return delivered(out)

    assert consume_as("first") == sorted(f"m{i}" for i in range(30))
    table.publish("jobs", ["late"])
    assert consume_as("second") == []
    table.release("jobs", consumer="first")
    assert consume_as("second") == ["late"]
