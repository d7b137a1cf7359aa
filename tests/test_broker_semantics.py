"""Every queue semantic is the same through a broker: each test runs twice, on a
``QueueTable`` that commits directly and on one whose calls a real ``spark-queue broker``
process runs, with the same assertions. One table and one broker serve the whole module;
each test uses queues of its own (``q``, a prefix unique to the test and the variant).

Taken from the direct tests of each feature (test_publish, test_queue_limits, test_groups,
test_exclusive, test_duplicates, test_extend, test_backoff, test_many_clients)."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterator
from datetime import datetime, timezone

import pandas as pd
import pyarrow as pa
import pytest

from spark_queue import (
    ArgumentMismatchError,
    InvalidInputError,
    InvalidOptionError,
    QueueNotFoundError,
    QueueTable,
    RejectedMessagesError,
)
from spark_queue.rules import identity_holds
from tests.brokers import BrokerProcess


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BrokerProcess]]:
    folder = tmp_path_factory.mktemp("broker-semantics")
    path = str(folder / "queues")
    with BrokerProcess(path, log_path=folder / "broker.log") as broker:
        yield path, broker
        assert broker.stop() == 0
    assert "Traceback" not in broker.output()


@pytest.fixture(params=["direct", "broker"])
def table(request: pytest.FixtureRequest, shared) -> Iterator[QueueTable]:
    """The module's table, committed to directly or through the broker; through the broker,
    the test must have sent it requests (none ran here by a fallback), unless every call it
    makes is refused before it is sent."""
    path, broker = shared
    if request.param == "direct":
        yield QueueTable(path, broker="off")
        return
    before = broker.status()
    yield QueueTable(path, broker=broker.address)
    after = broker.status()
    case = getattr(request.node, "callspec", None) and request.node.callspec.params.get("case")
    if case not in REFUSED_BEFORE_SENDING:
        assert after["served"] + after["refused"] > before["served"] + before["refused"]
    assert after["failed"] == 0


@pytest.fixture
def q(request: pytest.FixtureRequest) -> str:
    """A queue-name prefix of this test and variant alone."""
    return f"t{zlib.crc32(request.node.nodeid.encode()):08x}"


def bodies(leased: pa.Table) -> list[str]:
    return [bytes(b).decode() for b in leased["body"].to_pylist()]


def lease_bodies(table: QueueTable, queue: str, consumer: str, count: int = 10) -> list[str]:
    return bodies(table.lease(queue, consumer, max_messages=count))


def test_every_kind_of_rows_and_their_columns(table, q):
    due = datetime(2020, 1, 1, tzinfo=timezone.utc)
    for kind in (
        pa.table({"body": ["a", "b"]}),
        pa.RecordBatch.from_pydict({"body": [b"a", b"b"]}),
        pd.DataFrame({"body": ["a", "b"]}),
        [{"body": "a"}, {"body": b"b"}],
        [b"a", b"b"],
        ["a", "b"],
    ):
        result = table.publish(f"{q}.kinds", kind)
        assert (len(result.seqs), result.rejected, result.duplicate) == (2, 0, False)
    table.publish(
        f"{q}.columns",
        [
            {"body": "low", "message_id": "m1", "key": "k", "headers": {"h": "v"}},
            {"body": "high", "priority": 9, "expires_at": datetime(2999, 1, 1)},
            {"body": "due", "deliver_at": due},
        ],
    )
    rows = table.lease(f"{q}.columns", "c").to_pylist()
    assert [bytes(r["body"]).decode() for r in rows] == ["high", "low", "due"]
    low = rows[1]
    assert (low["message_id"], low["key"], dict(low["headers"])) == ("m1", "k", {"h": "v"})
    assert rows[0]["expires_at"] == datetime(2999, 1, 1, tzinfo=timezone.utc)
    assert table.stats(f"{q}.kinds")["added"] == 12


def test_limits_overflow_and_dead_letters(table, q):
    table.publish(f"{q}.ring", ["a", "b", "c"], ring_size=2)
    evicting = table.publish(f"{q}.ring", ["d"], ring_size=2)
    assert (len(evicting.seqs), evicting.evicted, evicting.dead_lettered) == (1, 1, 0)
    assert lease_bodies(table, f"{q}.ring", "c") == ["c", "d"]
    table.publish(f"{q}.capped", ["a"], max_length=1, dead_letter_queue=f"{q}.dlq")
    dropping = table.publish(f"{q}.capped", ["b"], max_length=1, dead_letter_queue=f"{q}.dlq")
    assert (dropping.evicted, dropping.dead_lettered) == (1, 1)
    assert lease_bodies(table, f"{q}.dlq", "c") == ["a"]
    table.publish(f"{q}.full", ["a"], max_length=1, overflow="reject-publish")
    refused = table.publish(f"{q}.full", ["b", "c"], max_length=1, overflow="reject-publish")
    assert (refused.seqs, refused.rejected) == ([], 2)
    with pytest.raises(RejectedMessagesError):
        table.publish(f"{q}.full", ["x"], on_reject="fail")
    table.publish(f"{q}.bytes", ["aaaa"], max_length_bytes=6)
    assert table.publish(f"{q}.bytes", ["bbbb"]).evicted == 1
    for name in ("ring", "capped", "dlq", "full", "bytes"):
        assert identity_holds(table.stats(f"{q}.{name}"))


def test_idempotent_publish_and_the_duplicate_window(table, q):
    first = table.publish(f"{q}.o", ["a"], producer=f"{q}-billing", sequence=7)
    again = table.publish(f"{q}.o", ["a"], producer=f"{q}-billing", sequence=7)
    assert (first.duplicate, again.duplicate, again.seqs) == (False, True, [])
    assert table.last_sequence(f"{q}-billing") == 7
    with pytest.raises(InvalidInputError, match="sequence 6 is lower than 7"):
        table.publish(f"{q}.o", ["a"], producer=f"{q}-billing", sequence=6)
    table.declare(f"{q}.d", duplicate_window="2 minutes")
    ids = pa.table({"body": ["x", "y", "z"], "message_id": ["1", "2", "1"]})
    assert table.publish(f"{q}.d", ids).duplicates == 1
    repeated = table.publish(f"{q}.d", pa.table({"body": ["w"], "message_id": ["2"]}))
    assert (repeated.duplicates, repeated.seqs) == (1, [])
    stats = table.stats(f"{q}.d")
    assert (stats["added"], stats["duplicates"]) == (2, 2) and identity_holds(stats)


def test_leases_acks_cancels_releases_and_extensions(table, q):
    name = f"{q}.jobs"
    table.publish(name, [f"m{i}" for i in range(6)])
    mine = table.lease(name, "fast", max_messages=3, lease_period="1 minute")
    seqs = mine["seq"].to_pylist()
    assert mine["delivery_count"].to_pylist() == [1, 1, 1]
    assert table.extend(name, [*seqs, 999], "fast", "10 minutes") == 3
    assert table.extend(name, seqs, "other", "10 minutes") == 0
    assert table.ack(name, seqs[:1], "fast") == 1
    assert table.ack(name, seqs[:1], "fast") == 0  # acked before
    assert table.cancel(name, seqs[1:2], "fast") == 1
    assert table.release(name, consumer="fast") == 1
    again = table.lease(name, "slow", max_messages=2)
    assert again["delivery_count"].to_pylist() == [2, 2]  # returned, counted
    assert table.cancel(name, again["seq"].to_pylist()[:1], "slow", delay="1 hour") == 1
    assert table.expire(name, again["seq"].to_pylist()[1:], "slow") == 1
    stats = table.stats(name)
    assert (stats["acked"], stats["expired"], stats["scheduled"], stats["ready"]) == (1, 1, 1, 3)
    assert identity_holds(stats)


def test_a_lease_that_runs_out_is_delivered_again_and_delivery_limits_kill(table, q):
    name = f"{q}.poison"
    table.declare(name, max_deliveries=2, dead_letter_queue=f"{q}.dlq")
    table.publish(name, ["poison"])
    counts = []
    for _ in range(3):
        leased = table.lease(name, "w", max_messages=1, lease_period=1)  # runs out in 1 ms
        counts += leased["delivery_count"].to_pylist()
    assert counts == [1, 2]  # the third lease found it out of deliveries: killed
    stats = table.stats(name)
    assert (stats["killed"], stats["dead_lettered"]) == (1, 1)
    assert table.lease(f"{q}.dlq", "w")["death_reason"].to_pylist() == ["delivery_limit"]
    table.declare(f"{q}.cancels", max_cancels=1)
    table.publish(f"{q}.cancels", ["m"])
    seqs = table.lease(f"{q}.cancels", "w")["seq"].to_pylist()
    table.cancel(f"{q}.cancels", seqs, "w")
    assert table.stats(f"{q}.cancels")["killed"] == 1


def test_message_groups_and_exclusive_queues(table, q):
    groups = f"{q}.groups"
    table.declare(groups, message_groups=True)
    table.publish(groups, pa.table({"key": ["A", "A", "B", "B"], "body": ["A1", "A2", "B1", "B2"]}))
    first = table.lease(groups, "c1", max_messages=1)
    assert bodies(first) == ["A1"]
    assert lease_bodies(table, groups, "c2") == ["B1", "B2"]
    assert lease_bodies(table, groups, "c3") == []  # both groups held
    assert table.stats(groups)["groups_by_consumer"] == {"c1": 1, "c2": 1}
    table.ack(groups, first["seq"].to_pylist(), "c1")
    assert lease_bodies(table, groups, "c3") == ["A2"]
    exclusive = f"{q}.exclusive"
    table.declare(exclusive, exclusive=True)
    table.publish(exclusive, [f"m{i}" for i in range(4)])
    assert lease_bodies(table, exclusive, "first", 2) == ["m0", "m1"]
    assert lease_bodies(table, exclusive, "second") == []
    assert table.release(exclusive, consumer="first") == 2
    assert lease_bodies(table, exclusive, "second") == ["m0", "m1", "m2", "m3"]


def test_filters_priorities_and_byte_bounds(table, q):
    name = f"{q}.f"
    table.publish(
        name,
        pa.table({"body": ["low", "high", "mid"], "priority": pa.array([0, 5, 2], pa.int32())}),
    )
    assert bodies(table.lease(name, "c", max_messages=10, max_bytes=1)) == ["high"]
    assert bodies(table.lease(name, "c", filter="priority < 2")) == ["low"]
    assert bodies(table.lease(name, "c")) == ["mid"]


def test_threads_of_one_table_publish_lease_and_ack_at_once(table, q):
    """One ``QueueTable`` (one router, one Flight client) used by 4 threads at once."""
    name = f"{q}.shared"
    table.declare(name, ring_size=100)
    errors: list[BaseException] = []
    go = threading.Barrier(4)

    def client(number: int) -> None:
        try:
            go.wait()
            for batch in range(3):
                table.publish(name, [f"t{number}-b{batch}-m{i}" for i in range(4)])
                leased = table.lease(name, f"c{number}", max_messages=2)
                table.ack(name, leased["seq"].to_pylist(), f"c{number}")
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = table.stats(name)
    assert (stats["added"], stats["acked"], stats["ready"]) == (48, 24, 24)
    assert identity_holds(stats)


BAD_CALLS = {  # a call on a table that has the queue "<q>.orders" (max_length 5)
    "unknown-queue": lambda t, q: t.stats(f"{q}.nope"),
    "ack-unknown-queue": lambda t, q: t.ack(f"{q}.nope", [1]),
    "mismatch": lambda t, q: t.publish(f"{q}.orders", ["x"], max_length=6),
    "bad-argument": lambda t, q: t.publish(f"{q}.orders", ["x"], overflow="sideways"),
    "unknown-argument": lambda t, q: t.publish(f"{q}.orders", ["x"], maxlen=3),
    "bad-rows": lambda t, q: t.publish(f"{q}.orders", [{"text": "x"}]),
    "bad-queue-name": lambda t, q: t.publish("no such queue", ["x"]),
    "bad-sequence": lambda t, q: t.publish(f"{q}.orders", ["x"], producer="p"),
    "bad-period": lambda t, q: t.extend(f"{q}.orders", [0], "c", 0),
    "bad-consumer": lambda t, q: t.lease(f"{q}.orders", ""),
    "bad-limit": lambda t, q: t.lease(f"{q}.orders", "c", max_messages=-1),
    "bad-delay": lambda t, q: t.cancel(f"{q}.orders", [0], delay="soon"),
    "bad-filter": lambda t, q: t.lease(f"{q}.orders", "c", filter="no_such_column = 1"),
    "bad-seqs": lambda t, q: t.ack(f"{q}.orders", ["first"]),
    "release-unknown": lambda t, q: t.release(f"{q}.nope", consumer="c"),
}


# Values a request cannot carry as given: the call runs here, where the table refuses it.
REFUSED_BEFORE_SENDING = {"bad-rows", "bad-queue-name", "bad-seqs"}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_errors_have_the_same_class_and_message(table, q, shared, case):
    """The table's error, raised where it runs, reaches the caller as itself; nothing is
    committed."""
    path, _ = shared
    direct = QueueTable(path, broker="off")
    direct.declare(f"{q}.orders", max_length=5)
    before = direct.store.open().version()
    with pytest.raises(Exception) as expected:
        BAD_CALLS[case](direct, q)
    with pytest.raises(Exception) as got:
        BAD_CALLS[case](table, q)
    assert type(got.value) is type(expected.value)
    assert str(got.value) == str(expected.value)
    assert direct.store.open().version() == before
    if case.endswith("unknown-queue") or case == "release-unknown":
        assert isinstance(got.value, QueueNotFoundError) and got.value.queue == f"{q}.nope"
    if case == "mismatch":
        assert isinstance(got.value, ArgumentMismatchError)
    if case in ("bad-argument", "bad-consumer", "bad-limit"):
        assert isinstance(got.value, InvalidOptionError)


def test_the_publisher_and_consumer_clients(table, q, shared):
    """The service clients: the publisher's batches answer each message (its seq, or None
    where a reject policy refused it or its id was a duplicate), the consumer's leases and
    batched acks."""
    table.declare(f"{q}.small", max_length=3, overflow="reject-publish")
    served = shared[1].status()["served"]
    with table.publisher(f"{q}.small", linger="1h", max_batch=5) as publisher:
        futures = [publisher.send(f"s{i}") for i in range(5)]
    through_broker = table.router.mode != "off"
    assert shared[1].status()["served"] == served + through_broker  # its one batch
    seqs = [f.result(timeout=0) for f in futures]
    assert seqs[3:] == [None, None] and seqs[:3] == sorted(seqs[:3])
    assert table.peek(f"{q}.small", 10)["seq"].to_pylist() == seqs[:3]
    table.declare(f"{q}.ids", duplicate_window="2 minutes")
    with table.publisher(f"{q}.ids", linger="1h", max_batch=3) as publisher:
        sent = [("a", "1"), ("b", "1"), ("c", "2")]
        futures = [publisher.send(body, message_id=id) for body, id in sent]
    seqs = [f.result(timeout=0) for f in futures]
    assert seqs[1] is None and table.peek(f"{q}.ids", 10)["seq"].to_pylist() == seqs[::2]

    received: list[str] = []
    with table.consumer(f"{q}.small", "w", max_prefetch=2) as consumer:
        while len(received) < 3:
            for message in consumer.receive(max_messages=3, wait_time="30s"):
                received.append(bytes(message.body).decode())
                consumer.ack(message)
    assert received == ["s0", "s1", "s2"]
    stats = table.stats(f"{q}.small")
    assert (stats["acked"], stats["rejected"], stats["ready"]) == (3, 2, 0)
    assert identity_holds(stats)
