"""SQS's errors (docs/SQS.md): each code as the JSON protocol and the query protocol name
it, with its status, and an error as an answer (or a batch entry's failure) carries it.
"""

from __future__ import annotations

import json
from typing import Any

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


def failed_entry(entry_id: str, error: SqsError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": error.sender_fault,
        "Code": error.query_code,
        "Message": error.message,
    }
