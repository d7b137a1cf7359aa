"""SQS receipt handles (docs/SQS.md "Receipt handles"): opaque to clients, unforgeable,
each bound to one delivery of one message of one queue, and expiring as SQS's do.

A handle carries the queue, the message's seq, the delivery count it was received in and
the time of the receive, with an HMAC-SHA256 of them under a secret of the table: a handle
altered in any byte, made up, or of another queue is ``ReceiptHandleIsInvalid``. The
delivery count binds it to one receive (the table acts on a lease only in that delivery:
``QueueTable.ack(..., deliveries=...)``), and the receive time bounds it: SQS keeps a
message in flight at most 12 hours from its receive (``ChangeMessageVisibility`` cannot
take it further), so a handle older than that is expired.

The secrets are files under the table root, ``_spark_queue/sqs-handle-keys/<id>.key`` (32
random bytes, hex), beside the broker records: every broker of the table, now or after a
restart, reads the same ones, so a handle one broker gave any other takes. The first
broker to need one writes it; brokers that raced to write one each keep theirs, sign with
the first by name and accept any (a handle signed with a secret not yet seen makes a
broker list the folder again, at most once every :data:`REFRESH_SECONDS`). Anyone who can
read the table's files can make handles; they can also change the table itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import threading
import time
import uuid
from dataclasses import dataclass

import pyarrow.fs as pafs

from spark_queue.server.sqs.errors import SqsError, invalid
from spark_queue.server.sqs.limits import MAX_VISIBILITY_SECONDS
from spark_queue.storage.location import Location

KEYS_FOLDER = "_spark_queue/sqs-handle-keys"
PREFIX = "sq2"
LIFETIME_MS = MAX_VISIBILITY_SECONDS * 1000  # SQS's longest time in flight, from a receive
REFRESH_SECONDS = 1.0  # an unknown secret lists the keys folder again at most this often
_MAC_BYTES = 16
_MAC_CONTEXT = b"spark-queue sqs receipt handle\n"
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Receipt:
    """What a handle stands for: one receive of one message."""

    queue: str
    seq: int
    deliveries: int  # the message's delivery count in that receive
    received_ms: int  # Unix time of the receive, milliseconds

    @property
    def expires_ms(self) -> int:
        return self.received_ms + LIFETIME_MS


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _mac(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, _MAC_CONTEXT + payload, hashlib.sha256).digest()[:_MAC_BYTES]


def issue(key: bytes, receipt: Receipt) -> str:
    """The handle of ``receipt``, authenticated with ``key``."""
    fields = (receipt.queue, receipt.seq, receipt.deliveries, receipt.received_ms)
    payload = "\n".join(map(str, fields)).encode()
    return f"{PREFIX}.{_b64(payload)}.{_b64(_mac(key, payload))}"


def refusal(handle: str) -> SqsError:
    return SqsError(
        "ReceiptHandleIsInvalid",
        f"The input receipt handle {handle[:100]!r} is not a valid receipt handle.",
    )


def split(handle: str) -> tuple[bytes, bytes]:
    """A handle's payload and MAC, unchecked.

    Raises:
        SqsError: ``MissingParameter`` (empty), ``ReceiptHandleIsInvalid`` (not a handle).
    """
    if not handle:
        raise SqsError("MissingParameter", "The request must contain the parameter ReceiptHandle.")
    parts = handle.split(".") if len(handle) <= 1024 else []
    if len(parts) != 3 or parts[0] != PREFIX:
        raise refusal(handle)
    try:
        payload, mac = (base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)) for p in parts[1:])
    except (ValueError, binascii.Error):
        raise refusal(handle) from None
    if len(mac) != _MAC_BYTES:
        raise refusal(handle)
    return payload, mac


def signed_by(payload: bytes, mac: bytes, keys: list[bytes]) -> bool:
    """Whether one of ``keys`` made ``mac`` for ``payload`` (compared in constant time)."""
    return any(hmac.compare_digest(_mac(key, payload), mac) for key in keys)


def receipt_of(payload: bytes, handle: str, queue: str, now_ms: int) -> Receipt:
    """The receipt an authentic handle's payload names, for a request on ``queue``.

    Raises:
        SqsError: ``ReceiptHandleIsInvalid`` (another queue's, or fields out of range),
            ``InvalidParameterValue`` (expired: received 12 hours ago or more, as SQS
            answers).
    """
    try:
        name, seq, deliveries, received = payload.decode().split("\n")
        receipt = Receipt(name, int(seq), int(deliveries), int(received))
    except ValueError:  # a UnicodeDecodeError too
        raise refusal(handle) from None
    if (
        receipt.queue != queue
        or not 0 <= receipt.seq <= _INT64_MAX
        or not 1 <= receipt.deliveries <= _INT64_MAX
    ):
        raise refusal(handle)
    if now_ms >= receipt.expires_ms:
        raise invalid("ReceiptHandle", handle, "The receipt handle has expired.")
    return receipt


def check_visibility(receipt: Receipt, seconds: int, now_ms: int) -> None:
    """A visibility change that would keep the message in flight past 12 hours from its
    receive is refused, as SQS refuses it.

    Raises:
        SqsError: ``InvalidParameterValue`` naming ``VisibilityTimeout``.
    """
    if now_ms + seconds * 1000 > receipt.expires_ms:
        raise invalid(
            "VisibilityTimeout",
            seconds,
            f"Total VisibilityTimeout for the message is beyond the limit "
            f"[{MAX_VISIBILITY_SECONDS} seconds]",
        )


class HandleKeys:
    """The table's handle secrets (:data:`KEYS_FOLDER`), read once and again when a handle
    names one not yet seen. Safe from any thread; every method may read or write storage."""

    def __init__(self, location: Location) -> None:
        self.fs, base = location.filesystem()
        self.folder = f"{base.rstrip('/')}/{KEYS_FOLDER}"
        self.local = not location.scheme
        self._keys: dict[str, bytes] = {}  # file name: secret
        self._listed_at = -REFRESH_SECONDS
        self._lock = threading.Lock()

    def known(self) -> list[bytes]:
        """The secrets read so far (none before the first handle is made or checked)."""
        with self._lock:
            return list(self._keys.values())

    def signing(self) -> bytes:
        """The secret new handles are signed with: the first by name; the table's first is
        written here where it has none."""
        with self._lock:
            if not self._keys:
                self._list()
            if not self._keys:
                self._write(secrets.token_bytes(32))
                self._list()
            return self._keys[min(self._keys)]

    def refreshed(self) -> list[bytes]:
        """Every secret, the folder listed again unless it was within
        :data:`REFRESH_SECONDS`."""
        with self._lock:
            if time.monotonic() - self._listed_at >= REFRESH_SECONDS:
                self._list()
            return list(self._keys.values())

    def _list(self) -> None:
        self._listed_at = time.monotonic()
        found = self.fs.get_file_info(pafs.FileSelector(self.folder, allow_not_found=True))
        for info in found:
            name = info.path.rsplit("/", 1)[-1]
            if name in self._keys or not name.endswith(".key"):
                continue
            with self.fs.open_input_stream(info.path) as source:
                text = source.read().decode(errors="replace").strip()
            try:
                key = bytes.fromhex(text)
            except ValueError:
                continue  # not a key this module wrote
            if len(key) == 32:
                self._keys[name] = key

    def _write(self, key: bytes) -> None:
        name = f"{uuid.uuid4().hex}.key"
        if not self.local:  # an object store's PUT is atomic by itself
            with self.fs.open_output_stream(f"{self.folder}/{name}") as out:
                out.write(key.hex().encode())
            return
        # Readable by the broker's user only; through a rename, so never seen half written.
        os.makedirs(self.folder, exist_ok=True)
        staged = f"{self.folder}/.{name}.writing"
        descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(key.hex())
        os.replace(staged, f"{self.folder}/{name}")
