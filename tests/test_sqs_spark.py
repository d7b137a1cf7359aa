"""Spark and SQS clients on one queue: what the SQS API is for (docs/SQS.md)."""

from __future__ import annotations

from collections import Counter

import pytest

from spark_queue import QueueTable
from tests.brokers import BrokerProcess
from tests.helpers import consume, delivered, write_stream
from tests.test_sqs import client, sqs_url

pytestmark = pytest.mark.spark


def test_spark_writes_and_boto3_receives_and_deletes_each_message_once(spark, queue_path, tmp_path):
    bodies = [f"event-{i}" for i in range(25)]
    frame = spark.createDataFrame([(b,) for b in bodies], "body string").coalesce(1)
    write_stream(spark, frame, queue_path, tmp_path, queue="events")
    with BrokerProcess(
        queue_path, "--sqs", "127.0.0.1:0", log_path=tmp_path / "broker.log"
    ) as broker:
        c = client(sqs_url(broker))
        url = c.get_queue_url(QueueName="events")["QueueUrl"]
        received: list[str] = []
        while True:
            got = c.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
            if not got:
                break
            received.extend(m["Body"] for m in got)
            answer = c.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                         for i, m in enumerate(got)],
            )  # fmt: skip
            assert not answer["Failed"]
    assert received == bodies  # once each, in the order Spark wrote them
    stats = QueueTable(queue_path).stats("events")
    assert (stats["acked"], stats["ready"], stats["leased"]) == (25, 0, 0)


def test_boto3_sends_batches_and_a_spark_stream_delivers_each_once_into_delta(
    spark, queue_path, tmp_path
):
    with BrokerProcess(
        queue_path, "--sqs", "127.0.0.1:0", log_path=tmp_path / "broker.log"
    ) as broker:
        c = client(sqs_url(broker))
        url = c.create_queue(QueueName="q")["QueueUrl"]
        for batch in range(3):
            answer = c.send_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "MessageBody": f"b{batch}-{i}"} for i in range(10)],
            )
            assert len(answer["Successful"]) == 10
    out = tmp_path / "out"
    consume(spark, queue_path, out, tmp_path / "checkpoint", queue="q")
    got = delivered(out)
    assert Counter(got) == Counter(f"b{b}-{i}" for b in range(3) for i in range(10))
    assert QueueTable(queue_path).stats("q")["acked"] == 30
