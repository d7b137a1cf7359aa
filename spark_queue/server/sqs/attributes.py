"""Amazon SQS's API mapped onto queue tables (docs/SQS.md): the pure part, with no server.

What an SQS request means for a :class:`~spark_queue.QueueTable` and how its answer is
written: request members, queue names, URLs and ARNs, queue attributes to queue arguments
and back, batches, SQS's errors. Beside it: messages to rows and back
(:mod:`~spark_queue.broker.sqs_messages`), receipt handles
(:mod:`~spark_queue.broker.sqs_handles`), request bodies checked against SQS's service model
(:mod:`~spark_queue.broker.sqs_shapes`) and signatures (:mod:`~spark_queue.broker.sigv4`).
The HTTP server that uses them is :mod:`spark_queue.broker.sqs_server`.
"""

from __future__ import annotations

import json
import re
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


def servable(name: str) -> bool:
    """Whether ``name`` is a queue name of the table's rule that a URL can carry (``.``
    and ``..`` are path segments, never names)."""
    return bool(QUEUE_NAME.fullmatch(name)) and name.strip(".") != ""


def check_queue_name(name: Any, parameter: str = "QueueName") -> str:
    """A queue to look up: any queue of the table (Spark and ``QueueTable`` name queues by
    the table's rule, a superset of SQS's)."""
    if not isinstance(name, str) or not servable(name):
        raise invalid(parameter, name, "a queue name is 1 to 255 characters of A-Z a-z 0-9 _ . -")
    return name


_SQS_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
_SQS_FIFO_NAME = re.compile(r"[A-Za-z0-9_-]{1,75}\.fifo")


def check_new_queue_name(name: str, fifo_attribute: Any) -> str:
    """A queue CreateQueue may make: SQS's rule, 1 to 80 characters of A-Z a-z 0-9 _ -, a
    FIFO queue's (the attribute ``FifoQueue`` true) ending in ``.fifo`` within the 80."""
    if isinstance(fifo_attribute, str) and fifo_attribute.lower() == "true":
        if not _SQS_FIFO_NAME.fullmatch(name):
            raise invalid(
                "QueueName", name, "The name of a FIFO queue can only include alphanumeric "
                "characters, hyphens, or underscores, must end with .fifo suffix and be 1 to "
                "80 in length",
            )  # fmt: skip
    elif not _SQS_NAME.fullmatch(name):
        raise invalid(
            "QueueName", name, "Can only include alphanumeric characters, hyphens, or "
            "underscores. 1 to 80 in length" + (" (a FIFO queue's name also needs the "
            "attribute FifoQueue true)" if name.endswith(".fifo") else ""),
        )  # fmt: skip
    return name


def name_of_url(url: Any) -> str:
    """The queue a ``QueueUrl`` names: its last path segment (the host is not checked: a
    client may reach the broker by another name than the one an answer gave)."""
    if not isinstance(url, str) or not url:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    if not servable(name):
        raise SqsError("InvalidAddress", f"The address {url[:300]} is not valid for this endpoint.")
    return name


def name_of_arn(arn: Any, parameter: str) -> str:
    parts = arn.split(":") if isinstance(arn, str) else []
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not servable(parts[5]):
        raise invalid(parameter, arn, "not an SQS queue ARN (arn:aws:sqs:REGION:ACCOUNT:NAME)")
    return parts[5]


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
    origin: dict[str, str]  # each argument's and field's attribute


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
    origin: dict[str, str] = {}
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
        before = {*arguments, *sqs}
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
        origin.update({key: attribute for key in {*arguments, *sqs} - before})
    try:
        parsed = validate_arguments(arguments, surface="option")
    except InvalidOptionError as error:
        raise SqsError("InvalidAttributeValue", str(error)) from None
    return AttributeChange(parsed, sqs, origin)


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
