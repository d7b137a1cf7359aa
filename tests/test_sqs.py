"""The broker's SQS API (docs/SQS.md), driven by real SDK clients (boto3, the AWS CLI)
against real broker processes on real tables, local and on the suite's S3 server; the
mapping functions of :mod:`spark_queue.server.sqs` on their own."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from spark_queue import QueueTable
from spark_queue.errors import InvalidOptionError
from spark_queue.model.queue_arguments import QueueArguments
from spark_queue.server.sqs import handles as sqs_handles
from spark_queue.server.sqs.attributes import SqsOnly, parse_attributes, queue_attributes
from spark_queue.server.sqs.errors import SqsError
from spark_queue.server.sqs.http import CONTENT_TYPE
from spark_queue.server.sqs.limits import MAX_MESSAGE_BYTES
from spark_queue.server.sqs.messages import (
    attributes_of_headers,
    headers_of,
    md5_of_attributes,
    message_attributes,
)
from spark_queue.server.sqs.names import CONSUMER, queue_arn
from spark_queue.server.sqs.signing import KEYS_ENV_VAR
from spark_queue.storage.location import Location
from tests.brokers import BrokerProcess

KEY_ID, SECRET = "AKIDSPARKQUEUETEST", "test-secret/with+odd=chars"
CLIENT_CONFIG = Config(retries={"max_attempts": 1}, read_timeout=60)


def sqs_url(broker: BrokerProcess) -> str:
    return broker.announcement.split("SQS API at ", 1)[1].split()[0]


def client(endpoint: str, key: str = KEY_ID, secret: str = SECRET) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="eu-west-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=CLIENT_CONFIG,
    )


def code_of(error: botocore.exceptions.ClientError) -> str:
    return error.response["Error"]["Code"]


def version_of(path: str, **options: Any) -> int:
    return QueueTable(path, broker="off", **options).store.location.delta_table().version()


def handle_of(path: str, queue: str, seq: int, deliveries: int, received_ms: int = 0) -> str:
    """A receipt handle signed with the table's secret (which brokers read and, where the
    table has none, write first), received now unless ``received_ms`` says when."""
    key = sqs_handles.HandleKeys(Location.of(path)).signing()
    received = received_ms or int(time.time() * 1000)
    return sqs_handles.issue(key, sqs_handles.Receipt(queue, seq, deliveries, received))


@pytest.fixture(scope="module")
def local_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("sqs")
    path = str(folder / "queues")
    with BrokerProcess(path, "--sqs", "127.0.0.1:0", log_path=folder / "broker.log") as broker:
        yield broker


@pytest.fixture
def sqs_client(local_broker: BrokerProcess) -> Any:
    return client(sqs_url(local_broker))


# -- the mapping, without a server ---------------------------------------------------------


def test_message_attributes_digest_as_aws_documents_it():
    # The value AWS's SDKs compute for these attributes (Java SDK MessageMD5ChecksumHandler).
    checked = message_attributes(
        {
            "b": {"DataType": "Binary", "BinaryValue": "AAE="},
            "a": {"DataType": "String", "StringValue": "x"},
        }
    )
    import hashlib
    import struct

    expected = hashlib.md5()
    for name, kind, transport, value in (("a", "String", 1, b"x"), ("b", "Binary", 2, b"\0\1")):
        for part in (name.encode(), kind.encode()):
            expected.update(struct.pack(">I", len(part)) + part)
        expected.update(bytes([transport]) + struct.pack(">I", len(value)) + value)
    assert md5_of_attributes(checked) == expected.hexdigest()
    headers = headers_of(checked, None)
    assert headers is not None and headers["a"] == "x"
    assert attributes_of_headers(headers) == checked


def test_queue_attributes_map_to_queue_arguments_and_back():
    change = parse_attributes(
        "jobs",
        {
            "MessageRetentionPeriod": "120",
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": queue_arn("jobs-dlq"), "maxReceiveCount": 3}
            ),
            "VisibilityTimeout": "45",
            "maxLength": "100",
            "overflow": "ring",
        },
        creating=True,
        queues=frozenset({"jobs-dlq"}),
    )
    assert change.arguments == {
        "expiration": 120_000,
        "dead_letter_queue": "jobs-dlq",
        "max_deliveries": 3,
        "max_length": 100,
        "overflow": "ring",
    }
    assert change.sqs == {"visibility_timeout": 45}
    arguments = QueueArguments().merged(change.arguments)
    settings = SqsOnly(visibility_timeout=45)
    back = queue_attributes("jobs", arguments, settings, None, ["All"])
    assert back["MessageRetentionPeriod"] == "120"
    assert json.loads(back["RedrivePolicy"]) == {
        "deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:jobs-dlq",
        "maxReceiveCount": 3,
    }
    assert (back["VisibilityTimeout"], back["maxLength"], back["overflow"]) == ("45", "100", "ring")
    for bad, code in (
        ({"VisibilityTimeout": "43201"}, "InvalidAttributeValue"),
        ({"VisibilityTimeout": "1.5"}, "InvalidAttributeValue"),
        ({"Policy": "{}"}, "InvalidAttributeName"),
        ({"maxLength": "-2"}, "InvalidAttributeValue"),
        ({"RedrivePolicy": '{"deadLetterTargetArn": "arn:aws:sqs:r:1:nope", "maxReceiveCount": 1}'},
         "InvalidAttributeValue"),
        ({"FifoQueue": "true"}, "InvalidAttributeValue"),
    ):  # fmt: skip
        with pytest.raises(SqsError) as refused:
            parse_attributes("jobs", bad, creating=True)
        assert refused.value.code == code, bad


# -- every action, through boto3 -----------------------------------------------------------


def drive_every_action(endpoint: str, path: str, **options: Any) -> None:
    """Each action of the API, once or more, checked against what the table holds."""
    c = client(endpoint)
    url = c.create_queue(QueueName="work", Attributes={"VisibilityTimeout": "40"})["QueueUrl"]
    assert url == f"{endpoint}/000000000000/work"
    assert c.create_queue(QueueName="work")["QueueUrl"] == url  # exists: the same URL
    with pytest.raises(c.exceptions.QueueNameExists):
        c.create_queue(QueueName="work", Attributes={"VisibilityTimeout": "41"})
    dlq = c.create_queue(QueueName="work-dlq", tags={"team": "data"})["QueueUrl"]
    assert c.get_queue_url(QueueName="work")["QueueUrl"] == url
    assert c.list_queues()["QueueUrls"] == [url, dlq]
    assert c.list_queues(QueueNamePrefix="work-")["QueueUrls"] == [dlq]
    first = c.list_queues(MaxResults=1)
    assert first["QueueUrls"] == [url]
    assert c.list_queues(MaxResults=1, NextToken=first["NextToken"])["QueueUrls"] == [dlq]

    redrive = {"deadLetterTargetArn": queue_arn("work-dlq"), "maxReceiveCount": 5}
    c.set_queue_attributes(
        QueueUrl=url,
        Attributes={"RedrivePolicy": json.dumps(redrive), "DelaySeconds": "0", "maxLength": "500"},
    )
    table = QueueTable(path, broker="off", **options)
    arguments = table.arguments("work")
    assert (arguments.dead_letter_queue, arguments.max_deliveries, arguments.max_length) == (
        "work-dlq",
        5,
        500,
    )
    attributes = c.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "40"
    assert json.loads(attributes["RedrivePolicy"]) == redrive
    assert attributes["QueueArn"] == queue_arn("work")
    assert c.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]

    c.tag_queue(QueueUrl=url, Tags={"env": "test", "owner": "me"})
    c.untag_queue(QueueUrl=url, TagKeys=["owner"])
    assert c.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test"}
    assert c.list_queue_tags(QueueUrl=dlq)["Tags"] == {"team": "data"}

    sent = c.send_message(
        QueueUrl=url,
        MessageBody="one",
        MessageAttributes={"kind": {"DataType": "String", "StringValue": "greeting"}},
    )
    batch = c.send_message_batch(
        QueueUrl=url, Entries=[{"Id": f"m{i}", "MessageBody": f"body {i}"} for i in range(10)]
    )
    assert [e["Id"] for e in batch["Successful"]] == [f"m{i}" for i in range(10)]
    assert table.stats("work")["ready"] == 11
    assert c.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])[
        "Attributes"
    ] == {"ApproximateNumberOfMessages": "11"}

    got = c.receive_message(
        QueueUrl=url, MaxNumberOfMessages=1, MessageAttributeNames=["All"], AttributeNames=["All"]
    )["Messages"]
    assert [m["Body"] for m in got] == ["one"] and got[0]["MessageId"] == sent["MessageId"]
    assert got[0]["MessageAttributes"] == {
        "kind": {"DataType": "String", "StringValue": "greeting"}
    }
    assert got[0]["Attributes"]["ApproximateReceiveCount"] == "1"
    c.change_message_visibility(
        QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"], VisibilityTimeout=600
    )
    c.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    rest = c.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in rest] == [f"body {i}" for i in range(10)]
    changed = c.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "ReceiptHandle": rest[0]["ReceiptHandle"], "VisibilityTimeout": 0},
            {"Id": "b", "ReceiptHandle": rest[1]["ReceiptHandle"], "VisibilityTimeout": 100},
        ],
    )
    assert sorted(e["Id"] for e in changed["Successful"]) == ["a", "b"]
    deleted = c.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in
                 enumerate(rest[1:])],
    )  # fmt: skip
    assert len(deleted["Successful"]) == 9
    stats = table.stats("work")
    assert (stats["ready"], stats["leased"], stats["acked"]) == (1, 0, 10)  # rest[0] is back

    c.purge_queue(QueueUrl=url)
    assert table.stats("work")["ready"] == 0
    c.delete_queue(QueueUrl=dlq)
    with pytest.raises(c.exceptions.QueueDoesNotExist):
        c.get_queue_url(QueueName="work-dlq")
    with pytest.raises(c.exceptions.QueueDoesNotExist):
        c.send_message(QueueUrl=dlq, MessageBody="lost")
    assert c.list_queues()["QueueUrls"] == [url]
    assert c.create_queue(QueueName="work-dlq")["QueueUrl"] == dlq  # created again


def test_boto3_drives_every_action_on_a_local_table(tmp_path):
    path = str(tmp_path / "queues")
    with BrokerProcess(path, "--sqs", "127.0.0.1:0", log_path=tmp_path / "broker.log") as broker:
        drive_every_action(sqs_url(broker), path)
        assert broker.stop() == 0


def test_boto3_drives_every_action_on_object_storage(tmp_path, s3_table, s3_options):
    flags = [f"--storage-option={k}={v}" for k, v in s3_options.items()]
    with BrokerProcess(
        s3_table, "--sqs", "127.0.0.1:0", *flags, log_path=tmp_path / "broker.log"
    ) as broker:
        drive_every_action(sqs_url(broker), s3_table, storage_options=s3_options)


def test_a_fifo_queue_delivers_each_group_in_order_across_two_consumers(sqs_client):
    c = sqs_client
    url = c.create_queue(
        QueueName="orders.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    for group in ("a", "b"):
        c.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": f"{group}{i}", "MessageBody": f"{group}-{i}", "MessageGroupId": group}
                for i in range(4)
            ],
        )
    # The same body again within five minutes: a duplicate, not enqueued.
    again = c.send_message(QueueUrl=url, MessageBody="a-0", MessageGroupId="a")
    assert "SequenceNumber" not in again
    with pytest.raises(botocore.exceptions.ClientError) as no_group:
        c.send_message(QueueUrl=url, MessageBody="x")
    assert code_of(no_group.value) == "MissingParameter"
    one, two = c, client(c.meta.endpoint_url)
    seen: dict[str, list[str]] = {"a": [], "b": []}
    while sum(map(len, seen.values())) < 8:
        batches = [
            consumer.receive_message(
                QueueUrl=url, MaxNumberOfMessages=3, AttributeNames=["MessageGroupId"]
            ).get("Messages", [])
            for consumer in (one, two)
        ]
        groups = [{m["Attributes"]["MessageGroupId"] for m in b} for b in batches]
        assert not groups[0] & groups[1]  # a group in flight goes to one receiver only
        for consumer, batch in zip((one, two), batches, strict=True):
            for message in batch:
                seen[message["Attributes"]["MessageGroupId"]].append(message["Body"])
            if batch:
                consumer.delete_message_batch(
                    QueueUrl=url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                             for i, m in enumerate(batch)],
                )  # fmt: skip
    assert seen == {g: [f"{g}-{i}" for i in range(4)] for g in "ab"}


def test_a_visibility_timeout_that_runs_out_redelivers_and_the_old_handle_changes_nothing(
    sqs_client, local_broker
):
    c = sqs_client
    url = c.create_queue(QueueName="slow")["QueueUrl"]
    c.send_message(QueueUrl=url, MessageBody="job")
    first = c.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"][0]
    # The broker's long poll returns it once its visibility timeout has run out.
    second = c.receive_message(
        QueueUrl=url, WaitTimeSeconds=10, AttributeNames=["ApproximateReceiveCount"]
    )["Messages"][0]
    assert second["MessageId"] == first["MessageId"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    assert second["ReceiptHandle"] != first["ReceiptHandle"]
    table = QueueTable(local_broker.path, broker="off")
    version = version_of(local_broker.path)
    c.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])  # stale: nothing
    with pytest.raises(botocore.exceptions.ClientError) as stale:
        c.change_message_visibility(
            QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
        )
    assert code_of(stale.value) == "InvalidParameterValue"
    assert version_of(local_broker.path) == version
    assert table.stats("slow")["leased"] == 1
    c.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    assert table.stats("slow")["acked"] == 1


def test_a_redrive_policy_moves_a_message_to_its_dead_letter_queue_after_n_receives(
    sqs_client, local_broker
):
    c = sqs_client
    dlq = c.create_queue(QueueName="failing-dlq")["QueueUrl"]
    redrive = {"deadLetterTargetArn": queue_arn("failing-dlq"), "maxReceiveCount": "2"}
    url = c.create_queue(QueueName="failing", Attributes={"RedrivePolicy": json.dumps(redrive)})[
        "QueueUrl"
    ]
    c.send_message(QueueUrl=url, MessageBody="poison")
    counts = []
    for _ in range(2):  # received and made visible again at once: a failed attempt
        message = c.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"][0]
        counts.append(message["Attributes"]["ApproximateReceiveCount"])
        c.change_message_visibility(
            QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
        )
    assert counts == ["1", "2"]
    assert "Messages" not in c.receive_message(QueueUrl=url)
    dead = c.receive_message(QueueUrl=dlq, AttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in dead] == ["poison"]
    assert dead[0]["Attributes"]["DeadLetterQueueSourceArn"] == queue_arn("failing")
    stats = QueueTable(local_broker.path, broker="off").stats("failing")
    assert (stats["killed"], stats["dead_lettered"]) == (1, 1)


def test_an_empty_queue_long_poll_commits_nothing_while_it_waits(sqs_client, local_broker):
    c = sqs_client
    url = c.create_queue(QueueName="idle")["QueueUrl"]
    version = version_of(local_broker.path)
    assert "Messages" not in c.receive_message(QueueUrl=url, WaitTimeSeconds=2)
    assert version_of(local_broker.path) == version
    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.append(c.receive_message(QueueUrl=url, WaitTimeSeconds=20))
    )
    waiter.start()
    client(c.meta.endpoint_url).send_message(QueueUrl=url, MessageBody="wake up")
    waiter.join(60)
    bodies = [m["Body"] for m in got[0].get("Messages", [])]
    if not bodies:  # the send came before the poll's first lease: it found it then
        bodies = [m["Body"] for m in c.receive_message(QueueUrl=url)["Messages"]]
    assert bodies == ["wake up"]


# A broker whose idle long polls never lease again on their own before they end: what wakes
# one early can only be a send through its SQS API or the table-version check.
NO_SETTLING = (
    "-c",
    "import sys; from spark_queue.server.sqs import service; service.SETTLE_SECONDS = 3600; "
    "from spark_queue.cli import main; sys.exit(main(sys.argv[1:]))",
)


def start_poll(endpoint: str, url: str, wait: int) -> tuple[threading.Thread, dict[str, Any]]:
    """A ``ReceiveMessage`` long poll (unsigned: the broker has no keys) answered in a
    thread. Its connection is made and its request sent before this returns, and the broker
    has since answered another request on a later connection, so it has accepted this one
    (connections are accepted in order) and waits on it."""
    outcome: dict[str, Any] = {}
    host, port = endpoint.removeprefix("http://").rstrip("/").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    body = json.dumps({"QueueUrl": url, "WaitTimeSeconds": wait})
    headers = {"Content-Type": CONTENT_TYPE, "X-Amz-Target": "AmazonSQS.ReceiveMessage"}
    connection.request("POST", "/", body=body, headers=headers)  # connects, then sends

    def poll() -> None:
        try:
            response = connection.getresponse()
            answer = json.loads(response.read() or b"{}")
            if response.status == 200:
                outcome["answer"] = answer
            else:
                outcome["error"] = (response.status, answer)
        except OSError as error:
            outcome["error"] = error
        finally:
            connection.close()
        outcome["returned_at"] = time.monotonic()

    thread = threading.Thread(target=poll)
    thread.start()
    client(endpoint).get_queue_url(QueueName=url.rsplit("/", 1)[1])
    return thread, outcome


@pytest.mark.parametrize("writer", ["table", "flight"])
def test_a_long_poll_wakes_on_a_publish_by_another_writer(tmp_path, writer):
    path = str(tmp_path / "queues")
    with BrokerProcess(
        path, "--sqs", "127.0.0.1:0", log_path=tmp_path / "broker.log", entry=NO_SETTLING
    ) as broker:
        endpoint = sqs_url(broker)
        url = client(endpoint).create_queue(QueueName="elsewhere")["QueueUrl"]
        publisher = QueueTable(path, broker="off" if writer == "table" else broker.address)
        version = version_of(path)
        poll, outcome = start_poll(endpoint, url, 20)
        assert version_of(path) == version  # waiting commits nothing
        publisher.publish("elsewhere", ["from elsewhere"])
        published_at = time.monotonic()
        poll.join(60)
        assert "error" not in outcome
        # The poll that was waiting answers with it: only the new table version can have
        # woken it, since this broker does not lease again for an hour and the poll would
        # otherwise have run its 20 s out.
        assert [m["Body"] for m in outcome["answer"].get("Messages", [])] == ["from elsewhere"]
        assert outcome["returned_at"] - published_at < 10
        assert version_of(path) == version + 2  # the publish and the lease, nothing else


def test_a_broker_stopping_answers_its_long_polls_at_once(tmp_path):
    path = str(tmp_path / "queues")
    broker = BrokerProcess(
        path, "--sqs", "127.0.0.1:0", "--stop-timeout", "15s", log_path=tmp_path / "broker.log"
    )
    with broker:
        endpoint = sqs_url(broker)
        urls = [client(endpoint).create_queue(QueueName=n)["QueueUrl"] for n in ("a", "b")]
        polls = [start_poll(endpoint, url, 20) for url in urls]
        broker.process.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        for poll, _ in polls:
            poll.join(60)
        assert broker.process.wait(60) == 0
        exited_at = time.monotonic()
    for _, outcome in polls:
        assert "error" not in outcome
        assert "Messages" not in outcome["answer"]  # an empty receive, as at a deadline
        # Held, they would end at their 20 s or be cut off at the 15 s stop timeout.
        assert outcome["returned_at"] - stopped_at < 10
    assert exited_at - stopped_at < 10
    assert "did not close" not in broker.output()


# -- bad input -----------------------------------------------------------------------------


def test_bad_requests_get_sqs_errors_and_change_nothing(sqs_client, local_broker):
    c = sqs_client
    url = c.create_queue(QueueName="strict", Attributes={"MaximumMessageSize": "2048"})["QueueUrl"]
    c.send_message(QueueUrl=url, MessageBody="kept")
    table = QueueTable(local_broker.path, broker="off")
    before = table.stats("strict")
    version = version_of(local_broker.path)
    handle = handle_of(local_broker.path, "strict", 10**6, 1)
    other_queues = handle_of(local_broker.path, "other", 1, 1)
    calls = [
        (c.send_message, {"QueueUrl": url, "MessageBody": "x" * 2049}, "InvalidParameterValue"),
        (c.send_message, {"QueueUrl": url, "MessageBody": "bad \x00"}, "InvalidMessageContents"),
        (c.send_message, {"QueueUrl": url, "MessageBody": ""}, "InvalidParameterValue"),
        (c.send_message, {"QueueUrl": url, "MessageBody": "x", "DelaySeconds": 901},
         "InvalidParameterValue"),
        (c.send_message, {"QueueUrl": url, "MessageBody": "x", "MessageAttributes": {
            "AWS.x": {"DataType": "String", "StringValue": "v"}}}, "InvalidParameterValue"),
        (c.send_message, {"QueueUrl": url, "MessageBody": "x", "MessageAttributes": {
            "n": {"DataType": "Number", "StringValue": "ten"}}}, "InvalidParameterValue"),
        (c.send_message, {"QueueUrl": url + "-missing", "MessageBody": "x"},
         "AWS.SimpleQueueService.NonExistentQueue"),
        (c.send_message_batch, {"QueueUrl": url, "Entries": []},
         "AWS.SimpleQueueService.EmptyBatchRequest"),
        (c.send_message_batch, {"QueueUrl": url, "Entries": [
            {"Id": str(i), "MessageBody": "x"} for i in range(11)]},
         "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
        (c.send_message_batch, {"QueueUrl": url, "Entries": [
            {"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}]},
         "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
        (c.send_message_batch, {"QueueUrl": url, "Entries": [{"Id": "a b", "MessageBody": "x"}]},
         "AWS.SimpleQueueService.InvalidBatchEntryId"),
        (c.receive_message, {"QueueUrl": url, "MaxNumberOfMessages": 11},
         "InvalidParameterValue"),
        (c.receive_message, {"QueueUrl": url, "WaitTimeSeconds": 21}, "InvalidParameterValue"),
        (c.receive_message, {"QueueUrl": url, "VisibilityTimeout": 43201},
         "InvalidParameterValue"),
        (c.delete_message, {"QueueUrl": url, "ReceiptHandle": "forged"},
         "ReceiptHandleIsInvalid"),
        (c.delete_message, {"QueueUrl": url, "ReceiptHandle": other_queues},
         "ReceiptHandleIsInvalid"),
        (c.change_message_visibility, {"QueueUrl": url, "ReceiptHandle": handle,
                                       "VisibilityTimeout": 10}, "InvalidParameterValue"),
        (c.get_queue_attributes, {"QueueUrl": url, "AttributeNames": ["NoSuchAttribute"]},
         "InvalidAttributeName"),
        (c.set_queue_attributes, {"QueueUrl": url, "Attributes": {"DelaySeconds": "-1"}},
         "InvalidAttributeValue"),
        (c.set_queue_attributes, {"QueueUrl": url, "Attributes": {"overflow": "sideways"}},
         "InvalidAttributeValue"),
        (c.create_queue, {"QueueName": "bad name!"}, "InvalidParameterValue"),
        (c.create_queue, {"QueueName": "plain", "Attributes": {"FifoQueue": "true"}},
         "InvalidParameterValue"),
        (c.get_queue_url, {"QueueName": "never-made"}, "AWS.SimpleQueueService.NonExistentQueue"),
    ]  # fmt: skip
    for call, arguments, code in calls:
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            call(**arguments)
        assert code_of(refused.value) == code, (call, arguments)
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    big = "y" * 2000
    too_long = c.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": "fits", "MessageBody": "z"}, {"Id": "big", "MessageBody": big + "y" * 100}],
    )  # one entry too large for the queue fails alone; the other is sent
    assert [e["Id"] for e in too_long["Failed"]] == ["big"]
    assert too_long["Failed"][0]["Code"] == "InvalidParameterValue"
    before["added"] += 1
    before["ready"] += 1
    before["ready_bytes"] += 1
    version += 1
    c.set_queue_attributes(QueueUrl=url, Attributes={"MaximumMessageSize": str(MAX_MESSAGE_BYTES)})
    with pytest.raises(botocore.exceptions.ClientError) as batch_too_long:
        c.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(i), "MessageBody": "w" * 300_000} for i in range(4)],
        )
    assert code_of(batch_too_long.value) == "AWS.SimpleQueueService.BatchRequestTooLong"
    assert version_of(local_broker.path) == version
    after = table.stats("strict")
    assert after == before


def test_malformed_http_requests_get_sqs_errors(local_broker):
    import urllib.error
    import urllib.request

    endpoint = sqs_url(local_broker)
    url = client(endpoint).create_queue(QueueName="raw")["QueueUrl"]
    for target, body, code in (
        ("AmazonSQS.NoSuchAction", b"{}", "UnknownOperationException"),
        ("", b"{}", "UnknownOperationException"),
        ("AmazonSQS.ListQueues", b"{not json", "SerializationException"),
        ("AmazonSQS.ListQueues", b"[]", "SerializationException"),
        ("AmazonSQS.SendMessage", b'{"QueueUrl": 5}', "MissingParameter"),
        ("AmazonSQS.ReceiveMessage",
         json.dumps({"QueueUrl": url, "MaxNumberOfMessages": "2"}).encode(),
         "InvalidParameterValue"),
    ):  # fmt: skip
        request = urllib.request.Request(
            endpoint + "/",
            data=body,
            method="POST",
            headers={"X-Amz-Target": target, "Content-Type": CONTENT_TYPE},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        answer = json.loads(refused.value.read())
        assert answer["__type"].rsplit("#", 1)[1] == code, (target, body)
        assert refused.value.headers["x-amzn-query-error"].endswith(";Sender")


# -- signatures ----------------------------------------------------------------------------


@pytest.fixture
def keys_file(tmp_path: Path) -> str:
    path = tmp_path / "sqs-keys"
    path.write_text(f"{KEY_ID} {SECRET}\n")
    path.chmod(0o600)
    return str(path)


def test_a_broker_with_keys_refuses_unsigned_and_wrongly_signed_requests(tmp_path, keys_file):
    path = str(tmp_path / "queues")
    with BrokerProcess(
        path,
        "--sqs",
        "127.0.0.1:0",
        log_path=tmp_path / "broker.log",
        env={KEYS_ENV_VAR: keys_file},
    ) as broker:
        endpoint = sqs_url(broker)
        assert "signatures required" in broker.announcement
        good = client(endpoint)
        url = good.create_queue(QueueName="guarded")["QueueUrl"]
        version = version_of(path)
        unsigned = boto3.client(
            "sqs",
            endpoint_url=endpoint,
            region_name="eu-west-1",
            config=Config(signature_version=botocore.UNSIGNED, retries={"max_attempts": 1}),
        )
        for bad, code in (
            (unsigned, "MissingAuthenticationToken"),
            (client(endpoint, secret="not-the-secret"), "SignatureDoesNotMatch"),
            (client(endpoint, key="AKIDUNKNOWN"), "InvalidClientTokenId"),
        ):
            with pytest.raises(botocore.exceptions.ClientError) as refused:
                bad.send_message(QueueUrl=url, MessageBody="refused")
            assert code_of(refused.value) == code
            assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        assert version_of(path) == version
        good.send_message(QueueUrl=url, MessageBody="taken")
        assert QueueTable(path, broker="off").stats("guarded")["added"] == 1
        assert broker.stop() == 0
    assert SECRET not in broker.output()


def test_the_sqs_api_beyond_loopback_needs_keys(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "spark_queue.cli", "broker", str(tmp_path / "q"),
         "--sqs", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != KEYS_ENV_VAR},
    )  # fmt: skip
    assert done.returncode == 2
    assert "SPARK_QUEUE_SQS_KEYS" in done.stderr and "beyond loopback" in done.stderr
    assert not (tmp_path / "q").exists()


def test_the_aws_cli_sends_receives_and_deletes(tmp_path, keys_file):
    aws = shutil.which("aws") or str(Path(sys.executable).parent / "aws")
    path = str(tmp_path / "queues")
    with BrokerProcess(
        path, "--sqs", "127.0.0.1:0", log_path=tmp_path / "broker.log",
        env={KEYS_ENV_VAR: keys_file},
    ) as broker:  # fmt: skip
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "eu-west-1",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }

        def run(*words: str) -> Any:
            done = subprocess.run(
                [aws, "sqs", *words, "--endpoint-url", sqs_url(broker), "--output", "json"],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout) if done.stdout.strip() else None

        url = run("create-queue", "--queue-name", "cli")["QueueUrl"]
        run("send-message", "--queue-url", url, "--message-body", "from the shell")
        [message] = run("receive-message", "--queue-url", url)["Messages"]
        assert message["Body"] == "from the shell"
        run("delete-message", "--queue-url", url, "--receipt-handle", message["ReceiptHandle"])
        assert QueueTable(path, broker="off").stats("cli")["acked"] == 1


# -- crashes -------------------------------------------------------------------------------


def test_a_broker_killed_during_sqs_traffic_loses_nothing_it_acknowledged(tmp_path):
    path = str(tmp_path / "queues")
    flags = ("--sqs", "127.0.0.1:0")
    acknowledged: list[str] = []
    deleted: list[str] = []
    broker = BrokerProcess(path, *flags, log_path=tmp_path / "broker.log")
    endpoint = sqs_url(broker)
    url = client(endpoint).create_queue(QueueName="durable")["QueueUrl"]
    stop = threading.Event()
    enough = threading.Event()  # some deletes answered: traffic both ways is under way

    def send(worker: int) -> None:
        c = client(endpoint)
        for batch in range(10_000):
            if stop.is_set():
                return
            entries = [{"Id": str(i), "MessageBody": f"{worker}-{batch}-{i}"} for i in range(10)]
            try:
                answer = c.send_message_batch(QueueUrl=url, Entries=entries)
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
                return
            acknowledged.extend(f"{worker}-{batch}-{e['Id']}" for e in answer["Successful"])

    def receive() -> None:
        c = client(endpoint)
        while not stop.is_set():
            try:
                got = c.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
                if got:
                    c.delete_message_batch(
                        QueueUrl=url,
                        Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                                 for i, m in enumerate(got)],
                    )  # fmt: skip
                    deleted.extend(m["Body"] for m in got)
                    if len(deleted) >= 30:
                        enough.set()
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
                return

    workers = [threading.Thread(target=send, args=(n,)) for n in range(3)]
    workers.append(threading.Thread(target=receive))
    for worker in workers:
        worker.start()
    assert enough.wait(120)
    broker.kill()
    stop.set()
    for worker in workers:
        worker.join(60)
    assert len(acknowledged) >= 30
    # What the kill left in flight is handed back at once, rather than after its timeout.
    QueueTable(path, broker="off").release("durable", consumer=CONSUMER)
    with BrokerProcess(path, *flags, log_path=tmp_path / "again.log") as again:
        c = client(sqs_url(again))
        left: list[str] = []
        while True:
            got = c.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
            if not got:
                break
            left.extend(m["Body"] for m in got)
            c.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                         for i, m in enumerate(got)],
            )  # fmt: skip
    # Every message a send was answered for was delivered: deleted before the kill, or
    # there after it (a delete the kill cut off leaves its message for the next receive).
    assert set(acknowledged) <= set(deleted) | set(left)


# -- the QueueTable options the SQS API stands on ------------------------------------------


def test_ack_cancel_and_extend_with_deliveries_leave_a_later_delivery_alone(tmp_path):
    table = QueueTable(str(tmp_path / "queues"), broker="off")
    table.publish("q", ["job"])
    first = table.lease("q", "c", lease_period=1)  # runs out at once
    second = table.lease("q", "c", lease_period="1 minute")
    assert second["delivery_count"].to_pylist() == [2]
    seq = first["seq"][0].as_py()
    version = table.store.location.delta_table().version()
    assert table.ack("q", [seq], "c", deliveries=[1]) == 0
    assert table.cancel("q", [seq], "c", delay=0, deliveries=[1]) == 0
    assert table.extend("q", [seq], "c", "5 minutes", deliveries=[1]) == 0
    assert table.store.location.delta_table().version() == version  # nothing committed
    with pytest.raises(InvalidOptionError, match="one delivery count per seq"):
        table.ack("q", [seq], "c", deliveries=[1, 2])
    with pytest.raises(InvalidOptionError, match="deliveries"):
        table.ack("q", [seq], "c", deliveries=[True])
    assert table.ack("q", [seq], "c", deliveries=[2]) == 1


def test_a_strict_groups_lease_passes_over_its_own_groups_in_flight(tmp_path):
    table = QueueTable(str(tmp_path / "queues"), broker="off")
    table.publish("g", [{"body": b, "key": "k"} for b in ("1", "2")], message_groups=True)
    assert table.lease("g", "c", max_messages=1)["body"].to_pylist() == [b"1"]
    assert table.lease("g", "c", max_messages=1, strict_groups=True).num_rows == 0
    assert table.lease("g", "c", max_messages=1)["body"].to_pylist() == [b"2"]  # its holder
    with pytest.raises(InvalidOptionError, match="strict_groups"):
        table.lease("g", "c", strict_groups="yes")


def test_the_sqs_api_serves_https_with_the_brokers_certificate(tmp_path):
    from tests.test_broker import self_signed

    path = str(tmp_path / "queues")
    cert, key = self_signed(tmp_path)
    flags = ["--sqs", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key)]
    with BrokerProcess(path, *flags, log_path=tmp_path / "broker.log") as broker:
        endpoint = sqs_url(broker)
        assert endpoint.startswith("https://127.0.0.1:")
        trusting = boto3.client(
            "sqs",
            endpoint_url=endpoint,
            region_name="eu-west-1",
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
            verify=str(cert),
            config=CLIENT_CONFIG,
        )
        url = trusting.create_queue(QueueName="private")["QueueUrl"]
        trusting.send_message(QueueUrl=url, MessageBody="sealed")
        with pytest.raises(botocore.exceptions.SSLError):
            client(endpoint).send_message(QueueUrl=url, MessageBody="unchecked")
        assert QueueTable(path, broker="off").stats("private")["added"] == 1


def test_attributes_delays_and_bodies_of_any_bytes_travel(sqs_client, local_broker):
    import base64

    c = sqs_client
    url = c.create_queue(QueueName="typed")["QueueUrl"]
    attributes = {
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
        "price": {"DataType": "Number.euro", "StringValue": "12.50"},
        "tag": {"DataType": "String", "StringValue": "x"},
    }
    sent = c.send_message(QueueUrl=url, MessageBody="typed", MessageAttributes=attributes)
    [got] = c.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
    assert got["MessageAttributes"] == attributes
    assert got["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    c.change_message_visibility(
        QueueUrl=url, ReceiptHandle=got["ReceiptHandle"], VisibilityTimeout=0
    )
    # A name, or a prefix ending in '.' before the '*': "t.*" is not "tag".
    [again] = c.receive_message(QueueUrl=url, MessageAttributeNames=["price", "t.*"])["Messages"]
    assert sorted(again["MessageAttributes"]) == ["price"]
    c.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])

    table = QueueTable(local_broker.path, broker="off")
    table.publish("typed", [{"body": b"\xff\xfe raw", "headers": {"origin": "spark"}}])
    [raw] = c.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
    assert base64.b64decode(raw["Body"]) == b"\xff\xfe raw"
    assert raw["MessageAttributes"] == {
        "origin": {"DataType": "String", "StringValue": "spark"},
        "spark-queue.body-encoding": {"DataType": "String", "StringValue": "base64"},
    }
    c.delete_message(QueueUrl=url, ReceiptHandle=raw["ReceiptHandle"])

    c.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=1)
    assert "Messages" not in c.receive_message(QueueUrl=url)
    delayed = c.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )["Attributes"]
    assert delayed == {"ApproximateNumberOfMessagesDelayed": "1"}
    # The long poll leases again once the delay is over.
    [late] = c.receive_message(QueueUrl=url, WaitTimeSeconds=10)["Messages"]
    assert late["Body"] == "later"
