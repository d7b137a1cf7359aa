"""SQS messages mapped onto queue-table rows and back (docs/SQS.md "Messages"): the pure
part, with no server.

A SendMessage request (or batch entry) is checked and becomes a row for
``QueueTable.publish``: its body, its message attributes as ``headers`` (with their data
types), ``MessageGroupId`` as ``key``, the deduplication id as ``message_id``, a delay as
``deliver_at``, the trace header; a leased row becomes a ReceiveMessage answer's message.
The MD5 digests of bodies, message attributes and system attributes are AWS's, so SDKs
that check them pass.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spark_queue.server.sqs.attributes import SqsOnly
from spark_queue.server.sqs.errors import SqsError, invalid
from spark_queue.server.sqs.names import ACCOUNT, is_fifo, queue_arn
from spark_queue.server.sqs.shapes import bounded

# Message attributes other than String ones keep their data type here (a header name no
# SQS attribute name can take: ':' is not allowed in one).
TYPES_HEADER = "sqs:types"
TRACE_HEADER = "sqs:AWSTraceHeader"
BODY_ENCODING_ATTRIBUTE = "spark-queue.body-encoding"


def message_id(queue: str, seq: int) -> str:
    """A message's ``MessageId``: a UUID that one (queue, seq) always has."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"spark-queue:{queue}:{seq}"))


_INVALID_BODY = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ATTRIBUTE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,256}$")


def _check_attribute_name(name: str, parameter: str) -> None:
    if (
        not _ATTRIBUTE_NAME.fullmatch(name)
        or name.startswith(".")
        or name.endswith(".")
        or ".." in name
        or name.lower().startswith(("aws.", "amazon."))
    ):
        raise invalid(
            parameter,
            name,
            "an attribute name is 1 to 256 of A-Z a-z 0-9 _ - ., no leading, trailing or "
            "doubled '.', not starting with AWS. or Amazon.",
        )


def message_attributes(
    given: Mapping[str, Mapping[str, Any]] | None, parameter: str = "MessageAttributes"
) -> dict[str, Any]:
    """Checked message attributes: name -> (data type, value as str or bytes).

    Raises:
        SqsError: ``InvalidParameterValue`` for a bad name, type or value.
    """
    if given is None:
        return {}
    if len(given) > 10:
        raise invalid(parameter, len(given), "a message has at most 10 attributes")
    checked: dict[str, Any] = {}
    for name, value in given.items():
        _check_attribute_name(name, f"{parameter}.{name}")
        data_type = value["DataType"]
        if not re.fullmatch(r"(String|Number|Binary)(\.[A-Za-z0-9_.\-]{1,200})?", data_type):
            raise invalid(
                f"{parameter}.{name}.DataType",
                data_type,
                "String, Number or Binary, with an optional custom type after a '.'",
            )
        if value.get("StringListValues") or value.get("BinaryListValues"):
            raise SqsError(
                "UnsupportedOperation", "StringListValues and BinaryListValues are not supported."
            )
        if data_type.startswith("Binary"):
            raw = value.get("BinaryValue")
            try:
                data = base64.b64decode(raw, validate=True) if raw is not None else None
            except ValueError:  # binascii.Error, or a str that is not ASCII
                data = None
            if not data:
                raise invalid(f"{parameter}.{name}.BinaryValue", raw, "non-empty base64 bytes")
            checked[name] = (data_type, data)
        else:
            text = value.get("StringValue")
            if not text or _INVALID_BODY.search(text):
                raise invalid(
                    f"{parameter}.{name}.StringValue",
                    text,
                    "a non-empty string of the characters a message body may hold",
                )
            if data_type.startswith("Number") and not re.fullmatch(
                r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", text
            ):
                raise invalid(
                    f"{parameter}.{name}.StringValue",
                    text,
                    "a Number attribute's value is a number",
                )
            checked[name] = (data_type, text)
    return checked


def attributes_size(attributes: Mapping[str, Any]) -> int:
    """What SQS counts of message attributes toward a message's size."""
    return sum(
        len(name.encode()) + len(data_type.encode())
        + len(value if isinstance(value, bytes) else value.encode())
        for name, (data_type, value) in attributes.items()
    )  # fmt: skip


def md5_of_attributes(attributes: Mapping[str, Any]) -> str | None:
    """``MD5OfMessageAttributes``: AWS's encoding (each attribute by name: length-prefixed
    name, data type, a transport byte, length-prefixed value), hex MD5; None for none."""
    if not attributes:
        return None
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        data_type, value = attributes[name]
        raw = value if isinstance(value, bytes) else value.encode()
        for part in (name.encode(), data_type.encode()):
            digest.update(struct.pack(">I", len(part)) + part)
        digest.update(b"\x02" if isinstance(value, bytes) else b"\x01")
        digest.update(struct.pack(">I", len(raw)) + raw)
    return digest.hexdigest()


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def headers_of(attributes: Mapping[str, Any], trace: str | None) -> dict[str, str] | None:
    """Message attributes as a message's ``headers``: a String attribute's value as it is;
    other types' values (base64 for bytes) with their data types in :data:`TYPES_HEADER`."""
    headers: dict[str, str] = {}
    types: dict[str, str] = {}
    for name, (data_type, value) in attributes.items():
        if isinstance(value, bytes):
            headers[name] = base64.b64encode(value).decode()
        else:
            headers[name] = value
        if data_type != "String":
            types[name] = data_type
    if types:
        headers[TYPES_HEADER] = json.dumps(types, sort_keys=True, separators=(",", ":"))
    if trace is not None:
        headers[TRACE_HEADER] = trace
    return headers or None


def attributes_of_headers(headers: Any) -> dict[str, Any]:
    """A message's attributes from its ``headers`` (every header of a message written by
    Spark or ``QueueTable`` is a String attribute)."""
    if not headers:
        return {}
    pairs = dict(headers)
    pairs.pop(TRACE_HEADER, None)
    try:
        types = json.loads(pairs.pop(TYPES_HEADER, "{}"))
    except ValueError:
        types = {}
    attributes: dict[str, Any] = {}
    for name, value in pairs.items():
        if value is None or not _ATTRIBUTE_NAME.fullmatch(name):
            continue  # no SQS attribute can carry it
        data_type = types.get(name, "String") if isinstance(types, dict) else "String"
        if data_type.startswith("Binary"):
            try:
                attributes[name] = (data_type, base64.b64decode(value, validate=True))
            except ValueError:
                attributes[name] = ("String", value)
        else:
            attributes[name] = (data_type, value)
    return attributes


def wire_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Message attributes as SQS's JSON writes them."""
    answer = {}
    for name, (data_type, value) in attributes.items():
        if isinstance(value, bytes):
            answer[name] = {"DataType": data_type, "BinaryValue": base64.b64encode(value).decode()}
        else:
            answer[name] = {"DataType": data_type, "StringValue": value}
    return answer


def selected(attributes: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """The attributes ``MessageAttributeNames`` asks for (``All``, ``.*``, a ``prefix.*``)."""
    if not names:
        return {}
    if "All" in names or ".*" in names:
        return dict(attributes)
    prefixes = tuple(n[:-1] for n in names if n.endswith(".*"))
    return {
        name: value
        for name, value in attributes.items()
        if name in names or (prefixes and name.startswith(prefixes))
    }


@dataclass(frozen=True)
class Outgoing:
    """One message of a SendMessage(Batch), checked, as it is published."""

    row: dict[str, Any]
    size: int  # what SQS counts: the body's bytes and the attributes'
    md5_body: str
    md5_attributes: str | None
    md5_system_attributes: str | None
    dedup_id: str | None


def outgoing(
    entry: Mapping[str, Any],
    queue: str,
    sqs: SqsOnly,
    now_us: int,
) -> Outgoing:
    """A SendMessage request (or batch entry) as a row for ``QueueTable.publish``.

    Raises:
        SqsError: a missing or invalid member, a body too large for the queue.
    """
    body: str = entry["MessageBody"]
    if not body:
        raise invalid("MessageBody", body, "a message body is 1 character at least")
    if _INVALID_BODY.search(body):
        raise SqsError(
            "InvalidMessageContents",
            "Invalid characters found. A message body holds #x9, #xA, #xD, #x20 to #xD7FF, "
            "#xE000 to #xFFFD and #x10000 to #x10FFFF only.",
        )
    attributes = message_attributes(entry.get("MessageAttributes"))
    trace = trace_header(entry.get("MessageSystemAttributes"))
    raw = body.encode()
    size = len(raw) + attributes_size(attributes)
    if size > sqs.maximum_message_size:
        raise invalid(
            "MessageBody",
            f"{size} bytes",
            f"Message must be shorter than {sqs.maximum_message_size} bytes (the queue's "
            f"MaximumMessageSize).",
        )
    delay = bounded(entry, "DelaySeconds", 0, 900)
    group: str | None = entry.get("MessageGroupId")
    dedup: str | None = entry.get("MessageDeduplicationId")
    for name, value in (("MessageGroupId", group), ("MessageDeduplicationId", dedup)):
        if value is not None and not re.fullmatch(r"[!-~]{1,128}", value):
            raise invalid(name, value, "1 to 128 printable ASCII characters, no spaces")
    if is_fifo(queue):
        if delay:
            raise invalid(
                "DelaySeconds", delay, "The request include parameter that is not valid for "
                "this queue type: FIFO queues take a delay per queue only",
            )  # fmt: skip
        if group is None:
            raise SqsError(
                "MissingParameter",
                "The request must contain the parameter MessageGroupId.",
            )
        if dedup is None:
            if not sqs.content_based_deduplication:
                raise invalid(
                    "MessageDeduplicationId",
                    None,
                    "The queue should either have ContentBasedDeduplication enabled or "
                    "MessageDeduplicationId provided explicitly",
                )
            dedup = hashlib.sha256(raw).hexdigest()
    elif dedup is not None:
        raise invalid(
            "MessageDeduplicationId", dedup, "The request include parameter that is not "
            "valid for this queue type",
        )  # fmt: skip
    delay = sqs.delay_seconds if delay is None else delay
    row: dict[str, Any] = {"body": raw, "headers": headers_of(attributes, trace)}
    if group is not None:
        row["key"] = group
    if dedup is not None:
        row["message_id"] = dedup
    if delay:
        row["deliver_at"] = _timestamp(now_us + delay * 1_000_000)
    system = md5_of_attributes({} if trace is None else {"AWSTraceHeader": ("String", trace)})
    return Outgoing(row, size, md5_hex(raw), md5_of_attributes(attributes), system, dedup)


def trace_header(given: Mapping[str, Mapping[str, Any]] | None) -> str | None:
    """The ``AWSTraceHeader`` of a send's ``MessageSystemAttributes``, the one system
    attribute a sender sets (None where there is none: an empty map sets none).

    Raises:
        SqsError: ``InvalidParameterValue``: another name, or not a String value of the
            characters a message body may hold.
    """
    if not given:
        return None
    if set(given) != {"AWSTraceHeader"}:
        raise invalid("MessageSystemAttributes", given, "AWSTraceHeader is the one name")
    value = given["AWSTraceHeader"]
    text: str | None = value.get("StringValue")
    if (
        not text
        or _INVALID_BODY.search(text)
        or value.get("DataType") != "String"
        or any(value.get(m) for m in ("BinaryValue", "StringListValues", "BinaryListValues"))
    ):
        raise invalid(
            "MessageSystemAttributes.AWSTraceHeader",
            value,
            "a String value (DataType String, a StringValue of the characters a message body "
            "may hold)",
        )
    return text


def _timestamp(micros: int) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(micros / 1e6, tz=dt.timezone.utc)


def incoming(
    row: Mapping[str, Any],
    queue: str,
    system_names: list[str],
    attribute_names: list[str],
    received_at_ms: int,
    handle: str,
) -> dict[str, Any]:
    """A leased row as a ReceiveMessage answer's message, with its receipt ``handle``."""
    raw = row["body"] or b""
    attributes = attributes_of_headers(row.get("headers"))
    try:
        body = raw.decode()
        if _INVALID_BODY.search(body):
            raise ValueError
    except ValueError:  # bytes no SQS body can hold: delivered as base64, and said so
        body = base64.b64encode(raw).decode()
        attributes[BODY_ENCODING_ATTRIBUTE] = ("String", "base64")
    seq, deliveries = int(row["seq"]), int(row["delivery_count"])
    message: dict[str, Any] = {
        "MessageId": message_id(queue, seq),
        "ReceiptHandle": handle,
        "MD5OfBody": md5_hex(body.encode()),
        "Body": body,
    }
    chosen = selected(attributes, attribute_names)
    if chosen:
        message["MessageAttributes"] = wire_attributes(chosen)
        message["MD5OfMessageAttributes"] = md5_of_attributes(chosen)
    if system_names:
        every = "All" in system_names
        headers = dict(row.get("headers") or {})
        enqueued = row.get("enqueued_at")
        values = {
            "SenderId": ACCOUNT,
            "SentTimestamp": str(_millis(enqueued) if enqueued is not None else 0),
            "ApproximateReceiveCount": str(deliveries),
            # The table keeps no first-delivery time: this delivery's time for the first.
            "ApproximateFirstReceiveTimestamp": str(received_at_ms),
        }
        if row.get("key") is not None:
            values["MessageGroupId"] = row["key"]
        if is_fifo(queue):
            values["SequenceNumber"] = str(seq)
            if row.get("message_id") is not None:
                values["MessageDeduplicationId"] = row["message_id"]
        if TRACE_HEADER in headers:
            values["AWSTraceHeader"] = headers[TRACE_HEADER]
        if row.get("original_queue"):
            values["DeadLetterQueueSourceArn"] = queue_arn(row["original_queue"])
        message["Attributes"] = {k: v for k, v in values.items() if every or k in system_names}
    return message


def _millis(value: Any) -> int:
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1000)
    return int(value) // 1000  # microseconds
