"""Message groups: a queue argument ``message_groups`` makes the messages of one
``key`` a group, leased to one consumer at a time and in order, while other groups are
consumed in parallel: Artemis message grouping (``JMSXGroupID``), SQS FIFO
``MessageGroupId``. Tests follow their documented examples; the streaming test runs two
competing queries over 1,000 groups and checks every table version."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable

from spark_queue import InvalidOptionError, QueueTable
from spark_queue.rules import identity_holds
from spark_queue.storage.store import QueueStore
from tests.clock import wait_past
from tests.helpers import finish, start_consuming


def _publish(table: QueueTable, queue: str, keyed: list[tuple[str | None, str]]) -> None:
    table.publish(
        queue,
        pa.table(
            {
                "key": pa.array([k for k, _ in keyed], pa.string()),
                "body": pa.array([b for _, b in keyed], pa.string()),
            }
        ),
    )


def _bodies(leased: pa.Table) -> list[str]:
    return [bytes(b).decode() for b in leased.column("body").to_pylist()]


def test_sqs_fifo_a_group_in_flight_is_not_received_by_another_consumer(tmp_path):
    """SQS FIFO: while a message of a group is in flight, no other consumer receives
    messages of that group; the next one is available once it is deleted."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare("orders", message_groups=True)
    _publish(table, "orders", [("A", "A1"), ("A", "A2"), ("B", "B1"), ("B", "B2")])
    first = table.lease("orders", "c1", max_messages=1)
    assert _bodies(first) == ["A1"]
    assert _bodies(table.lease("orders", "c2", max_messages=10)) == ["B1", "B2"]
    assert _bodies(table.lease("orders", "c3", max_messages=10)) == []  # both held
    stats = table.stats("orders")
    assert stats["groups_by_consumer"] == {"c1": 1, "c2": 1}
    assert identity_holds(stats)
    table.ack("orders", first["seq"].to_pylist(), "c1")
    assert _bodies(table.lease("orders", "c3", max_messages=10)) == ["A2"]


def test_artemis_grouping_the_holder_gets_the_rest_of_its_group_in_order(tmp_path):
    """Artemis: messages of one group go to the consumer that has the group; other groups
    are spread over other consumers."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare("trades", message_groups=True)
    _publish(table, "trades", [("IBM", "i1"), ("MSFT", "m1"), ("IBM", "i2"), ("MSFT", "m2")])
    assert _bodies(table.lease("trades", "c1", max_messages=1)) == ["i1"]
    assert _bodies(table.lease("trades", "c2", max_messages=10)) == ["m1", "m2"]
    assert _bodies(table.lease("trades", "c1", max_messages=10)) == ["i2"]
    assert table.stats("trades")["groups_by_consumer"] == {"c1": 1, "c2": 1}


def test_messages_without_a_key_are_in_no_group(tmp_path):
    table = QueueTable(str(tmp_path / "q"))
    table.declare("q", message_groups=True)
    _publish(table, "q", [(None, "x"), ("A", "a1"), (None, "y"), ("A", "a2")])
    assert _bodies(table.lease("q", "c1", max_messages=2)) == ["x", "a1"]
    assert _bodies(table.lease("q", "c2", max_messages=10)) == ["y"]


@pytest.mark.parametrize("ending", ["ack", "cancel", "lease runs out", "release"])
def test_a_group_is_free_again_when_its_leases_end(tmp_path, ending):
    table = QueueTable(str(tmp_path / "q"))
    table.declare("q", message_groups=True)
    _publish(table, "q", [("A", "a1"), ("A", "a2")])
    # A lease of minutes: still held at the check below however slow the machine; for
    # "lease runs out" it is then made to run out now (extend: ``period`` from now).
    period = "10 minutes" if ending == "lease runs out" else None
    seqs = table.lease("q", "c1", max_messages=1, lease_period=period)["seq"].to_pylist()
    assert _bodies(table.lease("q", "c2")) == []
    if ending == "ack":
        table.ack("q", seqs, "c1")
        expected = ["a2"]
    elif ending == "cancel":
        table.cancel("q", seqs, "c1")
        expected = ["a1", "a2"]
    elif ending == "release":
        table.release("q", consumer="c1")
        expected = ["a1", "a2"]
    else:
        assert table.extend("q", seqs, "c1", 1) == 1
        wait_past(int(QueueStore(table.path).snapshot().states["q"].leases.until[0]))
        expected = ["a1", "a2"]
    assert _bodies(table.lease("q", "c2")) == expected


def test_a_group_waits_with_its_message_that_waits_out_a_redelivery_delay(tmp_path):
    """SQS FIFO keeps a group blocked while its failed message is invisible; here the
    returned message waits out the queue's backoff, and its group waits with it, so the
    group's order holds.

    That the group waits is checked on a queue whose backoff is minutes (so the wait cannot
    end before the check, however slow the machine); that it comes back in order, on one
    whose backoff is 300 ms, waited out by the clock."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare("slow", message_groups=True, redelivery_delay="10 minutes")
    table.declare("fast", message_groups=True, redelivery_delay=300)
    for queue in ("slow", "fast"):
        _publish(table, queue, [("A", "a1"), ("A", "a2"), ("B", "b1")])
        seqs = table.lease(queue, "c1", max_messages=1)["seq"].to_pylist()
        table.cancel(queue, seqs, "c1")
    assert _bodies(table.lease("slow", "c2")) == ["b1"]  # not a2: a1 comes first
    stats = table.stats("slow")
    assert (stats["scheduled"], stats["ready"], stats["leased"]) == (1, 1, 1)
    wait_past(int(QueueStore(table.path).snapshot().states["fast"].scheduled.deliver_at[0]))
    assert _bodies(table.lease("fast", "c3")) == ["a1", "a2", "b1"]


def test_groups_are_kept_across_table_objects_and_policies(tmp_path):
    """The lease index stores each lease's group: another process (a new table object)
    sees the group held."""
    policies = tmp_path / "policies.toml"
    policies.write_text('[policy.fifo]\nmatch = "*.fifo"\ndefault-message-groups = true\n')
    from spark_queue.model.policies import load_policies

    table = QueueTable(str(tmp_path / "q"), policies=load_policies(str(policies)))
    table.declare("orders.fifo")
    assert table.arguments("orders.fifo").message_groups
    _publish(table, "orders.fifo", [("A", "a1"), ("A", "a2")])
    table.lease("orders.fifo", "c1", max_messages=1)
    other = QueueTable(str(tmp_path / "q"))
    assert _bodies(other.lease("orders.fifo", "c2")) == []
    rows = DeltaTable(str(tmp_path / "q")).to_pyarrow_table(
        filters=[("record", "=", "lease")], columns=["key", "consumer"]
    )
    assert rows.to_pylist() == [{"key": "A", "consumer": "c1"}]


def test_a_bad_message_groups_value_names_the_option_and_writes_nothing(tmp_path):
    table = QueueTable(str(tmp_path / "q"))
    table.declare("other")
    version = DeltaTable(table.path).version()
    with pytest.raises(InvalidOptionError, match="message_groups must be true or false"):
        table.declare("q", message_groups="maybe")
    assert DeltaTable(table.path).version() == version


def test_the_sink_rejects_a_bad_message_groups_option(spark, tmp_path):
    df = spark.createDataFrame([("A", "a1")], "key string, body string")
    with pytest.raises(Exception, match="messageGroups must be true or false"):
        df.write.format("ringqueue").mode("append").option("queue", "q").option(
            "messageGroups", "maybe"
        ).save(str(tmp_path / "q"))
    assert not (tmp_path / "q" / "_delta_log").exists()


def test_two_competing_streaming_consumers_keep_every_group_in_order(spark, tmp_path: Path):
    """1,000 groups, 4 messages each, interleaved; two streaming queries consume at once.
    Every table version's lease index holds each group for at most one consumer, and every
    group is leased in seq order; each message is delivered once."""
    path = str(tmp_path / "q")
    groups, per_group = 1000, 4
    rows = [(f"g{i % groups}", f"m{i}") for i in range(groups * per_group)]
    df = spark.createDataFrame(rows, "key string, body string").coalesce(1)
    df.write.format("ringqueue").mode("append").option("queue", "q").option(
        "messageGroups", "true"
    ).save(path)
    # Each query gets a share by construction, not by the scheduler's favour: first each
    # consumer name holds the head of a group of its own (as a query that died would). The
    # other query cannot lease that group, and a new query under the name returns what the
    # name held and leases from the head in its first commit: it delivers that group.
    table = QueueTable(path)
    assert _bodies(table.lease("q", "right", max_messages=1)) == ["m0"]
    assert _bodies(table.lease("q", "left", max_messages=1)) == ["m1"]
    version_before = DeltaTable(path).version()

    # Both run at once; started from this thread, one after the other (two threads starting
    # Python-source queries on a fresh session at once failed a task now and then with
    # java.io.OptionalDataException).
    queries = [
        start_consuming(
            spark,
            path,
            tmp_path / f"{name}-out",
            tmp_path / f"{name}-checkpoint",
            columns=("seq", "key", "consumer"),
            consumer=name,
            maxMessagesPerTrigger=300,
        )
        for name in ("left", "right")
    ]
    for query in queries:
        finish(query)

    out = {
        n: spark.read.format("delta").load(str(tmp_path / f"{n}-out")) for n in ("left", "right")
    }
    delivered = out["left"].unionByName(out["right"])
    assert delivered.count() == groups * per_group
    assert delivered.select("seq").distinct().count() == groups * per_group
    assert out["left"].count() > 0 and out["right"].count() > 0  # as constructed above

    first_leased: dict[int, int] = {}
    for version in range(version_before + 1, DeltaTable(path).version() + 1):
        leases = DeltaTable(path, version=version).to_pyarrow_table(
            filters=[("record", "=", "lease")], columns=["seq", "key", "consumer"]
        )
        holders: dict[str, set[str]] = {}
        for lease in leases.to_pylist():
            holders.setdefault(lease["key"], set()).add(lease["consumer"])
            first_leased.setdefault(lease["seq"], version)
        assert all(len(h) == 1 for h in holders.values()), version
    by_group: dict[str, list[tuple[int, int]]] = {}
    keys = dict(delivered.select("seq", "key").rdd.map(tuple).collect())
    for seq, version in first_leased.items():
        by_group.setdefault(keys[seq], []).append((version, seq))
    for leased in by_group.values():
        in_lease_order = [seq for _, seq in sorted(leased)]
        assert in_lease_order == sorted(in_lease_order)
    assert len(first_leased) == groups * per_group

    expected = spark.createDataFrame(
        [(f"g{i}", per_group) for i in range(groups)], "key string, count long"
    )
    assert_df_equality(
        delivered.groupBy("key").count(),
        expected,
        ignore_row_order=True,
        ignore_nullable=True,
    )
