"""What a queue broker and its clients prove to each other with the token, without sending
it (docs/BROKER.md "Security"): the proofs themselves, pure functions of the key and what
each proof is bound to. The state around them (a client's session, the broker's record of
the calls it took) is :mod:`spark_queue.broker.sessions`.

Both sides derive one key from the token (PBKDF2, once per process and token). With it:

- a broker signs its discovery record (:func:`record_mac`), so a client that holds the token
  uses only records written by a holder of the token, not by anyone who can write to the
  table's store;
- a broker answers a client's hello with :func:`hello_proof`, bound to the client's fresh
  nonce, the broker's own fresh challenge, the address the client dialed and the broker's id
  (and the broker's clock): the client checks it before it sends anything else, so neither a
  broker without the token nor one that relays the hello from another address gets anything;
- each call then carries :func:`call_proof`, bound to that challenge, a counter, the
  broker's clock, the call's method and a digest of what it carries.

Each proof is an HMAC-SHA256 of its kind and parts, encoded as a JSON list: no two lists of
parts give the same input, and a proof of one kind never stands for one of another.

Pure functions; safe from any thread.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os

from spark_queue.errors import InvalidOptionError

NONCE_BYTES = 16
# PBKDF2 rounds: ~40 ms once per process on a slow core, and as many for each guess of
# whoever holds a signed record or a broker's proof and tries tokens against it.
KEY_ROUNDS = 100_000
_KEY_SALT = b"spark-queue broker token v2"


def check_token(token: object, name: str) -> str:
    """``token`` if it can be a broker token: a string of printable ASCII (space to ``~``),
    not blank, without leading or trailing spaces. ``name`` is how the caller gave it
    (``broker_token``, ``$SPARK_QUEUE_BROKER_TOKEN``, ``--token``); the message names it and
    says what is wrong, never the token.

    Raises:
        InvalidOptionError: anything else.
    """
    if not isinstance(token, str):
        raise InvalidOptionError(f"{name} must be a string, not {type(token).__name__}")
    wrong = next((i for i, c in enumerate(token) if not " " <= c <= "~"), None)
    if wrong is not None:
        what = "a newline" if token[wrong] in "\r\n" else f"character U+{ord(token[wrong]):04X}"
        raise InvalidOptionError(
            f"{name} must be printable ASCII (space to '~'); it has {what} at position "
            f"{wrong} of {len(token)} (a token read from a file keeps its final newline: "
            f"strip it)"
        )
    if not token.strip():
        raise InvalidOptionError(f"{name} is blank: give a token of printable ASCII, not spaces")
    if token != token.strip():
        raise InvalidOptionError(f"{name} starts or ends with a space: give the token without them")
    return token


@functools.lru_cache(maxsize=8)
def token_key(token: str) -> bytes:
    """The key both sides derive from a valid ``token``."""
    return hashlib.pbkdf2_hmac("sha256", token.encode("ascii"), _KEY_SALT, KEY_ROUNDS)


def _mac(key: bytes, kind: str, *parts: str | int) -> str:
    encoded = json.dumps([kind, *parts], ensure_ascii=True, separators=(",", ":")).encode()
    return hmac.new(key, encoded, hashlib.sha256).hexdigest()


def record_mac(key: bytes, content: str) -> str:
    """The signature of a discovery record's canonical ``content``."""
    return _mac(key, "record", content)


def new_nonce() -> str:
    """A fresh random nonce (a client's) or challenge (a broker's), in hex."""
    return os.urandom(NONCE_BYTES).hex()


def is_nonce(text: object) -> bool:
    """Whether ``text`` has the form :func:`new_nonce` gives."""
    return (
        isinstance(text, str)
        and len(text) == 2 * NONCE_BYTES
        and all(c in "0123456789abcdef" for c in text)
    )


def hello_proof(
    key: bytes, broker_id: str, target: str, nonce: str, challenge: str, clock_ms: int
) -> str:
    """What the broker ``broker_id`` answers a hello with: bound to the address the client
    dialed (``target``), the client's ``nonce``, the broker's fresh ``challenge`` and its
    clock as it answered."""
    return _mac(key, "hello", broker_id, target, nonce, challenge, clock_ms)


def call_proof(
    key: bytes,
    broker_id: str,
    challenge: str,
    counter: int,
    stamp_ms: int,
    method: str,
    digest: str,
) -> str:
    """What one call of a session carries: bound to the broker, the session's ``challenge``,
    the call's ``counter`` (never twice in a session) and time on the broker's clock
    (``stamp_ms``), its ``method`` and the :func:`digest` of what it carries."""
    return _mac(key, "call", broker_id, challenge, counter, stamp_ms, method, digest)


def digest(body: bytes) -> str:
    """The digest of what a call carries that its proof covers (an action's body, a
    publish's request)."""
    return hashlib.sha256(body).hexdigest()


def same_mac(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())
