"""A fuzz test of the SQS port: every action of SQS's service model (botocore's), every
member of its request, given the wrong JSON type, left out where required, given twice,
given text no Unicode string holds or an integer beyond its range. Each such request gets
an SQS-shaped error (HTTP 400, ``__type`` and ``x-amzn-query-error`` as SQS sends them,
never a 500 or plain text) and writes nothing: the table's log and the broker's files under
``_spark_queue/`` stay as they were. Sent by boto3 where it can send them (with its own
parameter checks off), as raw HTTP where it cannot (a member given twice, a shape botocore
cannot serialise). The wrong values are drawn from the printed seed; every request's
members are valid but for the one changed, which the valid requests sent last prove."""

from __future__ import annotations

import base64
import copy
import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore import xform_name
from botocore.config import Config
from botocore.loaders import Loader
from botocore.model import ServiceModel, Shape

from spark_queue.broker.discovery import BROKERS_FOLDER
from spark_queue.server.sqs.errors import ERRORS
from spark_queue.server.sqs.http import CONTENT_TYPE
from spark_queue.server.sqs.names import ACCOUNT
from tests.brokers import BrokerProcess
from tests.test_sqs import client, sqs_url

MODEL = ServiceModel(Loader().load_service_model("sqs", "service-2"))
UNSERVED = (
    "AddPermission",
    "RemovePermission",
    "StartMessageMoveTask",
    "CancelMessageMoveTask",
    "ListMessageMoveTasks",
)
# Values of every JSON type but the one a shape takes.
WRONG: dict[str, list[Any]] = {
    "string": [5, True, 1.5, [], {}],
    "blob": [5, False, ["AAE="], {}],
    "integer": ["5", 1.5, True, [], {}],
    "boolean": ["true", 1, [], {}],
    "list": ["x", 5, {}, True],
    "map": ["x", 5, [], True],
    "structure": ["x", 5, [], True],
}
Path_ = tuple[str | int, ...]


def baselines(url: str, other: str, handle: str) -> dict[str, dict[str, Any]]:
    """A valid request of each action the broker serves, with as many members as its
    action takes at once (``other``: a queue the destructive actions may act on)."""
    attributes = {
        "text": {"DataType": "String", "StringValue": "v"},
        "bytes": {"DataType": "Binary", "BinaryValue": base64.b64encode(b"\0\1").decode()},
    }
    system = {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-0-0"}}
    message = {
        "MessageBody": "body",
        "DelaySeconds": 0,
        "MessageAttributes": attributes,
        "MessageSystemAttributes": system,
    }
    return {
        "CreateQueue": {"QueueName": "fuzz", "Attributes": {"DelaySeconds": "0"}, "tags": {}},
        "GetQueueUrl": {"QueueName": "fuzz", "QueueOwnerAWSAccountId": ACCOUNT},
        "ListQueues": {
            "QueueNamePrefix": "fuzz",
            "NextToken": base64.urlsafe_b64encode(b"a").decode(),
            "MaxResults": 10,
        },
        "GetQueueAttributes": {"QueueUrl": url, "AttributeNames": ["All"]},
        "SetQueueAttributes": {"QueueUrl": url, "Attributes": {"DelaySeconds": "0"}},
        "TagQueue": {"QueueUrl": url, "Tags": {"team": "fuzz"}},
        "UntagQueue": {"QueueUrl": url, "TagKeys": ["team"]},
        "ListQueueTags": {"QueueUrl": url},
        "ListDeadLetterSourceQueues": {"QueueUrl": url, "NextToken": "x", "MaxResults": 10},
        "SendMessage": {"QueueUrl": url, **message},
        "SendMessageBatch": {"QueueUrl": url, "Entries": [{"Id": "one", **message}]},
        "ReceiveMessage": {
            "QueueUrl": url,
            "AttributeNames": ["All"],
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
            "MaxNumberOfMessages": 1,
            "VisibilityTimeout": 600,
            "WaitTimeSeconds": 0,
            "ReceiveRequestAttemptId": "attempt",
        },
        "ChangeMessageVisibility": {
            "QueueUrl": url,
            "ReceiptHandle": handle,
            "VisibilityTimeout": 600,
        },
        "ChangeMessageVisibilityBatch": {
            "QueueUrl": url,
            "Entries": [{"Id": "one", "ReceiptHandle": handle, "VisibilityTimeout": 600}],
        },
        "DeleteMessageBatch": {
            "QueueUrl": url,
            "Entries": [{"Id": "one", "ReceiptHandle": handle}],
        },
        "DeleteMessage": {"QueueUrl": url, "ReceiptHandle": handle},
        "PurgeQueue": {"QueueUrl": other},
        "DeleteQueue": {"QueueUrl": other},
    }


def made_up(shape: Shape, rng: random.Random) -> Any:
    """A value of ``shape``'s type (for the actions the broker does not serve)."""
    kind = shape.type_name
    if kind == "structure":
        return {name: made_up(member, rng) for name, member in shape.members.items()}
    if kind == "list":
        return [made_up(shape.member, rng)]
    if kind == "map":
        return {"key": made_up(shape.value, rng)}
    if kind == "integer" or kind == "long":
        return rng.randrange(1, 100)
    if kind == "boolean":
        return True
    return "value"


def member_names(shape: Shape) -> set[str]:
    """Every member name of every structure in ``shape``."""
    if shape.type_name == "structure":
        return {n for name, m in shape.members.items() for n in {name, *member_names(m)}}
    if shape.type_name == "list":
        return member_names(shape.member)
    if shape.type_name == "map":
        return member_names(shape.value)
    return set()


def surrogate_text(rng: random.Random) -> str:
    """Text with a lone surrogate (valid JSON once escaped; no Unicode string)."""
    return "x" * rng.randrange(0, 4) + chr(rng.randrange(0xD800, 0xE000)) + "y"


def mutations(
    shape: Shape, value: Any, path: Path_, rng: random.Random
) -> Iterator[tuple[str, Path_, tuple[Any, ...]]]:
    """What is tried on the member at ``path``: (the SQS error code it must get, the path,
    the change: ("set", v), ("delete",), ("twice", member) or ("rekey", key, new))."""
    kind = shape.type_name
    for wrong in WRONG[kind]:  # a body that is not an object is no request
        yield "InvalidParameterValue" if path else "SerializationException", path, ("set", wrong)
    if kind in ("string", "blob"):
        yield "InvalidParameterValue", path, ("set", surrogate_text(rng))
    elif kind == "integer":
        yield "InvalidParameterValue", path, ("set", rng.choice([2**31, -(2**31) - 1, 2**64]))
    elif kind == "structure" and isinstance(value, dict):
        for name in value:
            yield "SerializationException", path, ("twice", name)
        for name, member in shape.members.items():
            if name not in value:  # an optional member it lacks: given, wrongly typed
                yield (
                    "InvalidParameterValue",
                    (*path, name),
                    ("set", rng.choice(WRONG[member.type_name])),
                )
                continue
            if name in shape.required_members:
                yield "MissingParameter", (*path, name), ("delete",)
            yield from mutations(member, value[name], (*path, name), rng)
    elif kind == "list" and value:
        yield "InvalidParameterValue", (*path, 0), ("set", None)
        yield from mutations(shape.member, value[0], (*path, 0), rng)
    elif kind == "map" and value:
        key = rng.choice(sorted(value))
        yield "InvalidParameterValue", (*path, key), ("set", None)
        yield "InvalidParameterValue", path, ("rekey", key, surrogate_text(rng))
        yield from mutations(shape.value, value[key], (*path, key), rng)


def changed(request: dict[str, Any], path: Path_, change: tuple[Any, ...]) -> Any:
    """A copy of ``request`` with ``change`` made at ``path`` (not for "twice")."""
    if not path:
        return change[1]
    copied = copy.deepcopy(request)
    parent = copied
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if change[0] == "set":
        parent[last] = change[1]
    elif change[0] == "delete":
        del parent[last]
    else:  # rekey
        holder = parent[last]
        holder[change[2]] = holder.pop(change[1])
    return copied


def json_with_twice(value: Any, path: Path_, name: str) -> str:
    """``value`` as JSON text whose object at ``path`` gives member ``name`` twice (a
    different value first, so neither reading is right by chance)."""

    def inner(step: str | int, item: Any) -> str:
        return (
            json_with_twice(item, path[1:], name) if path and step == path[0] else json.dumps(item)
        )

    if isinstance(value, list):
        return "[" + ", ".join(inner(i, v) for i, v in enumerate(value)) + "]"
    members = [f"{json.dumps(k)}: {inner(k, v)}" for k, v in value.items()]
    if not path:
        members.insert(0, f"{json.dumps(name)}: {json.dumps('first of two')}")
    return "{" + ", ".join(members) + "}"


def written(root: Path) -> dict[str, tuple[int, int]]:
    """The table's log and the broker's files (but its heartbeat record): name -> size,
    modification time."""
    found = {}
    for folder in (root / "_delta_log", root / "_spark_queue"):
        for path in folder.rglob("*"):
            if path.is_file() and BROKERS_FOLDER not in path.as_posix():
                status = path.stat()
                found[str(path.relative_to(root))] = (status.st_size, status.st_mtime_ns)
    return found


class NotAsIntended(Exception):
    """botocore would send other JSON than the request's (it makes a list of a map's keys,
    say): the request goes as raw HTTP instead."""


def for_boto(shape: Shape, value: Any) -> Any:
    """``value`` as boto3 takes it: bytes where a blob member holds base64 (botocore
    encodes blobs itself)."""
    if shape.type_name == "blob" and isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            return value
    if shape.type_name == "structure" and isinstance(value, dict):
        return {
            k: for_boto(shape.members[k], v) if k in shape.members else v for k, v in value.items()
        }
    if shape.type_name == "list" and isinstance(value, list):
        return [for_boto(shape.member, v) for v in value]
    if shape.type_name == "map" and isinstance(value, dict):
        return {k: for_boto(shape.value, v) for k, v in value.items()}
    return value


class Sender:
    """Sends a request: through boto3 where botocore sends it as it is, else as raw HTTP.
    Returns the status, SQS's error code, the x-amzn-query-error header and the content
    type; a request that succeeds fails the test."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.boto = boto3.client(
            "sqs",
            endpoint_url=endpoint,
            region_name="eu-west-1",
            aws_access_key_id="AKIDFUZZ",
            aws_secret_access_key="fuzz",
            config=Config(parameter_validation=False, retries={"max_attempts": 1}),
        )
        self.intended: Any = None
        self.boto.meta.events.register("before-send.sqs.*", self._check)
        self.counts = {"boto3": 0, "raw": 0}

    def _check(self, request: Any, **_: Any) -> None:
        if json.loads(request.body) != self.intended:
            raise NotAsIntended

    def send(self, action: str, request: Any, text: str | None, what: str) -> tuple[Any, ...]:
        if text is None and isinstance(request, dict):
            self.intended = json.loads(json.dumps(request))
            shape = MODEL.operation_model(action).input_shape
            try:
                getattr(self.boto, xform_name(action))(**for_boto(shape, request))
            except botocore.exceptions.ClientError as error:
                self.counts["boto3"] += 1
                meta = error.response["ResponseMetadata"]
                headers = meta["HTTPHeaders"]
                return (
                    meta["HTTPStatusCode"],
                    error.response["Error"]["Code"],
                    headers.get("x-amzn-query-error"),
                    headers.get("content-type"),
                )
            except (NotAsIntended, TypeError, AttributeError, ValueError):
                pass  # botocore would not send it as it is: raw HTTP below
            else:
                raise AssertionError(f"{action} {what}: accepted")
        return self._raw(action, text if text is not None else json.dumps(request), what)

    def _raw(self, action: str, text: str, what: str) -> tuple[Any, ...]:
        self.counts["raw"] += 1
        request = urllib.request.Request(
            self.endpoint + "/",
            data=text.encode(),
            method="POST",
            headers={"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": CONTENT_TYPE},
        )
        try:
            with urllib.request.urlopen(request, timeout=30):
                raise AssertionError(f"{action} {what}: accepted")
        except urllib.error.HTTPError as error:
            body = error.read()
            try:
                kind = json.loads(body)["__type"]
            except (ValueError, KeyError, TypeError):
                raise AssertionError(f"{action} {what}: not SQS's error: {body[:200]!r}") from None
            assert kind.startswith("com.amazonaws.sqs#"), (action, what, kind)
            return (
                error.code,
                kind.split("#", 1)[1],
                error.headers.get("x-amzn-query-error"),
                error.headers.get("Content-Type"),
            )


# The code boto3 reports: SQS's query code, which the x-amzn-query-error header carries.
def reported(code: str) -> set[str]:
    return {code, ERRORS[code][0]}


@pytest.mark.timeout(300)
def test_every_member_of_every_action_wrongly_given_gets_an_sqs_error_and_writes_nothing(
    tmp_path, seed
):
    rng = random.Random(seed)
    path = tmp_path / "queues"
    with BrokerProcess(
        str(path), "--sqs", "127.0.0.1:0", log_path=tmp_path / "broker.log"
    ) as broker:
        endpoint = sqs_url(broker)
        c = client(endpoint)
        url = c.create_queue(QueueName="fuzz")["QueueUrl"]
        other = c.create_queue(QueueName="fuzz-other")["QueueUrl"]
        c.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "m"} for i in range(2)]
        )
        [held] = c.receive_message(QueueUrl=url, VisibilityTimeout=43_000)["Messages"]
        requests = baselines(url, other, held["ReceiptHandle"])
        for action in UNSERVED:
            requests[action] = made_up(MODEL.operation_model(action).input_shape, rng)
        assert sorted(requests) == sorted(MODEL.operation_names)  # every action
        sender = Sender(endpoint)
        before = written(path)
        tried = 0
        touched: dict[str, set[str | int]] = {action: set() for action in requests}
        started = time.monotonic()
        for action in sorted(requests):
            request = requests[action]
            shape = MODEL.operation_model(action).input_shape
            for code, at, change in mutations(shape, request, (), rng):
                what = f"{'.'.join(map(str, at)) or 'the body'}: {change!r:.80}"
                if change[0] == "twice":
                    sent = sender.send(action, None, json_with_twice(request, at, change[1]), what)
                else:
                    sent = sender.send(action, changed(request, at, change), None, what)
                status, answered, query_error, content_type = sent
                expected = "UnknownOperationException" if action in UNSERVED else code
                assert status == 400, (action, what, sent)
                assert answered in reported(expected), (action, what, sent)
                assert query_error == f"{ERRORS[expected][0]};Sender", (action, what, sent)
                assert content_type.startswith(CONTENT_TYPE), (action, what, sent)
                assert written(path) == before, (action, what)
                tried += 1
                touched[action].update(at)
        print(f"{tried} requests ({sender.counts}) in {time.monotonic() - started:.1f} s")
        for action, names in touched.items():  # every member, in every action
            assert member_names(MODEL.operation_model(action).input_shape) <= names, action
        assert min(sender.counts.values()) > 100
        # Every request was valid but for the member changed: the valid ones are taken.
        for action, request in requests.items():
            if action not in UNSERVED:
                getattr(c, xform_name(action))(**request)
