"""AWS Signature Version 4 as AWS checks it, for the broker's SQS API (docs/SQS.md#security),
and the access keys it is checked with.

Two steps, so that a request's credential is checked before its body is read:
:func:`credential` takes the headers alone (one Authorization header of SigV4's form, a known
access key, a scope of service ``sqs`` and of the request's day, a time within
:data:`CLOCK_SKEW_SECONDS`, and the headers that must be signed); :func:`verify` then takes
the body and recomputes the signature from the body's real SHA-256 and every instance of
each signed header, joined as AWS joins them.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import os
import re
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

from spark_queue.errors import InvalidOptionError
from spark_queue.server.sqs.errors import SqsError

KEYS_ENV_VAR = "SPARK_QUEUE_SQS_KEYS"  # the file of access keys requests are signed with
SERVICE = "sqs"
ALGORITHM = "AWS4-HMAC-SHA256"
# AWS's SigV4 guide: a request must reach AWS within five minutes of its time stamp.
CLOCK_SKEW_SECONDS = 300
MAX_AUTHORIZATION_BYTES = 8192
# Headers a request gives once at most: what is dispatched and what is signed must be one
# value (a request with two X-Amz-Target could be signed for one action and run another).
SINGLE_HEADERS = (
    "Authorization",
    "Content-Type",
    "Host",
    "X-Amz-Content-SHA256",
    "X-Amz-Date",
    "X-Amz-Target",
)
# The headers a signature must cover: the endpoint, the time and the action (the body is
# covered by its hash). Content-Type need not be: every body is read as JSON whatever it says.
MUST_SIGN = ("host", "x-amz-date", "x-amz-target")

Headers = Mapping[str, list[str]]

_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=([^/\s,]+)/([0-9]{8})/([^/\s,]+)/([^/\s,]+)/aws4_request,"
    r"\s*SignedHeaders=([a-z0-9\-;]+),\s*Signature=([0-9a-f]{64})"
)
_STAMP = re.compile(r"[0-9]{8}T[0-9]{6}Z")


@dataclass(frozen=True)
class Credential:
    """A request's SigV4 credential, checked against the headers alone."""

    key_id: str
    secret: str = field(repr=False)
    stamp: str  # X-Amz-Date
    region: str
    signed: tuple[str, ...]  # the signed header names, sorted
    signature: str


def headers_of(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Every instance of each header, in the order given, by lowercase name."""
    headers: dict[str, list[str]] = {}
    for name, value in pairs:
        headers.setdefault(name.lower(), []).append(value)
    return headers


def refuse_repeated(headers: Headers) -> None:
    """Refuse a request that gives one of :data:`SINGLE_HEADERS` more than once.

    Raises:
        SqsError: ``InvalidParameterValue`` naming the header.
    """
    for name in SINGLE_HEADERS:
        count = len(headers.get(name.lower(), ()))
        if count > 1:
            raise SqsError(
                "InvalidParameterValue",
                f"The request gives the header {name} {count} times; a request gives each of "
                f"{', '.join(SINGLE_HEADERS)} once at most.",
            )


def first(headers: Headers, name: str) -> str | None:
    """The one value of a header of :data:`SINGLE_HEADERS` (None: absent)."""
    values = headers.get(name)
    return values[0] if values else None


def credential(headers: Headers, keys: Mapping[str, str], now: float) -> Credential:
    """The request's credential, checked without its body: call after
    :func:`refuse_repeated`. A message never quotes the Authorization header.

    Raises:
        SqsError: ``MissingAuthenticationToken``, ``IncompleteSignature``,
            ``InvalidClientTokenId``, ``SignatureDoesNotMatch`` or ``RequestExpired``.
    """
    authorization = first(headers, "authorization")
    if authorization is None:
        raise SqsError("MissingAuthenticationToken", "Request is missing Authentication Token")
    if len(authorization) > MAX_AUTHORIZATION_BYTES:
        raise SqsError(
            "IncompleteSignature",
            f"The Authorization header is longer than {MAX_AUTHORIZATION_BYTES} bytes.",
        )
    found = _AUTHORIZATION.fullmatch(authorization.strip())
    stamp = first(headers, "x-amz-date") or ""
    if found is None or not _STAMP.fullmatch(stamp):
        raise SqsError(
            "IncompleteSignature",
            "The request signature does not conform to AWS Signature Version 4 "
            "(Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., "
            "Signature=...; X-Amz-Date)",
        )
    key_id, day, region, service, signed, signature = found.groups()
    secret = keys.get(key_id)
    if secret is None:
        raise SqsError(
            "InvalidClientTokenId", "The security token included in the request is invalid."
        )
    if service != SERVICE:
        raise SqsError(
            "SignatureDoesNotMatch",
            f"Credential should be scoped to correct service: '{SERVICE}'.",
        )
    if day != stamp[:8]:
        raise SqsError(
            "SignatureDoesNotMatch",
            "Date in Credential scope does not match YYYYMMDD from X-Amz-Date.",
        )
    try:
        signed_at = calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise SqsError("IncompleteSignature", "X-Amz-Date is not a time.") from None
    if abs(now - signed_at) > CLOCK_SKEW_SECONDS:
        raise SqsError(
            "RequestExpired",
            f"Request has expired: signed at {stamp}, more than {CLOCK_SKEW_SECONDS} s from "
            f"the broker's clock",
        )
    names = tuple(signed.split(";"))
    if list(names) != sorted(set(names)):
        raise SqsError(
            "IncompleteSignature", "SignedHeaders is not a sorted list of distinct header names."
        )
    if any(n not in names for n in MUST_SIGN) or any(n not in headers for n in names):
        raise SqsError(
            "IncompleteSignature",
            f"The signature must sign the headers {', '.join(MUST_SIGN)}, and only headers "
            f"the request has.",
        )
    return Credential(key_id, secret, stamp, region, names, signature)


def verify(signer: Credential, method: str, raw_path: str, headers: Headers, body: bytes) -> None:
    """Recompute the request's signature and compare it in constant time: the canonical
    request has the body's real SHA-256, and each signed header's instances trimmed and
    joined with ``,``. An X-Amz-Content-SHA256 header must be that SHA-256.

    Raises:
        SqsError: ``SignatureDoesNotMatch``.
    """
    digest = hashlib.sha256(body).hexdigest()
    claimed = first(headers, "x-amz-content-sha256")
    if claimed is not None and claimed != digest:
        raise SqsError(
            "SignatureDoesNotMatch", "X-Amz-Content-SHA256 is not the SHA-256 of the body."
        )
    path, _, query = raw_path.partition("?")
    canonical = "\n".join(
        [
            method.upper(),
            _canonical_path(path),
            _canonical_query(query),
            *(f"{n}:{','.join(' '.join(v.split()) for v in headers[n])}" for n in signer.signed),
            "",
            ";".join(signer.signed),
            digest,
        ]
    )
    day = signer.stamp[:8]
    scope = f"{day}/{signer.region}/{SERVICE}/aws4_request"
    to_sign = "\n".join(
        [ALGORITHM, signer.stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = f"AWS4{signer.secret}".encode()
    for part in (day, signer.region, SERVICE, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signer.signature):
        raise SqsError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        )


def _canonical_path(path: str) -> str:
    """The path as SigV4 signs it (outside S3): dot segments and repeated slashes removed,
    then URI-encoded once more, as botocore and the other SDKs sign it."""
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if kept:
                kept.pop()
        elif segment and segment != ".":
            kept.append(segment)
    trailing = "/" if path.endswith("/") and kept else ""
    return quote("/" + "/".join(kept) + trailing, safe="/~")


def _canonical_query(query: str) -> str:
    """The query string as SigV4 signs it: its pairs, as sent, sorted by name then value."""
    if not query:
        return ""
    pairs = sorted(pair.partition("=")[::2] for pair in query.split("&"))
    return "&".join(f"{name}={value}" for name, value in pairs)


# -- access keys ---------------------------------------------------------------------------


def load_keys(path: str) -> dict[str, str]:
    """The access keys of ``path``: ``ACCESS_KEY_ID SECRET_ACCESS_KEY`` a line (blank lines
    and ``#`` comments skipped). As ssh does with a private key, a file that its group or
    others may read is refused. A message never quotes a line: it holds a secret.

    Raises:
        InvalidOptionError: the file cannot be read, others may read it, a line is not a
            pair, an access key id is listed twice, or it holds none.
    """
    try:
        with open(path, encoding="utf-8") as source:
            mode = os.fstat(source.fileno()).st_mode
            lines = source.read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise InvalidOptionError(f"${KEYS_ENV_VAR}: cannot read {path!r}: {reason}") from None
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidOptionError(
            f"${KEYS_ENV_VAR}: {path!r} is open to its group or others (mode "
            f"{stat.S_IMODE(mode):04o}) and holds secrets: make it private with chmod 600 {path}"
        )
    keys: dict[str, str] = {}
    lines_of: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or not re.fullmatch(r"[A-Za-z0-9]{1,128}", parts[0]):
            raise InvalidOptionError(
                f"${KEYS_ENV_VAR}: line {number} of {path!r} is not 'ACCESS_KEY_ID "
                f"SECRET_ACCESS_KEY' (an id of letters and digits, a space, the secret)"
            )
        key_id = parts[0]
        if key_id in keys:
            raise InvalidOptionError(
                f"${KEYS_ENV_VAR}: the access key id {key_id} is listed twice in {path!r} "
                f"(lines {lines_of[key_id]} and {number}): keep one"
            )
        keys[key_id] = parts[1]
        lines_of[key_id] = number
    if not keys:
        raise InvalidOptionError(f"${KEYS_ENV_VAR}: {path!r} holds no access key")
    return keys


def keys_from_environment(environment: Mapping[str, str]) -> dict[str, str] | None:
    """The access keys of the file :data:`KEYS_ENV_VAR` names; None where it is not set.

    Raises:
        InvalidOptionError: it is set but empty (never "no signature checks"), or the file
            is refused by :func:`load_keys`.
    """
    path = environment.get(KEYS_ENV_VAR)
    if path is None:
        return None
    if not path.strip():
        raise InvalidOptionError(
            f"${KEYS_ENV_VAR} is set but empty: name a file of access keys, or unset it to "
            f"serve unsigned requests on loopback"
        )
    return load_keys(path)
