"""Amazon SQS's API mapped onto queue tables (docs/SQS.md): the pure part, with no server.

What an SQS request means for a :class:`~spark_queue.QueueTable` and how its answer is
written: queue URLs and ARNs, receipt handles, queue attributes to queue arguments and
back, messages and their attributes to rows and back (with the MD5 digests SDKs check),
SQS's errors. Signatures are :mod:`spark_queue.broker.sigv4`'s; the HTTP server that uses
both is :mod:`spark_queue.broker.sqs_server`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spark_queue.errors import InvalidOptionError
from spark_queue.model.arguments import ARGUMENTS, QUEUE_NAME
from spark_queue.model.queue_arguments import QueueArguments, validate_arguments

ACCOUNT = "000000000000"  # the account id in queue URLs and ARNs
REGION = "us-east-1"  # the region in ARNs (requests may be signed for any region)
CONSUMER = "sqs"  # the consumer name SQS receives lease as
KEYS_ENV_VAR = "SPARK_QUEUE_SQS_KEYS"
TARGET_PREFIX = "AmazonSQS."
CONTENT_TYPE = "application/x-amz-json-1.0"

MAX_MESSAGE_BYTES = 1_048_576  # SQS's largest body (with its attributes), and a batch's
MAX_BATCH = 10
MAX_RECEIVE_WAIT_SECONDS = 20
MAX_VISIBILITY_SECONDS = 43_200
DEFAULT_VISIBILITY_SECONDS = 30
FIFO_DEDUP_MS = 300_000  # SQS FIFO's five-minute deduplication interval
DEFAULT_RETENTION_SECONDS = 345_600  # 4 days, SQS's default
MAX_LIST_RESULTS = 1000
# Message attributes other than String ones keep their data type here (a header name no
# SQS attribute name can take: ':' is not allowed in one).
TYPES_HEADER = "sqs:types"
TRACE_HEADER = "sqs:AWSTraceHeader"
BODY_ENCODING_ATTRIBUTE = "spark-queue.body-encoding"

# SQS's errors: the code of the JSON protocol (the model's shape name), the code SDKs read
# from ``x-amzn-query-error`` (the query protocol's, which older code catches), the status.
ERRORS: dict[str, tuple[str, int]] = {
    "QueueDoesNotExist": ("AWS.SimpleQueueService.NonExistentQueue", 400),
    "QueueNameExists": ("QueueAlreadyExists", 400),
    "InvalidParameterValue": ("InvalidParameterValue", 400),
    "MissingParameter": ("MissingParameter", 400),
    "InvalidAttributeName": ("InvalidAttributeName", 400),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 400),
    "BatchEntryIdsNotDistinct": ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400),
    "EmptyBatchRequest": ("AWS.SimpleQueueService.EmptyBatchRequest", 400),
    "InvalidBatchEntryId": ("AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    "TooManyEntriesInBatchRequest": (
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        400,
    ),
    "BatchRequestTooLong": ("AWS.SimpleQueueService.BatchRequestTooLong", 400),
    "MessageNotInflight": ("AWS.SimpleQueueService.MessageNotInflight", 400),
    "InvalidMessageContents": ("InvalidMessageContents", 400),
    "UnsupportedOperation": ("AWS.SimpleQueueService.UnsupportedOperation", 400),
    "InvalidAddress": ("InvalidAddress", 404),
    "OverLimit": ("OverLimit", 403),
    "UnknownOperationException": ("InvalidAction", 400),
    "SerializationException": ("MalformedInput", 400),
    "MissingAuthenticationToken": ("MissingAuthenticationToken", 403),
    "IncompleteSignature": ("IncompleteSignature", 403),
    "InvalidClientTokenId": ("InvalidClientTokenId", 403),
    "SignatureDoesNotMatch": ("SignatureDoesNotMatch", 403),
    "RequestExpired": ("RequestExpired", 403),
    "RequestTimeout": ("RequestTimeout", 408),
    "ServiceUnavailable": ("ServiceUnavailable", 503),
    "InternalError": ("InternalError", 500),
}


class SqsError(Exception):
    """An SQS error answer: ``code`` is a key of :data:`ERRORS`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.query_code, self.status = ERRORS[code]

    @property
    def sender_fault(self) -> bool:
        return self.status < 500

    def body(self) -> bytes:
        return json.dumps(
            {"__type": f"com.amazonaws.sqs#{self.code}", "message": self.message}
        ).encode()

    def headers(self) -> dict[str, str]:
        fault = "Sender" if self.sender_fault else "Receiver"
        return {"x-amzn-query-error": f"{self.query_code};{fault}"}


def invalid(parameter: str, value: Any, reason: str) -> SqsError:
    """SQS's ``InvalidParameterValue``, naming the parameter (a value is shown cut short)."""
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return SqsError(
        "InvalidParameterValue",
        f"Value {shown} for parameter {parameter} is invalid. Reason: {reason}",
    )


# -- request members -----------------------------------------------------------------------


def member(request: Mapping[str, Any], name: str, kind: type, required: bool = False) -> Any:
    """A request member of ``kind`` (None where absent and not required)."""
    value = request.get(name)
    if value is None:
        if required:
            raise SqsError("MissingParameter", f"The request must contain the parameter {name}.")
        return None
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(name, value, "must be an integer")
    elif not isinstance(value, kind):
        raise invalid(name, value, f"must be a {kind.__name__}")
    return value


def integer(request: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = member(request, name, int)
    if value is not None and not low <= value <= high:
        raise invalid(name, value, f"must be between {low} and {high}")
    return value


def strings(request: Mapping[str, Any], name: str) -> list[str]:
    values = member(request, name, list) or []
    if not all(isinstance(v, str) for v in values):
        raise invalid(name, values, "must be a list of strings")
    return values


# -- queues --------------------------------------------------------------------------------


def is_fifo(name: str) -> bool:
    return name.endswith(".fifo")


def queue_url(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{ACCOUNT}/{name}"


def queue_arn(name: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"


def check_queue_name(name: Any, parameter: str = "QueueName") -> str:
    if not isinstance(name, str) or not QUEUE_NAME.match(name):
        raise invalid(
            parameter,
            name,
            "a queue name is 1 to 255 characters of A-Z a-z 0-9 _ . - (a FIFO queue's "
            "ends in .fifo)",
        )
    return name


def name_of_url(url: Any) -> str:
    """The queue a ``QueueUrl`` names: its last path segment (the host is not checked: a
    client may reach the broker by another name than the one an answer gave)."""
    if not isinstance(url, str) or not url:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    if not QUEUE_NAME.match(name):
        raise SqsError("InvalidAddress", f"The address {url[:300]} is not valid for this endpoint.")
    return name


def name_of_arn(arn: Any, parameter: str) -> str:
    parts = arn.split(":") if isinstance(arn, str) else []
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not QUEUE_NAME.match(parts[5]):
        raise invalid(parameter, arn, "not an SQS queue ARN (arn:aws:sqs:REGION:ACCOUNT:NAME)")
    return parts[5]


# -- receipt handles -----------------------------------------------------------------------

_HANDLE_PREFIX = "sq1"


def receipt_handle(queue: str, seq: int, deliveries: int) -> str:
    """An opaque handle of one delivery of one message: the queue, the seq and the delivery
    count (a later delivery has another count, so this handle no longer matches it)."""
    text = f"{queue}\n{seq}\n{deliveries}".encode()
    return f"{_HANDLE_PREFIX}.{base64.urlsafe_b64encode(text).decode().rstrip('=')}"


def parse_receipt_handle(handle: Any, queue: str) -> tuple[int, int]:
    """The seq and delivery count of ``queue``'s handle.

    Raises:
        SqsError: ``ReceiptHandleIsInvalid`` (not a handle, or another queue's).
    """
    refusal = SqsError(
        "ReceiptHandleIsInvalid", f"The input receipt handle {str(handle)[:100]!r} is not valid."
    )
    if not isinstance(handle, str) or not handle.startswith(_HANDLE_PREFIX + "."):
        if handle is None or handle == "":
            raise SqsError(
                "MissingParameter", "The request must contain the parameter ReceiptHandle."
            )
        raise refusal
    encoded = handle[len(_HANDLE_PREFIX) + 1 :]
    if not re.fullmatch(r"[A-Za-z0-9_-]{4,1400}", encoded):
        raise refusal
    try:
        text = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        name, seq, deliveries = text.split("\n")
        parsed = int(seq), int(deliveries)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise refusal from None
    if name != queue or parsed[0] < 0 or parsed[1] < 1:
        raise refusal
    return parsed


def message_id(queue: str, seq: int) -> str:
    """A message's ``MessageId``: a UUID that one (queue, seq) always has."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"spark-queue:{queue}:{seq}"))


# -- queue attributes ----------------------------------------------------------------------


@dataclass(frozen=True)
class SqsOnly:
    """What SQS keeps of a queue that queue arguments do not: the defaults of its sends and
    receives, its tags, whether content-based deduplication is on, and whether the queue
    was deleted through SQS. Kept beside the table (:mod:`spark_queue.broker.sqs_server`)."""

    visibility_timeout: int = DEFAULT_VISIBILITY_SECONDS
    delay_seconds: int = 0
    maximum_message_size: int = MAX_MESSAGE_BYTES
    receive_wait_seconds: int = 0
    content_based_deduplication: bool = False
    tags: tuple[tuple[str, str], ...] = ()
    created: int = 0
    modified: int = 0
    deleted: bool = False

    def to_json(self) -> str:
        data = {**self.__dict__, "tags": dict(self.tags)}
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SqsOnly:
        data = json.loads(text)
        data["tags"] = tuple(sorted(data.get("tags", {}).items()))
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


# SQS attributes settable with CreateQueue / SetQueueAttributes: (low, high) for numbers.
_SQS_NUMBERS = {
    "VisibilityTimeout": (0, MAX_VISIBILITY_SECONDS, "visibility_timeout"),
    "DelaySeconds": (0, 900, "delay_seconds"),
    "MaximumMessageSize": (1024, MAX_MESSAGE_BYTES, "maximum_message_size"),
    "ReceiveMessageWaitTimeSeconds": (0, MAX_RECEIVE_WAIT_SECONDS, "receive_wait_seconds"),
}
SETTABLE = (
    *_SQS_NUMBERS,
    "MessageRetentionPeriod",
    "RedrivePolicy",
    "FifoQueue",
    "ContentBasedDeduplication",
)
# The ring-queue arguments SQS lacks, as attributes of their Spark option names.
EXTRA = {ARGUMENTS[name].option: name for name in (
    "max_length", "max_length_bytes", "overflow", "ring_size", "dead_letter_queue",
    "reject_threshold", "expiration", "expiration_model", "max_deliveries", "max_cancels",
    "exclusive", "redelivery_delay", "redelivery_multiplier", "max_redelivery_delay",
    "message_groups", "duplicate_window",
)}  # fmt: skip
READ_ONLY = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
)


@dataclass(frozen=True)
class AttributeChange:
    """What a CreateQueue's or SetQueueAttributes's attributes ask for."""

    arguments: dict[str, Any]  # queue arguments, snake_case, parsed
    sqs: dict[str, Any]  # fields of SqsOnly


def parse_attributes(
    name: str, attributes: Any, *, creating: bool, queues: frozenset[str] = frozenset()
) -> AttributeChange:
    """The queue arguments and SQS-only settings of ``attributes``. ``queues``: those a
    redrive policy may name as its dead-letter queue.

    Raises:
        SqsError: ``InvalidAttributeName`` for an unknown (or read-only) attribute,
            ``InvalidAttributeValue`` for a bad value.
    """
    if attributes is None:
        attributes = {}
    if not isinstance(attributes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
    ):
        raise invalid("Attributes", attributes, "a map of attribute names to strings")
    arguments: dict[str, Any] = {}
    sqs: dict[str, Any] = {}
    fifo = is_fifo(name)

    def bad(attribute: str, reason: str) -> SqsError:
        return SqsError(
            "InvalidAttributeValue",
            f"Invalid value for the parameter {attribute}. Reason: {reason}",
        )

    def whole(attribute: str, low: int, high: int) -> int:
        text = attributes[attribute]
        if not re.fullmatch(r"[0-9]{1,12}", text) or not low <= int(text) <= high:
            raise bad(attribute, f"must be a whole number from {low} to {high}")
        return int(text)

    for attribute in attributes:
        if attribute in _SQS_NUMBERS:
            low, high, field = _SQS_NUMBERS[attribute]
            sqs[field] = whole(attribute, low, high)
        elif attribute == "MessageRetentionPeriod":
            arguments["expiration"] = whole(attribute, 60, 1_209_600) * 1000
        elif attribute == "RedrivePolicy":
            arguments.update(_redrive(attributes[attribute], queues, bad))
        elif attribute == "FifoQueue":
            value = attributes[attribute].lower()
            if value not in ("true", "false") or (value == "true") != fifo:
                raise bad(attribute, "true for a queue whose name ends in .fifo, else false")
            if not creating:
                raise bad(attribute, "a queue's FifoQueue is set when it is created")
        elif attribute == "ContentBasedDeduplication":
            value = attributes[attribute].lower()
            if value not in ("true", "false") or not fifo:
                raise bad(attribute, "true or false, on a FIFO queue only")
            sqs["content_based_deduplication"] = value == "true"
        elif attribute in EXTRA:
            argument = EXTRA[attribute]
            if argument in arguments or (argument == "max_length" and "ring_size" in arguments):
                raise bad(attribute, "another attribute of this request sets it too")
            arguments[argument] = attributes[attribute]
        else:
            valid = ", ".join([*SETTABLE, *EXTRA])
            raise SqsError(
                "InvalidAttributeName",
                f"Unknown or read-only attribute {attribute[:100]!r}; settable: {valid}",
            )
    try:
        parsed = validate_arguments(arguments, surface="option")
    except InvalidOptionError as error:
        raise SqsError("InvalidAttributeValue", str(error)) from None
    return AttributeChange(parsed, sqs)


def _redrive(text: str, queues: frozenset[str], bad: Any) -> dict[str, Any]:
    if text == "":
        return {"dead_letter_queue": None, "max_deliveries": None}
    try:
        policy = json.loads(text)
    except ValueError:
        raise bad("RedrivePolicy", "not JSON") from None
    if not isinstance(policy, dict) or set(policy) - {"deadLetterTargetArn", "maxReceiveCount"}:
        raise bad("RedrivePolicy", "a JSON object of deadLetterTargetArn and maxReceiveCount")
    count = policy.get("maxReceiveCount")
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
        raise bad("RedrivePolicy", "maxReceiveCount is a whole number from 1 to 1000")
    target = name_of_arn(policy.get("deadLetterTargetArn"), "RedrivePolicy")
    if target not in queues:
        raise bad("RedrivePolicy", f"Dead letter target does not exist: {target}")
    return {"dead_letter_queue": target, "max_deliveries": count}


def queue_attributes(
    name: str,
    arguments: QueueArguments,
    sqs: SqsOnly,
    stats: Mapping[str, Any] | None,
    wanted: list[str],
) -> dict[str, str]:
    """GetQueueAttributes's answer: ``wanted`` names (``All``: every SQS attribute and every
    extra one). ``stats``: the queue's, for ``Approximate*`` (None where none is wanted).

    Raises:
        SqsError: ``InvalidAttributeName`` for a name that is none of them.
    """
    everything: dict[str, str] = {
        "QueueArn": queue_arn(name),
        "VisibilityTimeout": str(sqs.visibility_timeout),
        "DelaySeconds": str(sqs.delay_seconds),
        "MaximumMessageSize": str(sqs.maximum_message_size),
        "ReceiveMessageWaitTimeSeconds": str(sqs.receive_wait_seconds),
        "CreatedTimestamp": str(sqs.created),
        "LastModifiedTimestamp": str(sqs.modified),
    }
    if arguments.expiration is not None:
        everything["MessageRetentionPeriod"] = str(arguments.expiration // 1000)
    if arguments.dead_letter_queue is not None and arguments.max_deliveries:
        everything["RedrivePolicy"] = json.dumps(
            {
                "deadLetterTargetArn": queue_arn(arguments.dead_letter_queue),
                "maxReceiveCount": arguments.max_deliveries,
            },
            separators=(",", ":"),
        )
    if is_fifo(name):
        everything["FifoQueue"] = "true"
        everything["ContentBasedDeduplication"] = str(sqs.content_based_deduplication).lower()
    if stats is not None:
        everything["ApproximateNumberOfMessages"] = str(stats["ready"])
        everything["ApproximateNumberOfMessagesNotVisible"] = str(stats["leased"])
        everything["ApproximateNumberOfMessagesDelayed"] = str(stats["scheduled"])
    values = arguments.to_dict()
    for attribute, argument in EXTRA.items():
        if argument == "ring_size":
            continue  # shorthand: maxLength and overflow say it
        value = values[argument]
        everything[attribute] = (
            "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        )
    if "All" in wanted:
        return everything
    answer = {}
    for attribute in wanted:
        if attribute in everything:
            answer[attribute] = everything[attribute]
        elif attribute not in (*SETTABLE, *READ_ONLY, *KNOWN_UNSERVED):
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {attribute[:100]}.")
    return answer


# Attributes of SQS a broker has no value for: asked for, they are left out of the answer.
KNOWN_UNSERVED = (
    "Policy",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "DeduplicationScope",
    "FifoThroughputLimit",
    "RedriveAllowPolicy",
    "SqsManagedSseEnabled",
)


def needs_stats(wanted: list[str]) -> bool:
    return any(a == "All" or a.startswith("ApproximateNumberOf") for a in wanted)


# -- messages ------------------------------------------------------------------------------

_INVALID_BODY = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ATTRIBUTE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,256}$")


def _check_attribute_name(name: str, parameter: str) -> None:
    if (
        not _ATTRIBUTE_NAME.match(name)
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


def message_attributes(given: Any, parameter: str = "MessageAttributes") -> dict[str, Any]:
    """Checked message attributes: name -> (data type, value as str or bytes).

    Raises:
        SqsError: ``InvalidParameterValue`` for a bad name, type or value.
    """
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise invalid(parameter, given, "a map of attribute names to values")
    if len(given) > 10:
        raise invalid(parameter, len(given), "a message has at most 10 attributes")
    checked: dict[str, Any] = {}
    for name, value in given.items():
        _check_attribute_name(name, f"{parameter}.{name}")
        if not isinstance(value, dict):
            raise invalid(f"{parameter}.{name}", value, "a message attribute value")
        data_type = value.get("DataType")
        if not isinstance(data_type, str) or not re.fullmatch(
            r"(String|Number|Binary)(\.[A-Za-z0-9_.\-]{1,200})?", data_type
        ):
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
                data = base64.b64decode(raw, validate=True) if isinstance(raw, str) else None
            except binascii.Error:
                data = None
            if not data:
                raise invalid(f"{parameter}.{name}.BinaryValue", raw, "non-empty base64 bytes")
            checked[name] = (data_type, data)
        else:
            text = value.get("StringValue")
            if not isinstance(text, str) or not text or _INVALID_BODY.search(text):
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
        if value is None or not _ATTRIBUTE_NAME.match(name):
            continue  # no SQS attribute can carry it
        data_type = types.get(name, "String") if isinstance(types, dict) else "String"
        if data_type.startswith("Binary"):
            try:
                attributes[name] = (data_type, base64.b64decode(value, validate=True))
            except binascii.Error:
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
    body = member(entry, "MessageBody", str, required=True)
    if not body:
        raise invalid("MessageBody", body, "a message body is 1 character at least")
    if _INVALID_BODY.search(body):
        raise SqsError(
            "InvalidMessageContents",
            "Invalid characters found. A message body holds #x9, #xA, #xD, #x20 to #xD7FF, "
            "#xE000 to #xFFFD and #x10000 to #x10FFFF only.",
        )
    attributes = message_attributes(entry.get("MessageAttributes"))
    system = entry.get("MessageSystemAttributes")
    trace = None
    if system is not None:
        if not isinstance(system, dict) or set(system) - {"AWSTraceHeader"}:
            raise invalid("MessageSystemAttributes", system, "only AWSTraceHeader may be given")
        value = system["AWSTraceHeader"]
        trace = value.get("StringValue") if isinstance(value, dict) else None
        if not isinstance(trace, str) or not trace:
            raise invalid("MessageSystemAttributes.AWSTraceHeader", value, "a String value")
    raw = body.encode()
    size = len(raw) + attributes_size(attributes)
    if size > sqs.maximum_message_size:
        raise invalid(
            "MessageBody",
            f"{size} bytes",
            f"Message must be shorter than {sqs.maximum_message_size} bytes (the queue's "
            f"MaximumMessageSize).",
        )
    delay = integer(entry, "DelaySeconds", 0, 900)
    group = member(entry, "MessageGroupId", str)
    dedup = member(entry, "MessageDeduplicationId", str)
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
    return Outgoing(row, size, md5_hex(raw), md5_of_attributes(attributes), dedup)


def _timestamp(micros: int) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(micros / 1e6, tz=dt.timezone.utc)


def incoming(
    row: Mapping[str, Any],
    queue: str,
    system_names: list[str],
    attribute_names: list[str],
    received_at_ms: int,
) -> dict[str, Any]:
    """A leased row as a ReceiveMessage answer's message."""
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
        "ReceiptHandle": receipt_handle(queue, seq, deliveries),
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


# -- batches -------------------------------------------------------------------------------


def batch_entries(request: Mapping[str, Any], name: str = "Entries") -> list[dict[str, Any]]:
    """A batch's entries, with distinct valid ids, 1 to 10 of them.

    Raises:
        SqsError: ``EmptyBatchRequest``, ``TooManyEntriesInBatchRequest``,
            ``InvalidBatchEntryId``, ``BatchEntryIdsNotDistinct``.
    """
    entries = member(request, name, list, required=True)
    if not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one entry in the request.")
    if len(entries) > MAX_BATCH:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH}. You have sent {len(entries)}.",
        )
    seen: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict):
            raise invalid(name, entry, "each entry is an object")
        entry_id = entry.get("Id")
        if not isinstance(entry_id, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,80}", entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
            )
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def failed_entry(entry_id: str, error: SqsError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": error.sender_fault,
        "Code": error.query_code,
        "Message": error.message,
    }


# -- the HTTP side's limits ----------------------------------------------------------------


@dataclass(frozen=True)
class HttpLimits:
    """What the SQS port allows a connection (docs/SQS.md#security): at most
    ``max_connections`` open at once; a request's head within ``timeout_seconds`` of the
    connection opening or of its last answer, and its body within as long again, up to
    ``max_request_bytes``."""

    max_connections: int = 512
    timeout_seconds: float = 20.0
    # JSON escapes may double a batch's 1 MiB of bodies.
    max_request_bytes: int = 4 * MAX_MESSAGE_BYTES
