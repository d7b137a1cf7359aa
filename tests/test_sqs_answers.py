"""The SQS API answers as SQS does where a client can tell (docs/SQS.md): receipt handles
(authenticated, bound to one receive, expiring), batches of handles, the redrive on time,
system attributes and their digest, queue names and what a refused CreateQueue writes.
boto3 against real broker processes; raw handles where only a forger would send them."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import time
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from spark_queue import QueueTable
from spark_queue.server.sqs import handles as sqs_handles
from spark_queue.server.sqs.errors import SqsError
from spark_queue.server.sqs.names import queue_arn, queue_url
from spark_queue.server.sqs.service import SETTINGS_FOLDER
from tests.brokers import BrokerProcess, wait_until
from tests.test_sqs import client, code_of, handle_of, sqs_url, version_of

TWELVE_HOURS_MS = 43_200_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("sqs-answers")
    path = str(folder / "queues")
    with BrokerProcess(path, "--sqs", "127.0.0.1:0", log_path=folder / "broker.log") as running:
        yield running


@pytest.fixture
def c(broker: BrokerProcess) -> Any:
    return client(sqs_url(broker))


def refused(call: Any, **arguments: Any) -> botocore.exceptions.ClientError:
    with pytest.raises(botocore.exceptions.ClientError) as error:
        call(**arguments)
    assert error.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    return error.value


def seq_of(handle: str) -> int:
    """The seq a receipt handle names (its fields are readable, not forgeable)."""
    fields = handle.split(".")[1]
    return int(base64.urlsafe_b64decode(fields + "==").decode().split("\n")[1])


def received_twice(c: Any, url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One message received, its 1 s visibility timeout run out, received again."""
    first = c.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"][0]
    second = c.receive_message(QueueUrl=url, WaitTimeSeconds=10, VisibilityTimeout=600)
    [again] = second["Messages"]
    assert again["MessageId"] == first["MessageId"]
    return first, again


# -- receipt handles -----------------------------------------------------------------------


def test_a_receipt_handle_is_signed_and_names_one_receive_of_one_message_of_one_queue():
    key, other_key = b"k" * 32, b"o" * 32
    now = int(time.time() * 1000)
    receipt = sqs_handles.Receipt("orders", 12, 3, now)
    handle = sqs_handles.issue(key, receipt)

    def read(text: Any, queue: str = "orders", keys: tuple[bytes, ...] = (key,), at: int = now):
        payload, mac = sqs_handles.split(text)
        if not sqs_handles.signed_by(payload, mac, list(keys)):
            raise sqs_handles.refusal(text)
        return sqs_handles.receipt_of(payload, text, queue, at)

    assert read(handle) == receipt
    prefix, payload, mac = handle.split(".")
    fields = base64.urlsafe_b64decode(payload + "==").decode().split("\n")
    forged = base64.urlsafe_b64encode("\n".join(["orders", "13", *fields[2:]]).encode())
    altered = f"{prefix}.{forged.decode().rstrip('=')}.{mac}"
    unsigned = "sq1." + base64.urlsafe_b64encode(b"orders\n12\n3").decode().rstrip("=")
    for bad in ("garbage", handle + "x", f"{handle}.x", "sq2.!!.!!", altered, unsigned):
        with pytest.raises(SqsError) as refusal:
            read(bad)
        assert refusal.value.code == "ReceiptHandleIsInvalid", bad
    for keys, queue in (((other_key,), "orders"), ((key,), "payments")):
        with pytest.raises(SqsError) as refusal:
            read(handle, queue, keys)
        assert refusal.value.code == "ReceiptHandleIsInvalid"
    assert read(handle, at=now + TWELVE_HOURS_MS - 1) == receipt
    with pytest.raises(SqsError, match="The receipt handle has expired") as expired:
        read(handle, at=now + TWELVE_HOURS_MS)
    assert expired.value.code == "InvalidParameterValue"
    with pytest.raises(SqsError) as empty:
        read("")
    assert empty.value.code == "MissingParameter"


def test_a_forged_receipt_handle_deletes_nothing(c, broker):
    url = c.create_queue(QueueName="held")["QueueUrl"]
    c.send_message(QueueUrl=url, MessageBody="someone else's")
    [message] = c.receive_message(QueueUrl=url, VisibilityTimeout=600)["Messages"]
    seq = seq_of(message["ReceiptHandle"])
    version = version_of(broker.path)
    # What a handle looked like unsigned: the queue, the seq and the delivery count.
    unsigned = base64.urlsafe_b64encode(f"held\n{seq}\n1".encode()).decode().rstrip("=")
    real = message["ReceiptHandle"]
    altered = real[:6] + ("A" if real[6] != "A" else "B") + real[7:]
    for forged in (f"sq1.{unsigned}", altered, f"sq2.{unsigned}.{'A' * 22}"):
        assert code_of(refused(c.delete_message, QueueUrl=url, ReceiptHandle=forged)) == (
            "ReceiptHandleIsInvalid"
        )
        answer = c.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": "forged", "ReceiptHandle": forged}]
        )
        assert [e["Code"] for e in answer["Failed"]] == ["ReceiptHandleIsInvalid"]
    assert version_of(broker.path) == version
    assert QueueTable(broker.path, broker="off").stats("held")["leased"] == 1
    c.delete_message(QueueUrl=url, ReceiptHandle=real)
    assert QueueTable(broker.path, broker="off").stats("held")["acked"] == 1


def test_a_receipt_handle_beyond_int64_is_invalid_and_one_past_twelve_hours_expired(c, broker):
    url = c.create_queue(QueueName="bounds")["QueueUrl"]
    huge = base64.urlsafe_b64encode(f"bounds\n{2**64}\n1".encode()).decode().rstrip("=")
    for handle in (f"sq1.{huge}", handle_of(broker.path, "bounds", 2**64, 1)):
        assert code_of(refused(c.delete_message, QueueUrl=url, ReceiptHandle=handle)) == (
            "ReceiptHandleIsInvalid"
        )
    c.send_message(QueueUrl=url, MessageBody="slow work")
    [message] = c.receive_message(QueueUrl=url, VisibilityTimeout=60)["Messages"]
    handle = message["ReceiptHandle"]
    received = int(time.time() * 1000) - TWELVE_HOURS_MS
    old = handle_of(broker.path, "bounds", seq_of(handle), 1, received)
    for call, extra in (
        (c.delete_message, {}),
        (c.change_message_visibility, {"VisibilityTimeout": 5}),
    ):
        error = refused(call, QueueUrl=url, ReceiptHandle=old, **extra)
        assert code_of(error) == "InvalidParameterValue"
        assert "The receipt handle has expired" in error.response["Error"]["Message"]
    # SQS keeps a message in flight 12 hours from its receive at most.
    error = refused(
        c.change_message_visibility, QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=43_200
    )
    assert code_of(error) == "InvalidParameterValue"
    assert "VisibilityTimeout" in error.response["Error"]["Message"]
    c.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=43_000)
    assert QueueTable(broker.path, broker="off").stats("bounds")["leased"] == 1


def test_receipt_handles_hold_across_a_restart_and_between_brokers_of_one_table(tmp_path):
    path = str(tmp_path / "queues")
    flags = ("--sqs", "127.0.0.1:0")
    with BrokerProcess(path, *flags, log_path=tmp_path / "one.log") as one:
        first = client(sqs_url(one))
        url = first.create_queue(QueueName="shared")["QueueUrl"]
        first.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(2)]
        )
        got = first.receive_message(QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=600)
        handles = [m["ReceiptHandle"] for m in got["Messages"]]
        with BrokerProcess(path, *flags, log_path=tmp_path / "two.log") as two:
            client(sqs_url(two)).delete_message(QueueUrl=url, ReceiptHandle=handles[0])
        assert one.stop() == 0
    with BrokerProcess(path, *flags, log_path=tmp_path / "again.log") as again:
        client(sqs_url(again)).delete_message(QueueUrl=url, ReceiptHandle=handles[1])
    stats = QueueTable(path, broker="off").stats("shared")
    assert (stats["acked"], stats["leased"]) == (2, 0)
    keys = list((Path(path) / sqs_handles.KEYS_FOLDER).iterdir())
    assert len(keys) == 1 and keys[0].stat().st_mode & 0o077 == 0  # one secret, private


def test_a_batch_with_the_current_and_an_earlier_handle_of_a_message_deletes_it(c, broker):
    url = c.create_queue(QueueName="twice")["QueueUrl"]
    c.send_message(QueueUrl=url, MessageBody="once")
    earlier, current = received_twice(c, url)
    answer = c.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "current", "ReceiptHandle": current["ReceiptHandle"]},
            {"Id": "earlier", "ReceiptHandle": earlier["ReceiptHandle"]},
        ],
    )
    # SQS answers an earlier receive's handle with success, and deletes nothing by it.
    assert sorted(e["Id"] for e in answer["Successful"]) == ["current", "earlier"]
    assert answer["Failed"] == []
    stats = QueueTable(broker.path, broker="off").stats("twice")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (1, 0, 0)
    assert "Messages" not in c.receive_message(QueueUrl=url)


# -- the redrive ---------------------------------------------------------------------------


def test_a_message_past_its_last_visibility_timeout_reaches_the_dead_letter_queue_unprompted(
    c, broker
):
    c.create_queue(QueueName="unprompted-dlq")
    redrive = {"deadLetterTargetArn": queue_arn("unprompted-dlq"), "maxReceiveCount": 2}
    url = c.create_queue(QueueName="unprompted", Attributes={"RedrivePolicy": json.dumps(redrive)})[
        "QueueUrl"
    ]
    c.send_message(QueueUrl=url, MessageBody="poison")
    c.receive_message(QueueUrl=url, VisibilityTimeout=1)
    [last] = c.receive_message(
        QueueUrl=url, WaitTimeSeconds=10, VisibilityTimeout=1, AttributeNames=["All"]
    )["Messages"]
    assert last["Attributes"]["ApproximateReceiveCount"] == "2"
    ends = time.monotonic() + 1
    # No call on the source queue from here: the broker moves it when the timeout ends.
    table = QueueTable(broker.path, broker="off")
    wait_until(lambda: table.stats("unprompted-dlq")["ready"] == 1, 30, "the redrive")
    print(f"dead-lettered {time.monotonic() - ends:.2f} s after the visibility timeout ended")
    stats = table.stats("unprompted")
    assert (stats["killed"], stats["dead_lettered"], stats["leased"]) == (1, 1, 0)
    [dead] = c.receive_message(QueueUrl=queue_url(sqs_url(broker), "unprompted-dlq"))["Messages"]
    assert dead["Body"] == "poison"


def test_a_broker_redrives_the_last_receive_another_broker_made_before_it_was_killed(tmp_path):
    path = str(tmp_path / "queues")
    flags = ("--sqs", "127.0.0.1:0")
    redrive = {"deadLetterTargetArn": queue_arn("orphans-dlq"), "maxReceiveCount": 1}
    with BrokerProcess(path, *flags, log_path=tmp_path / "killed.log") as killed:
        c = client(sqs_url(killed))
        c.create_queue(QueueName="orphans-dlq")
        url = c.create_queue(
            QueueName="orphans", Attributes={"RedrivePolicy": json.dumps(redrive)}
        )["QueueUrl"]
        c.send_message(QueueUrl=url, MessageBody="orphan")
        assert len(c.receive_message(QueueUrl=url, VisibilityTimeout=3)["Messages"]) == 1
        killed.kill()  # its watch, told of the lease, is gone with it
    table = QueueTable(path, broker="off")
    with BrokerProcess(path, *flags, log_path=tmp_path / "next.log"):
        # Nothing calls the queue: the new broker finds the lease in the table's state.
        wait_until(lambda: table.stats("orphans-dlq")["ready"] == 1, 30, "the redrive")
    assert table.stats("orphans")["dead_lettered"] == 1


# -- system attributes ---------------------------------------------------------------------


def md5_of_string_attributes(attributes: dict[str, str]) -> str:
    """AWS's digest of String attributes (the Java SDK's MessageMD5ChecksumInterceptor):
    by name, each length-prefixed name and data type, the transport byte 1, the value."""
    digest = hashlib.md5()
    for name in sorted(attributes):
        for part in (name.encode(), b"String"):
            digest.update(struct.pack(">I", len(part)) + part)
        value = attributes[name].encode()
        digest.update(b"\x01" + struct.pack(">I", len(value)) + value)
    return digest.hexdigest()


def test_a_trace_header_is_answered_with_its_digest_and_a_bad_one_fails_alone(c, broker):
    url = c.create_queue(QueueName="traced")["QueueUrl"]
    trace = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    system = {"AWSTraceHeader": {"DataType": "String", "StringValue": trace}}
    expected = md5_of_string_attributes({"AWSTraceHeader": trace})
    sent = c.send_message(QueueUrl=url, MessageBody="a", MessageSystemAttributes=system)
    assert sent["MD5OfMessageSystemAttributes"] == expected
    bad = {"AWSTraceHeader": {"DataType": "Number", "StringValue": "1"}}
    batch = c.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "traced", "MessageBody": "b", "MessageSystemAttributes": system},
            {"Id": "plain", "MessageBody": "c", "MessageSystemAttributes": {}},
            {"Id": "bad", "MessageBody": "d", "MessageSystemAttributes": bad},
        ],
    )
    digests = {e["Id"]: e.get("MD5OfMessageSystemAttributes") for e in batch["Successful"]}
    assert digests == {"traced": expected, "plain": None}
    assert [(e["Id"], e["Code"]) for e in batch["Failed"]] == [("bad", "InvalidParameterValue")]
    plain = c.send_message(QueueUrl=url, MessageBody="e", MessageSystemAttributes={})
    assert "MD5OfMessageSystemAttributes" not in plain
    version = version_of(broker.path)
    lone = {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=\ud800"}}
    error = refused(c.send_message, QueueUrl=url, MessageBody="f", MessageSystemAttributes=lone)
    assert code_of(error) == "InvalidParameterValue"
    assert "AWSTraceHeader" in error.response["Error"]["Message"]
    assert version_of(broker.path) == version
    got = c.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["AWSTraceHeader"]
    )["Messages"]
    traces = {m["Body"]: m.get("Attributes", {}).get("AWSTraceHeader") for m in got}
    assert traces == {"a": trace, "b": trace, "c": None, "e": None}


# -- queue names and CreateQueue -----------------------------------------------------------


def settings_files(path: str) -> list[str]:
    folder = Path(path) / SETTINGS_FOLDER
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_create_queue_takes_sqs_names_and_a_refused_one_writes_nothing(c, broker):
    c.create_queue(QueueName="names-first")  # the table and the settings folder exist
    table = QueueTable(broker.path, broker="off")
    queues, files, version = table.queues(), settings_files(broker.path), version_of(broker.path)
    for name, attributes in (
        ("x" * 234, {}),
        ("x" * 81, {}),
        (".", {}),
        ("..", {}),
        (".fifo", {"FifoQueue": "true"}),
        ("x" * 76 + ".fifo", {"FifoQueue": "true"}),
        ("plain.fifo", {}),  # a FIFO queue's name, without FifoQueue true
        ("plain", {"FifoQueue": "true"}),
        ("a.b", {}),
        ("a b", {}),
        ("a\n", {}),
    ):
        error = refused(c.create_queue, QueueName=name, Attributes=attributes)
        assert code_of(error) == "InvalidParameterValue", name
        assert "1 to 80" in error.response["Error"]["Message"], name
    assert (table.queues(), settings_files(broker.path)) == (queues, files)
    assert version_of(broker.path) == version
    longest = "y" * 80
    assert c.create_queue(QueueName=longest)["QueueUrl"].endswith("/" + longest)
    fifo = "z" * 75 + ".fifo"
    c.create_queue(QueueName=fifo, Attributes={"FifoQueue": "true"})
    c.tag_queue(QueueUrl=queue_url(sqs_url(broker), fifo), Tags={"kept": "yes"})
    assert {longest, fifo} <= set(QueueTable(broker.path, broker="off").queues())


def test_create_queue_with_other_attributes_names_the_sqs_attribute_and_writes_nothing(c, broker):
    url = c.create_queue(
        QueueName="settled",
        Attributes={"VisibilityTimeout": "40", "MessageRetentionPeriod": "600"},
    )["QueueUrl"]
    version, files = version_of(broker.path), settings_files(broker.path)
    for attribute, value in (("VisibilityTimeout", "41"), ("MessageRetentionPeriod", "601")):
        error = refused(c.create_queue, QueueName="settled", Attributes={attribute: value})
        assert code_of(error) == "QueueAlreadyExists"
        message = error.response["Error"]["Message"]
        assert message.endswith(f"a different value for attribute {attribute}"), message
    assert (version_of(broker.path), settings_files(broker.path)) == (version, files)
    attributes = c.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attributes["VisibilityTimeout"], attributes["MessageRetentionPeriod"]) == ("40", "600")
