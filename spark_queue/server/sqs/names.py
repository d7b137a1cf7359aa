"""What SQS names (docs/SQS.md): queue names, by the table's rule to look one up and by
SQS's to create one; queue URLs and ARNs; the consumer SQS's receives lease as.
"""

from __future__ import annotations

import re
from typing import Any

from spark_queue.model.arguments import QUEUE_NAME
from spark_queue.server.sqs.errors import SqsError, invalid

ACCOUNT = "000000000000"  # the account id in queue URLs and ARNs
REGION = "us-east-1"  # the region in ARNs (requests may be signed for any region)
CONSUMER = "sqs"  # the consumer name SQS receives lease as


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


def check_queue_name(name: str, parameter: str = "QueueName") -> str:
    """A queue to look up: any queue of the table (Spark and ``QueueTable`` name queues by
    the table's rule, a superset of SQS's)."""
    if not servable(name):
        raise invalid(parameter, name, "a queue name is 1 to 255 characters of A-Z a-z 0-9 _ . -")
    return name


_SQS_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
_SQS_FIFO_NAME = re.compile(r"[A-Za-z0-9_-]{1,75}\.fifo")


def check_new_queue_name(name: str, fifo_attribute: str | None) -> str:
    """A queue CreateQueue may make: SQS's rule, 1 to 80 characters of A-Z a-z 0-9 _ -, a
    FIFO queue's (the attribute ``FifoQueue`` true) ending in ``.fifo`` within the 80."""
    if fifo_attribute is not None and fifo_attribute.lower() == "true":
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


def name_of_url(url: str) -> str:
    """The queue a ``QueueUrl`` names: its last path segment (the host is not checked: a
    client may reach the broker by another name than the one an answer gave)."""
    if not url:
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
