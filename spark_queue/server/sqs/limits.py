"""SQS's bounds and defaults (docs/SQS.md), and what the SQS port allows a connection
(:class:`HttpLimits`). No server here: the command line and the Flight server read them
without the ``sqs`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_MESSAGE_BYTES = 1_048_576  # SQS's largest body (with its attributes), and a batch's
MAX_BATCH = 10
MAX_RECEIVE_WAIT_SECONDS = 20
MAX_VISIBILITY_SECONDS = 43_200
DEFAULT_VISIBILITY_SECONDS = 30
FIFO_DEDUP_MS = 300_000  # SQS FIFO's five-minute deduplication interval
DEFAULT_RETENTION_SECONDS = 345_600  # 4 days, SQS's default
MAX_LIST_RESULTS = 1000


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
