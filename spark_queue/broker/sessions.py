"""Sessions between a queue broker with a token and its clients (docs/BROKER.md "Security"):
the hello that opens one, the proof each call of it carries, and the broker's check of
those proofs. The proofs themselves are :mod:`spark_queue.broker.auth`'s.

1. The client sends :data:`HELLO_ACTION` (no credential) with a fresh nonce and the address
   it dialed (its *target*): ``{"nonce": <hex>, "target": "host:port"}``.
2. The broker answers only where the target is one of its own addresses
   (:class:`BrokerAddresses`), with its id, a fresh challenge, its clock (milliseconds) and
   :func:`~spark_queue.broker.auth.hello_proof` of them all. Nothing in it is a credential:
   a broker's proof never stands for a client's.
3. The client checks the proof (:func:`open_session`) before it sends anything else: a
   broker without the token, or one that relays the hello from another address (the proof
   then names the other address), gets nothing more.
4. Each call then carries ``authorization: Proof <challenge>.<counter>.<stamp>.<mac>``: the
   session's challenge, a counter that grows with each call, the time on the broker's clock
   (the client's own clock since the hello, added to the broker's clock it was told) and
   :func:`~spark_queue.broker.auth.call_proof` of them with the call's method and a digest
   of what it carries. The broker (:class:`CallChecks`) takes a proof made less than its
   lifetime ago (``--proof-lifetime``), and each counter of a session once: a captured proof
   is worth nothing once used, and nothing at all once its lifetime has passed.

The broker keeps nothing for a hello (a flood of hellos costs it one HMAC each), and for a
session only the counters its proven calls used within a lifetime.

Thread-safe: a :class:`ClientSession` and a :class:`CallChecks` serve concurrent calls.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from spark_queue.broker.auth import (
    NONCE_BYTES,
    call_proof,
    digest,
    hello_proof,
    is_nonce,
    new_nonce,
    same_mac,
)

# A do_action a client makes before anything else, without a credential.
HELLO_ACTION = "broker-hello"
# How an authorization header carries a call's proof.
PROOF_SCHEME = "Proof"
MAX_HELLO_BYTES = 1024
MAX_TARGET_CHARS = 300
DEFAULT_PROOF_LIFETIME_SECONDS = 60.0
# How far ahead of the broker's clock a call's stamp may be: a client computes it from the
# broker's clock at the hello and its own clock since, which may run a little fast.
AHEAD_MS = 1000
# How many counters below a session's highest one stay usable: calls of one session run
# concurrently and may arrive out of order, but never thousands of calls apart.
COUNTER_WINDOW = 4096
WILDCARDS = ("0.0.0.0", "::")


def clock_ms() -> int:
    """This process's clock for proofs: monotonic, in milliseconds."""
    return time.monotonic_ns() // 1_000_000


def normal_address(text: object) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port``) as a comparable pair: the host in lower case, an IP
    address in its compressed form; None where ``text`` is not of that form."""
    if not isinstance(text, str) or len(text) > MAX_TARGET_CHARS:
        return None
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]").lower()
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if not all(" " < c <= "~" for c in host):
        return None
    with contextlib.suppress(ValueError):  # a name stays as given
        host = ipaddress.ip_address(host).compressed
    return host, int(port)


def _is_local(host: str, family: socket.AddressFamily) -> bool:
    """Whether ``host`` is an IP address of this machine in ``family``: one a socket can be
    bound to. Asked afresh each time: addresses come and go."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if (address.version == 6) != (family == socket.AF_INET6):
        return False
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


class BrokerAddresses:
    """The addresses a broker answers a hello for: those a client may have dialed to reach
    it. Its advertised address (recorded in the table), its listening one, and, where it
    listens on every address (``0.0.0.0``: IPv4, ``::``: both), any IP address of this
    machine in that family, on its port. Never a name it would have to look up: a client
    that dials it by another name needs that name as its advertised address."""

    def __init__(self, listen_host: str, port: int, advertised: str) -> None:
        self.advertised = advertised
        self.port = port
        listen = normal_address(f"[{listen_host}]:{port}")
        self._own = {a for a in (listen, normal_address(advertised)) if a is not None}
        self._families: tuple[socket.AddressFamily, ...] = ()
        if listen_host == "0.0.0.0":
            self._families = (socket.AF_INET,)
        elif listen_host == "::":
            self._families = (socket.AF_INET, socket.AF_INET6)

    def answers_for(self, target: tuple[str, int]) -> bool:
        if target in self._own:
            return True
        host, port = target
        return port == self.port and any(_is_local(host, f) for f in self._families)


class HelloRefused(Exception):
    """A hello for an address that is not the broker's (the message is one line for the
    client)."""


class MalformedHello(Exception):
    """A hello's body that is not one."""


@dataclass
class _Counters:
    """The counters a session's proven calls used: the highest, and which of the
    ``COUNTER_WINDOW`` below it, as bits (IPsec's anti-replay window, RFC 4303 3.4.3): 512
    bytes a session, however many calls it makes."""

    highest: int = 0
    used: int = 0  # bit i: the counter highest - i was used
    last_ms: int = 0

    def take(self, counter: int) -> bool:
        """Use ``counter`` once; False where it was used or is too far below the highest."""
        if counter > self.highest:
            shift = counter - self.highest
            self.used = ((self.used << shift) | 1) & ((1 << COUNTER_WINDOW) - 1)
            self.highest = counter
            return True
        behind = self.highest - counter
        if behind >= COUNTER_WINDOW or self.used >> behind & 1:
            return False
        self.used |= 1 << behind
        return True


class CallChecks:
    """A broker's side of its sessions: answers hellos, and checks each call's proof.

    Args:
        key: the token's key; None: a broker without a token (its hello carries no proof).
        broker_id: this broker's id.
        addresses: where it answers hellos for.
        lifetime_seconds: how long after it was made a call's proof is taken.
    """

    def __init__(
        self,
        key: bytes | None,
        broker_id: str,
        addresses: BrokerAddresses,
        lifetime_seconds: float = DEFAULT_PROOF_LIFETIME_SECONDS,
    ) -> None:
        self._key = key
        self.broker_id = broker_id
        self.addresses = addresses
        self.lifetime_ms = int(lifetime_seconds * 1000)
        self._lock = threading.Lock()
        self._sessions: dict[str, _Counters] = {}
        self._pruned_ms = clock_ms()

    def hello(self, body: bytes) -> bytes:
        """The answer to a hello's ``body``.

        Raises:
            MalformedHello: its body is not a hello.
            HelloRefused: a hello for an address not this broker's.
        """
        nonce, target = _read_hello(body)
        address = normal_address(target)
        if address is None or not self.addresses.answers_for(address):
            shown = repr(target)[1:-1][:100]  # the client's text: one line, escaped
            raise HelloRefused(
                f"this broker does not answer for {shown}: it is at "
                f"{self.addresses.advertised} (a broker reached by another name needs that "
                f"name as its --advertise)"
            )
        answer: dict[str, Any] = {"broker": self.broker_id, "token_required": self._key is not None}
        if self._key is not None:
            challenge, now = new_nonce(), clock_ms()
            answer |= {
                "challenge": challenge,
                "clock": now,
                "proof": hello_proof(self._key, self.broker_id, target, nonce, challenge, now),
            }
        return json.dumps(answer).encode()

    def check(self, header: str | None, method: str, body: bytes) -> str | None:
        """Why the call ``method`` carrying ``body`` is refused, as a log line says it (``no
        proof``, ``a wrong proof``, ...); None: its proof holds, and its counter is now used.
        A broker without a token takes every call."""
        if self._key is None:
            return None
        if header is None:
            return "no proof"
        parsed = _read_proof(header)
        if parsed is None:
            return "a wrong proof"
        challenge, counter, stamp, mac = parsed
        expected = call_proof(
            self._key, self.broker_id, challenge, counter, stamp, method, digest(body)
        )
        if not same_mac(mac, expected):
            return "a wrong proof"
        now = clock_ms()
        if not now - self.lifetime_ms <= stamp <= now + AHEAD_MS:
            return "an expired proof" if stamp < now else "a proof stamped ahead of its clock"
        with self._lock:
            self._prune(now)
            counters = self._sessions.setdefault(challenge, _Counters())
            counters.last_ms = now
            if not counters.take(counter):
                return "a replayed proof"
        return None

    def _prune(self, now: int) -> None:
        """Forget sessions idle for longer than a proof lives (and its margin ahead): every
        proof they took has expired since. At most once a lifetime; under the lock."""
        if now - self._pruned_ms < self.lifetime_ms:
            return
        self._pruned_ms = now
        idle = now - self.lifetime_ms - 2 * AHEAD_MS
        self._sessions = {c: s for c, s in self._sessions.items() if s.last_ms >= idle}


def _read_hello(body: bytes) -> tuple[str, str]:
    """The nonce and target of a hello's body.

    Raises:
        MalformedHello: it is not a hello.
    """
    malformed = MalformedHello(
        f'malformed {HELLO_ACTION}: its body is {{"nonce": <{2 * NONCE_BYTES} hex digits>, '
        f'"target": "<the host:port dialed>"}}'
    )
    if len(body) > MAX_HELLO_BYTES:
        raise malformed
    try:
        hello = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise malformed from None
    if not isinstance(hello, dict) or hello.keys() != {"nonce", "target"}:
        raise malformed
    if not is_nonce(hello["nonce"]) or not isinstance(hello["target"], str):
        raise malformed
    return hello["nonce"], hello["target"]


def _read_proof(header: str) -> tuple[str, int, int, str] | None:
    """The challenge, counter, stamp and MAC of a ``Proof`` header; None: not of that form."""
    scheme, _, credential = header.partition(" ")
    parts = credential.split(".")
    if scheme != PROOF_SCHEME or len(parts) != 4:
        return None
    challenge, counter, stamp, mac = parts
    if not is_nonce(challenge) or not _is_count(counter) or not _is_count(stamp) or not mac:
        return None
    return challenge, int(counter), int(stamp), mac


def _is_count(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 19 and int(text) > 0


def hello_body(nonce: str, target: str) -> bytes:
    """A client's hello: its ``nonce`` and the address it dialed."""
    return json.dumps({"nonce": nonce, "target": target}).encode()


class ClientSession:
    """A client's session with the broker ``broker_id``, opened by :func:`open_session`."""

    def __init__(self, key: bytes, broker_id: str, challenge: str, broker_clock_ms: int) -> None:
        self._key = key
        self.broker_id = broker_id
        self._challenge = challenge
        self._offset_ms = broker_clock_ms - clock_ms()  # the broker's clock minus ours
        self._counters = itertools.count(1)  # next() is atomic: threads share a session

    def header(self, method: str, body: bytes) -> str:
        """The authorization header of one call of ``method`` carrying ``body``."""
        counter = next(self._counters)
        stamp = clock_ms() + self._offset_ms
        mac = call_proof(
            self._key, self.broker_id, self._challenge, counter, stamp, method, digest(body)
        )
        return f"{PROOF_SCHEME} {self._challenge}.{counter}.{stamp}.{mac}"


def open_session(
    key: bytes, target: str, nonce: str, answer: bytes, broker_id: str | None
) -> ClientSession | None:
    """The session a broker's ``answer`` to the hello of ``nonce`` sent to ``target`` opens;
    None where it does not prove the broker holds the key for that hello and address (or is
    not ``broker_id``, where given: the broker a record names)."""
    try:
        given = json.loads(answer)
        found, challenge, clock, proof = (
            given["broker"],
            given["challenge"],
            given["clock"],
            given["proof"],
        )
    except (ValueError, TypeError, KeyError):
        return None
    if not (
        isinstance(found, str)
        and broker_id in (None, found)
        and is_nonce(challenge)
        and type(clock) is int
        and isinstance(proof, str)
        and same_mac(proof, hello_proof(key, found, target, nonce, challenge, clock))
    ):
        return None
    return ClientSession(key, found, challenge, clock)
