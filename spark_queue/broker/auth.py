"""How a queue broker and its clients trust each other without sending the token
(docs/BROKER.md "Security").

Both sides derive one key from the token (PBKDF2, once per process and token). With it:

- a broker signs its discovery record (:func:`record_mac`), so a client that holds the token
  uses only records written by a holder of the token, not by anyone who can write to the
  table's store;
- once per connection, the client sends a fresh nonce (:data:`HELLO_ACTION`, no credential)
  and the broker answers with :func:`broker_proof` of it: the client checks the proof before
  it sends anything else, so a broker that does not hold the token gets no message and no
  credential from it;
- then each call carries :func:`client_proof` of that nonce, for this broker only, in its
  ``authorization`` header: the broker checks it with one HMAC. The token itself never
  travels.

Pure functions; safe from any thread.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os

from spark_queue.errors import InvalidOptionError

# A do_action a client makes before anything else, without a credential: its body is the
# client's nonce (hex), the answer the broker's id and, where it has a token, its proof.
HELLO_ACTION = "broker-hello"
# How an authorization header carries a client's proof: "Proof <nonce>.<mac>" (hex).
PROOF_SCHEME = "Proof"
NONCE_BYTES = 16
# PBKDF2 rounds: ~40 ms once per process on a slow core, and as many for each guess of
# whoever reads a signed record and tries tokens against it.
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


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()


def record_mac(key: bytes, content: str) -> str:
    """The signature of a discovery record's canonical ``content``."""
    return _mac(key, "record", content)


def new_nonce() -> str:
    return os.urandom(NONCE_BYTES).hex()


def broker_proof(key: bytes, broker_id: str, nonce: str) -> str:
    """What the broker ``broker_id`` answers a client's ``nonce`` with."""
    return _mac(key, "broker", broker_id, nonce)


def client_proof(key: bytes, broker_id: str, nonce: str) -> str:
    """What a client's calls to the broker ``broker_id`` carry (a broker's proof of the same
    nonce is of another kind: it cannot stand for the client's)."""
    return _mac(key, "client", broker_id, nonce)


def proof_header(key: bytes, broker_id: str, nonce: str) -> str:
    return f"{PROOF_SCHEME} {nonce}.{client_proof(key, broker_id, nonce)}"


def header_holds(header: str, key: bytes, broker_id: str) -> bool:
    """Whether an authorization header carries a client proof for this broker."""
    scheme, _, credential = header.partition(" ")
    nonce, _, mac = credential.partition(".")
    if scheme != PROOF_SCHEME or len(nonce) != 2 * NONCE_BYTES or not mac:
        return False
    return hmac.compare_digest(mac, client_proof(key, broker_id, nonce))


def same_mac(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())
