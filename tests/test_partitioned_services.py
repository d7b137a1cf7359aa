"""A partitioned queue through the broker's surfaces, against a real broker process: the SQS
API (a real boto3 client) shows it as one SQS queue, the Flight broker serves its clients'
calls on it, the Prometheus metrics sum its partitions, and the CLI's ``stats`` and
``peek`` give its partitions' detail on request."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import botocore.exceptions
import numpy as np
import pytest
from deltalake import DeltaTable

from spark_queue import QueueTable, cli
from spark_queue.model.partition_turns import PUBLISH_ROUNDS
from spark_queue.model.partitions import key_partition, partition_of, partition_uri
from spark_queue.rules import COUNTERS, identity_holds
from spark_queue.server.metrics import read_queues
from spark_queue.server.sqs import handles
from tests.brokers import BrokerProcess, wait_until
from tests.test_metrics import GAUGES, metrics_url, samples, scrape, value
from tests.test_sqs import client, code_of, sqs_url

PARTITIONS = 4


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("partitioned-broker")
    path = str(folder / "queues")
    QueueTable(path, broker="off").declare("parted", partitions=PARTITIONS)
    flags = ("--sqs", "127.0.0.1:0", "--metrics", "127.0.0.1:0")
    with BrokerProcess(path, *flags, log_path=folder / "broker.log") as process:
        yield process


def seq_of(handle: str) -> int:
    """The seq a receipt handle names (its payload is the queue, seq, delivery count and
    time received, one a line)."""
    payload, _ = handles.split(handle)
    return int(payload.decode().split("\n")[1])


def approximate(sqs: Any, url: str) -> tuple[int, int]:
    found = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return (
        int(found["ApproximateNumberOfMessages"]),
        int(found["ApproximateNumberOfMessagesNotVisible"]),
    )


def test_the_sqs_api_shows_a_partitioned_queue_as_one_queue(broker):
    sqs = client(sqs_url(broker))
    url = sqs.get_queue_url(QueueName="parted")["QueueUrl"]
    # Keyless: each batch of two sticks to one partition, PUBLISH_ROUNDS batches each.
    each = 2 * PUBLISH_ROUNDS
    sent = [f"m{i:03d}" for i in range(each * PARTITIONS)]
    for at in range(0, len(sent), 2):
        entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(sent[at : at + 2])]
        assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 2
    table = QueueTable(broker.path, broker="off")
    assert [s["added"] for s in table.partition_stats("parted")] == [each] * PARTITIONS
    assert approximate(sqs, url) == (len(sent), 0)  # the partitions' counts added up

    received: dict[str, str] = {}
    while len(received) < len(sent):
        answer = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)
        for message in answer.get("Messages", []):
            assert message["Body"] not in received
            received[message["Body"]] = message["ReceiptHandle"]
    assert sorted(received) == sent
    seqs = {body: seq_of(handle) for body, handle in received.items()}
    assert set(partition_of(np.array(list(seqs.values()))).tolist()) == set(range(PARTITIONS))
    assert approximate(sqs, url) == (0, len(sent))

    # A handle of the last partition's (seq above 2**62) works: visible again, then received.
    last = max(seqs, key=lambda body: seqs[body])
    assert seqs[last] >= 2**62
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=received[last], VisibilityTimeout=0)
    assert approximate(sqs, url) == (1, len(sent) - 1)
    again = sqs.receive_message(QueueUrl=url, VisibilityTimeout=60)["Messages"]
    assert [m["Body"] for m in again] == [last]
    received[last] = again[0]["ReceiptHandle"]

    bodies = sorted(received)
    for at in range(0, len(bodies), 10):
        entries = [
            {"Id": str(i), "ReceiptHandle": received[b]} for i, b in enumerate(bodies[at : at + 10])
        ]
        deleted = sqs.delete_message_batch(QueueUrl=url, Entries=entries)["Successful"]
        assert len(deleted) == len(entries)
    assert approximate(sqs, url) == (0, 0)
    stats = table.stats("parted")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (len(sent), 0, 0)
    assert [s["acked"] for s in table.partition_stats("parted")] == [each] * PARTITIONS


def test_the_broker_ends_the_last_receives_of_every_partition_when_they_run_out(broker):
    table = QueueTable(broker.path, broker="off")
    table.declare("failing", partitions=PARTITIONS, max_deliveries=1)
    keys = {key_partition(f"k{i}", PARTITIONS): f"k{i}" for i in range(40)}
    assert sorted(keys) == list(range(PARTITIONS))
    table.publish("failing", [{"body": f"poison {k}", "key": keys[k]} for k in range(PARTITIONS)])
    sqs = client(sqs_url(broker))
    url = sqs.get_queue_url(QueueName="failing")["QueueUrl"]
    received: set[int] = set()
    while len(received) < PARTITIONS:  # each one's last receive: its visibility ends in 1 s
        answer = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=1)
        seqs = [seq_of(m["ReceiptHandle"]) for m in answer.get("Messages", [])]
        received |= set(partition_of(np.array(seqs, dtype=np.int64)).tolist())
    tables = [partition_uri(broker.path, "failing", k) for k in range(PARTITIONS)]
    leased_at = [DeltaTable(uri).version() for uri in tables]
    # No call on the queue from here: the broker commits each expiry in its partition's
    # table when its timeout ends (stats alone would count it as killed without a commit).
    wait_until(
        lambda: all(DeltaTable(u).version() > v for u, v in zip(tables, leased_at, strict=True)),
        30,
        "a commit in every partition",
    )
    stats = table.partition_stats("failing")
    assert [(s["killed"], s["leased"], s["ready"]) for s in stats] == [(1, 0, 0)] * PARTITIONS


def test_sqs_cannot_declare_partitions(broker):
    sqs = client(sqs_url(broker))
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        sqs.create_queue(QueueName="by-sqs", Attributes={"partitions": "4"})
    assert code_of(refused.value) == "InvalidAttributeName"
    assert "by-sqs" not in QueueTable(broker.path, broker="off").queues()


def test_the_flight_broker_serves_a_partitioned_queue(broker):
    table = QueueTable(broker.path)  # broker="auto": finds it in the table
    assert table.router.address() == broker.address
    table.declare("flight", partitions=3)
    served = broker.status()["served"]
    keys = [f"k{i % 9}" for i in range(45)]
    result = table.publish("flight", [{"body": f"{i}", "key": k} for i, k in enumerate(keys)])
    owners = partition_of(np.array(result.seqs)).tolist()
    assert owners == [key_partition(k, 3) for k in keys]
    leased = table.lease("flight", "worker", max_messages=100)
    assert sorted(leased["body"].to_pylist()) == sorted(f"{i}".encode() for i in range(45))
    assert table.ack("flight", leased["seq"].to_pylist(), "worker") == 45
    with table.consumer("flight", "reader") as consumer:
        table.publish("flight", [{"body": "late", "key": "k1"}])
        got = consumer.receive(5, wait_time="10s")
        assert [m.body for m in got] == [b"late"]
        consumer.ack(got[0])
    stats = table.stats("flight")
    assert (stats["added"], stats["acked"], stats["ready"]) == (46, 46, 0)
    assert identity_holds(stats)
    assert broker.status()["served"] >= served + 4  # publish, lease, ack, stats at least
    direct = QueueTable(broker.path, broker="off").partition_stats("flight")
    assert [s["added"] for s in direct] == [
        Counter(owners)[k] + (k == key_partition("k1", 3)) for k in range(3)
    ]


def test_the_metrics_sum_a_partitioned_queue(broker):
    table = QueueTable(broker.path, broker="off")
    table.declare("summed", partitions=3)
    table.publish("summed", [{"body": "x", "key": f"k{i}"} for i in range(12)])
    table.lease("summed", "c", max_messages=5)
    stats = table.stats("summed")
    assert stats["added"] == 12 and stats["leased"] == 5
    reading = read_queues(table, "summed")
    assert reading is not None
    assert {k: reading.stats["summed"][k] for k in (*GAUGES, *COUNTERS)} == {
        k: stats[k] for k in (*GAUGES, *COUNTERS)
    }
    assert reading.oldest_ready_age["summed"] > 0
    found = samples(scrape(metrics_url(broker)))
    assert value(found, "spark_queue_ready", queue="summed") in (7, 0)  # 0: an older reading
    assert value(found, "spark_queue_added_total", queue="summed") in (12, 0)


def test_the_cli_gives_a_partitioned_queues_detail_on_request(tmp_path, capsys):
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=3)
    keys = [f"k{i}" for i in range(9)]
    table.publish("q", [{"body": k, "key": k} for k in keys])
    table.publish("plain", ["a"])
    capsys.readouterr()
    assert cli.main(["--path", path, "stats", "q", "--per-partition", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["queue"], r["partition"]) for r in rows] == [("q", 0), ("q", 1), ("q", 2)]
    assert [r["added"] for r in rows] == [
        Counter(key_partition(k, 3) for k in keys)[p] for p in range(3)
    ]
    assert cli.main(["--path", path, "stats", "q", "--json"]) == 0
    (whole,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert whole["added"] == 9 and "partition" not in whole
    assert cli.main(["--path", path, "stats", "--per-partition", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["queue"], r["partition"]) for r in rows][-1] == ("q", 2)
    assert ("plain", 0) in [(r["queue"], r["partition"]) for r in rows]

    assert cli.main(["--path", path, "peek", "q", "--limit", "20", "--per-partition"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["partition", "seq"]
    shown = {line.split()[-1]: int(line.split()[0]) for line in lines[1:]}
    assert shown == {k: key_partition(k, 3) for k in keys}

    assert (
        cli.main(["--path", path, "stats", "q", "--per-partition", "--format", "prometheus"]) != 0
    )
    assert "--per-partition shows --format table or json" in capsys.readouterr().err


def test_a_partitioned_queue_purged_through_the_cli_is_empty_in_every_partition(tmp_path, capsys):
    path = Path(tmp_path / "queues")
    table = QueueTable(str(path), broker="off")
    table.declare("q", partitions=3)
    table.publish("q", [{"body": "x", "key": f"k{i}"} for i in range(9)])
    assert cli.main(["--path", str(path), "purge", "q", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"queue": "q", "purged": 9}
    assert [s["ready"] for s in table.partition_stats("q")] == [0, 0, 0]
