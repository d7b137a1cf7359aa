"""SQS queue attributes mapped onto queue arguments and back (docs/SQS.md "Queues"): what
a CreateQueue's or SetQueueAttributes's attributes ask of a queue, and a
GetQueueAttributes's answer. The settings SQS has and queue arguments lack are
:class:`SqsOnly`, kept beside the table (:mod:`spark_queue.server.sqs.service`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spark_queue.errors import InvalidOptionError
from spark_queue.model.arguments import ARGUMENTS
from spark_queue.model.queue_arguments import QueueArguments, validate_arguments
from spark_queue.server.sqs.errors import SqsError
from spark_queue.server.sqs.limits import (
    DEFAULT_VISIBILITY_SECONDS,
    MAX_MESSAGE_BYTES,
    MAX_RECEIVE_WAIT_SECONDS,
    MAX_VISIBILITY_SECONDS,
)
from spark_queue.server.sqs.names import is_fifo, name_of_arn, queue_arn


@dataclass(frozen=True)
class SqsOnly:
    """What SQS keeps of a queue that queue arguments do not: the defaults of its sends and
    receives, its tags, whether content-based deduplication is on, and whether the queue
    was deleted through SQS. Kept beside the table (:mod:`spark_queue.server.sqs.service`)."""

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
    name: str,
    attributes: Mapping[str, str],
    *,
    creating: bool,
    queues: frozenset[str] = frozenset(),
) -> AttributeChange:
    """The queue arguments and SQS-only settings of ``attributes``. ``queues``: those a
    redrive policy may name as its dead-letter queue.

    Raises:
        SqsError: ``InvalidAttributeName`` for an unknown (or read-only) attribute,
            ``InvalidAttributeValue`` for a bad value.
    """
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
