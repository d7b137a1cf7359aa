"""Partitioned queues (docs/PARTITIONS.md): ``partitions=N`` on every surface, the layout
of partition tables under the root, Kafka's key hashing, global seqs, producers (keyed,
idempotent, sticky), consumers (fair leases, routed acks, long polls over every partition)
and the whole-queue views. Real tables on a local disk, one on the suite's S3 server."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spark_queue import QueueTable, cli
from spark_queue.errors import ArgumentMismatchError, InvalidOptionError
from spark_queue.model.partition_calls import one_partition
from spark_queue.model.partition_turns import PUBLISH_ROUNDS
from spark_queue.model.partitions import (
    ROOT_SEQ_LIMIT,
    first_seq,
    key_partition,
    murmur2,
    partition_folder,
    partition_of,
)
from spark_queue.partitioned import COUNT_SECONDS
from spark_queue.spark.options import parse_sink_options
from spark_queue.storage.table_view import TRUSTED_SECONDS

# Kafka's own test values (clients' UtilsTest.testMurmur2).
KAFKA_MURMUR2 = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


def keyed(keys: list[str], tag: str = "") -> list[dict]:
    return [{"body": f"{tag}{i}:{key}".encode(), "key": key} for i, key in enumerate(keys)]


def log_versions(path: Path) -> int:
    return len(list((path / "_delta_log").glob("*.json")))


def every_log(root: Path) -> dict[str, int]:
    """Each table's count of log entries under ``root`` (the root and its partitions)."""
    return {str(log.parent): log_versions(log.parent) for log in root.rglob("_delta_log")}


@pytest.mark.parametrize(("text", "expected"), KAFKA_MURMUR2.items())
def test_murmur2_is_kafkas(text, expected):
    assert murmur2(text.encode()) == expected


def test_a_key_lands_in_the_partition_kafka_gives_it():
    # Kafka: toPositive(murmur2(bytes)) % numPartitions
    for text, hashed in KAFKA_MURMUR2.items():
        assert key_partition(text, 7) == (hashed & 0x7FFFFFFF) % 7


def test_seqs_name_their_partition():
    seqs = np.array([0, 5, ROOT_SEQ_LIMIT - 1, first_seq(1), first_seq(2) - 1, first_seq(1023)])
    assert partition_of(seqs).tolist() == [0, 0, 0, 1, 1, 1023]
    assert first_seq(1023) + 2**52 - 1 <= 2**63 - 1


@pytest.mark.parametrize("value", [True, 1.5, 0, "x", "2.0", 1025, -1])
def test_a_bad_partition_count_is_refused_on_every_surface_and_writes_nothing(
    tmp_path, capsys, value
):
    path = tmp_path / "queues"
    with pytest.raises(InvalidOptionError, match="partitions must be a whole number from 1"):
        QueueTable(path).declare("q", partitions=value)
    with pytest.raises(InvalidOptionError, match="partitions"):
        QueueTable(path).publish("q", [b"a"], partitions=value)
    with pytest.raises(InvalidOptionError, match="partitions"):
        parse_sink_options({"path": str(path), "queue": "q", "partitions": str(value)})
    assert cli.main(["--path", str(path), "declare", "q", f"--partitions={value}"]) != 0
    assert "--partitions must be a whole number from 1 to 1024" in capsys.readouterr().err
    assert not path.exists()


def test_partitions_reach_the_cli_and_the_spark_options(tmp_path):
    path = tmp_path / "queues"
    assert cli.main(["--path", str(path), "declare", "by-flag", "--partitions=3"]) == 0
    given = parse_sink_options({"path": str(path), "queue": "q", "partitions": "3"}).arguments
    table = QueueTable(path)
    assert table.declare("by-option", **given).partitions == 3
    assert table.arguments("by-flag").partitions == 3
    assert table.queues() == ["by-flag", "by-option"]


def test_partition_tables_are_queue_tables_that_delta_rs_reads(tmp_path):
    path = tmp_path / "queues"
    table = QueueTable(path)
    table.declare("Orders.eu", partitions=3, max_length=1000)
    result = table.publish("Orders.eu", keyed([f"k{i}" for i in range(60)]))
    folder = path / partition_folder("Orders.eu")
    assert sorted(p.name for p in folder.iterdir()) == ["1", "2"]
    assert folder.parent.name == "_partitions"
    for partition in (1, 2):
        rows = DeltaTable(str(folder / str(partition))).to_pyarrow_table()
        messages = rows.filter(pa.compute.equal(rows["record"], "message"))
        seqs = np.array(messages["seq"].to_pylist())
        assert len(seqs) and (partition_of(seqs) == partition).all()
        # Each holds the one queue, with the root's arguments but partitions.
        assert QueueTable(folder / str(partition)).queues() == ["Orders.eu"]
        assert QueueTable(folder / str(partition)).arguments("Orders.eu").max_length == 1000
        assert QueueTable(folder / str(partition)).arguments("Orders.eu").partitions == 1
    root = DeltaTable(str(path)).to_pyarrow_table()
    root_seqs = [s for s in root["seq"].to_pylist() if s is not None]
    assert max(root_seqs) < ROOT_SEQ_LIMIT
    assert sorted(result.seqs) == sorted(
        set(root_seqs) & set(result.seqs) | {s for s in result.seqs if s >= ROOT_SEQ_LIMIT}
    )


def test_a_queue_without_partitions_is_stored_as_before(tmp_path):
    path = tmp_path / "queues"
    table = QueueTable(path)
    table.declare("plain")
    table.declare("one", partitions=1)
    table.publish("plain", [b"a", b"b"])
    assert not (path / "_partitions").exists()
    for name, state in table.store.snapshot().states.items():
        assert "partitions" not in json.loads(state.to_json())["arguments"], name
    assert table.arguments("plain").partitions == 1


def test_a_publish_declaring_partitions_records_them_at_the_root_wherever_its_rows_go(tmp_path):
    path = tmp_path / "queues"
    keys = [k for k in (f"k{i}" for i in range(50)) if key_partition(k, 3) == 2][:5]
    QueueTable(path).publish("q", keyed(keys), partitions=3)
    table = QueueTable(path)  # what the tables record
    assert table.arguments("q").partitions == 3
    assert [s["added"] for s in table.partition_stats("q")] == [0, 0, 5]
    assert table.lease("q", "c", max_messages=None).num_rows == 5


def test_each_key_keeps_its_partition_and_its_order(tmp_path, seed):
    rng = random.Random(seed)
    table = QueueTable(tmp_path / "queues")
    table.declare("q", partitions=4)
    keys = [f"customer-{rng.randrange(12)}" for _ in range(300)]
    for start in range(0, 300, 25):  # twelve publishes
        table.publish("q", keyed(keys[start : start + 25], tag=f"{start:03d}-"))
    leased = table.lease("q", "c", max_messages=None)
    assert leased.num_rows == 300
    order: dict[str, list[str]] = {}
    for key, seq, body in zip(
        leased["key"].to_pylist(),
        leased["seq"].to_pylist(),
        leased["body"].to_pylist(),
        strict=True,
    ):
        assert partition_of(np.array([seq]))[0] == key_partition(key, 4)
        order.setdefault(key, []).append(body.decode())
    for key, bodies in order.items():
        published = [
            f"{start:03d}-{i}:{key}"
            for start in range(0, 300, 25)
            for i, k in enumerate(keys[start : start + 25])
            if k == key
        ]
        assert bodies == published


def test_an_idempotent_producer_stays_exactly_once_across_partitions(tmp_path):
    table = QueueTable(tmp_path / "queues")
    table.declare("q", partitions=4)
    rows = keyed([f"k{i}" for i in range(20)]) + [{"body": b"keyless"}] * 5
    first = table.publish("q", rows, producer="svc", sequence=7)
    again = table.publish("q", rows, producer="svc", sequence=7)
    assert len(first.seqs) == 25 and not first.duplicate
    assert again.duplicate and again.seqs == []
    assert table.stats("q")["added"] == 25
    assert table.last_sequence("svc") == 7
    keyless = [s for s, r in zip(first.seqs, rows, strict=True) if "key" not in r]
    assert set(partition_of(np.array(keyless)).tolist()) == {key_partition("svc", 4)}


def test_keyless_publishes_are_sticky_and_take_turns(tmp_path):
    table = QueueTable(tmp_path / "queues")
    table.declare("q", partitions=3)
    used = []
    for n in range(6 * PUBLISH_ROUNDS):
        seqs = table.publish("q", [f"{n}-{i}".encode() for i in range(4)]).seqs
        owners = set(partition_of(np.array(seqs)).tolist())
        assert len(owners) == 1  # one call, one partition: one commit
        used.append(owners.pop())
    turns = used[::PUBLISH_ROUNDS]  # each partition's turn: PUBLISH_ROUNDS commits
    assert used == [p for p in turns for _ in range(PUBLISH_ROUNDS)]
    assert sorted(turns[:3]) == [0, 1, 2] and turns[3:] == turns[:3]


def test_clients_started_together_begin_at_partitions_apart(tmp_path):
    """Each ``QueueTable``'s first keyless publish and first lease start at a random
    partition: clients started together do not all begin at partition 0 and move on in
    step (the chance that 32 fresh tables' publishes, or 8 leases, all meet in one of 8
    partitions at random is below one in two million). Every partition holds messages
    before the leases, so that none moves on from an empty one: the process's publishes
    fill a partition at a time, and leases that started at empty partitions would meet in
    the next full one."""
    path = tmp_path / "queues"
    QueueTable(path).declare("q", partitions=8)
    firsts = [QueueTable(path).publish("q", [b"m"]).seqs[0] for _ in range(32)]
    assert len(set(partition_of(np.array(firsts)).tolist())) > 1
    for partition in range(8):
        with one_partition(partition):
            QueueTable(path).publish("q", [b"m"] * 8)
    leased = [QueueTable(path).lease("q", "c", max_messages=1)["seq"][0].as_py() for _ in range(8)]
    assert len(set(partition_of(np.array(leased)).tolist())) > 1


def test_a_publisher_client_spreads_keys(tmp_path):
    table = QueueTable(tmp_path / "queues")
    table.declare("q", partitions=2)
    with table.publisher("q") as publisher:
        futures = [publisher.send(f"m{i}".encode(), key=f"k{i}") for i in range(40)]
        seqs = [future.result() for future in futures]
    assert set(partition_of(np.array(seqs)).tolist()) == {0, 1}
    assert table.stats("q")["ready"] == 40


def test_calls_with_seqs_go_to_their_partitions(tmp_path):
    table = QueueTable(tmp_path / "queues")
    table.declare("q", partitions=3)
    table.publish("q", keyed([f"k{i}" for i in range(30)]))
    leased = table.lease("q", "c", max_messages=None, lease_period="1 minute")
    seqs = leased["seq"].to_pylist()
    assert len(set(partition_of(np.array(seqs)).tolist())) == 3
    assert table.extend("q", seqs, "c", "5 minutes") == 30
    assert table.cancel("q", seqs[:10], delay=0) == 10
    assert table.ack("q", seqs[10:20], "c") == 10
    assert table.release("q", consumer="c") == 10
    assert table.ack("q", [first_seq(7)]) == 0  # a partition the queue does not have
    stats = table.stats("q")
    assert (stats["acked"], stats["ready"], stats["leased"]) == (10, 20, 0)


def test_whole_queue_views(tmp_path):
    table = QueueTable(tmp_path / "queues")
    table.declare("q", partitions=3)
    table.declare("other")
    table.publish("q", keyed([f"k{i}" for i in range(30)]))
    table.lease("q", "c", max_messages=4)
    parts = table.partition_stats("q")
    assert len(parts) == 3 and all(p["added"] for p in parts)
    stats = table.stats("q")
    assert stats["added"] == 30 == sum(p["added"] for p in parts)
    assert (stats["ready"], stats["leased"], stats["leased_by_consumer"]) == (26, 4, {"c": 4})
    peeked = table.peek("q", 50)
    assert peeked.num_rows == 26 and len(set(peeked["seq"].to_pylist())) == 26
    assert table.peek("q", 5).num_rows == 5
    assert table.queues() == ["other", "q"]
    assert table.purge("q") == 26
    assert table.stats("q")["purged"] == 26
    assert cli.main(["--path", table.path, "stats", "q"]) == 0


def test_raising_the_count_then_publishing_uses_the_new_partitions(tmp_path):
    path = tmp_path / "queues"
    table = QueueTable(path)
    table.declare("q", partitions=2)
    table.publish("q", keyed([f"k{i}" for i in range(20)]))
    assert table.alter("q", partitions=4).partitions == 4
    assert len(list((path / partition_folder("q")).iterdir())) == 3
    seqs = table.publish("q", keyed([f"k{i}" for i in range(40)])).seqs
    assert set(partition_of(np.array(seqs)).tolist()) == {0, 1, 2, 3}
    assert table.stats("q")["ready"] == 60
    with pytest.raises(ArgumentMismatchError, match="partitions"):
        table.declare("q", partitions=2)


def test_lowering_the_count_is_refused_and_writes_nothing(tmp_path):
    path = tmp_path / "queues"
    table = QueueTable(path)
    table.declare("q", partitions=3)
    before = every_log(path)
    with pytest.raises(InvalidOptionError, match=r"partitions=3.*never lowered"):
        table.alter("q", partitions=2)
    assert cli.main(["--path", str(path), "alter", "q", "--partitions=1"]) != 0
    assert every_log(path) == before


def test_a_partitioned_queue_takes_no_dead_letter_queue(tmp_path):
    path = tmp_path / "queues"
    with pytest.raises(InvalidOptionError, match=r"partitions=2.*dead_letter_queue"):
        QueueTable(path).declare("q", partitions=2, dead_letter_queue="dlq")
    assert not path.exists()


def test_a_consumer_receives_from_every_partition(tmp_path):
    table = QueueTable(tmp_path / "queues")
    table.declare("q", partitions=4)
    table.publish("q", keyed([f"k{i}" for i in range(50)]))
    with table.consumer("q", "c") as consumer:
        got = []
        while len(got) < 50:
            batch = consumer.receive(10, wait_time="5s")
            assert batch
            for message in batch:
                message.ack()
            got += batch
    assert len({m.seq for m in got}) == 50
    assert table.stats("q")["acked"] == 50


# Another process publishes to partition 3's key: a consumer idle on the queue, whose
# table cached every partition, must see it.
ELSEWHERE = """
import sys
from spark_queue import QueueTable
QueueTable(sys.argv[1], broker="off").publish("q", [{"body": b"late", "key": sys.argv[2]}])
"""


def test_an_idle_consumer_wakes_for_another_process_publish_to_any_partition(tmp_path):
    path = tmp_path / "queues"
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=4)
    key = next(f"k{i}" for i in range(100) if key_partition(f"k{i}", 4) == 3)
    with table.consumer("q", "c", idle_lease_interval="1 hour") as consumer:
        assert consumer.receive(1, wait_time="200ms") == []
        time.sleep(0.5)  # idle, long past its first log checks
        subprocess.run([sys.executable, "-c", ELSEWHERE, str(path), key], check=True)
        got = consumer.receive(1, wait_time="10s")
        assert [m.body for m in got] == [b"late"]
        assert partition_of(np.array([got[0].seq]))[0] == 3


RAISE_ELSEWHERE = """
import sys
from spark_queue import QueueTable
table = QueueTable(sys.argv[1], broker="off")
table.alter("q", partitions=3)
table.publish("q", [{"body": b"new", "key": sys.argv[2]}])
"""


def test_a_table_idle_while_another_process_raised_the_count_reaches_the_present(tmp_path):
    path = tmp_path / "queues"
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=2)
    assert table.lease("q", "c").num_rows == 0  # the count is cached
    key = next(f"k{i}" for i in range(100) if key_partition(f"k{i}", 3) == 2)
    subprocess.run([sys.executable, "-c", RAISE_ELSEWHERE, str(path), key], check=True)
    time.sleep(COUNT_SECONDS + TRUSTED_SECONDS + 0.1)  # past the count's and the view's trust
    assert table.lease("q", "c")["body"].to_pylist() == [b"new"]
    assert len(table.partition_stats("q")) == 3


def test_a_partitioned_queue_on_s3(s3_table, s3_options):
    table = QueueTable(s3_table, storage_options=s3_options, broker="off")
    table.declare("q", partitions=2)
    seqs = table.publish("q", keyed([f"k{i}" for i in range(20)])).seqs
    assert set(partition_of(np.array(seqs)).tolist()) == {0, 1}
    leased = table.lease("q", "c", max_messages=None)
    assert leased.num_rows == 20
    assert table.ack("q", leased["seq"]) == 20
    assert [p["acked"] for p in table.partition_stats("q")] == [
        sum(1 for s in seqs if s < ROOT_SEQ_LIMIT),
        sum(1 for s in seqs if s >= ROOT_SEQ_LIMIT),
    ]
    uri = f"{s3_table}/{partition_folder('q')}/1"
    rows = DeltaTable(uri, storage_options=s3_options).to_pyarrow_table()
    assert rows.num_rows


def test_a_table_whose_seqs_are_used_up_refuses_the_commit_and_writes_nothing(tmp_path):
    """A root's seqs stay below ROOT_SEQ_LIMIT, a partition's in its own block: past it a
    seq would name another partition, so the commit is refused and nothing is written."""
    from spark_queue.commit.transaction import run
    from spark_queue.errors import QueueError
    from spark_queue.model.partitions import (
        ROOT_SEQ_LIMIT,
        check_seqs_left,
        first_seq,
        partition_path,
        table_partition,
    )
    from spark_queue.storage.commit_log import CommitOperation

    table = QueueTable(tmp_path / "queues")

    def near_the_end(transaction):
        transaction.next_seq = ROOT_SEQ_LIMIT - 1
        transaction.declare("q", {})
        transaction.commit(operation=CommitOperation.DECLARE.on("q"))

    run(table.store, near_the_end)
    assert table.publish("q", ["last"]).seqs == [ROOT_SEQ_LIMIT - 1]
    version = DeltaTable(str(tmp_path / "queues")).version()
    with pytest.raises(QueueError, match="used its seqs up"):
        table.publish("q", ["one too many"])
    assert DeltaTable(str(tmp_path / "queues")).version() == version

    # A partition table's block ends where the next partition's begins.
    check_seqs_left("t", 1, first_seq(2) - 1)
    with pytest.raises(QueueError, match="partition 1's seqs end below"):
        check_seqs_left("t", 1, first_seq(2))
    assert table_partition(str(tmp_path / "queues" / partition_path("p", 3))) == 3
    assert table_partition(str(tmp_path / "queues")) == 0


def test_an_ack_of_one_partitions_seqs_sends_nothing_to_the_root(
    proxied_s3_table, proxied_s3_options, s3_options, round_trips, latency_proxy
):
    """The count a client knows covers the seqs' partitions: an ack of partition 1's
    messages is that table's commit alone, while another writer commits to the root; the
    root is read again only for a seq past the count known (a count raised elsewhere)."""
    table = QueueTable(proxied_s3_table, storage_options=proxied_s3_options, broker="off")
    table.declare("q", partitions=2)
    keys = [next(f"k{i}" for i in range(100) if key_partition(f"k{i}", 2) == k) for k in (0, 1)]
    table.publish("q", keyed([keys[1]] * 3))
    seqs = table.lease("q", "c", max_messages=3)["seq"].to_pylist()
    other = QueueTable(proxied_s3_table, storage_options=s3_options, broker="off")
    other.publish("q", keyed([keys[0]]))  # the root moves on
    where = urlsplit(proxied_s3_table)
    latency_proxy.quiet(where.netloc, 0.2)
    with round_trips() as trips:
        assert table.ack("q", seqs, "c") == 3
    root_log = f"/{where.netloc}{where.path}/_delta_log/"
    assert not [r for r in trips.requests if r.target.startswith(root_log)], trips
