"""How a queue broker with a token and its clients authenticate each other, attacked by
processes without the token (docs/BROKER.md "Security"): an impostor that relays a client's
hello to the real broker, a replay of captured proofs, and peers that open uploads and
streams without a proof of their opening. Real broker processes, real attacker processes
(``tests/impostor.py``), real clients (Flight's, and raw gRPC calls that send no message)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from spark_queue import QueueTable
from spark_queue.broker.client import wire_request
from spark_queue.broker.sessions import ClientSession
from spark_queue.broker.streams import STREAM_OPENING
from spark_queue.broker.wire import (
    INLINE_BODY_CHARS,
    OPENING_HEADER,
    PUT_OPENING,
    TOKEN_HEADER,
    inline_bodies,
)
from spark_queue.errors import BrokerAuthenticationError
from tests.brokers import BrokerProcess, Impostor, session_with
from tests.test_broker import free_port

TOKEN = "auth-token-9c4e1a7b55d2"
ENV = {"SPARK_QUEUE_BROKER_TOKEN": TOKEN}


def version(path: str) -> int:
    return QueueTable(path, broker="off").store.open().version()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with a token on a table whose queue "jobs" holds one message."""
    folder = tmp_path_factory.mktemp("auth-broker")
    path = str(folder / "queues")
    QueueTable(path, broker="off").publish("jobs", ["first"])
    with BrokerProcess(path, log_path=folder / "broker.log", env=ENV, token=TOKEN) as process:
        yield process


@pytest.mark.parametrize(
    "mode, flags",
    [("relay", ()), ("relay", ("--rewrite-target",)), ("tcp", ())],
    ids=["flight-relay", "flight-relay-naming-the-broker", "tcp-relay"],
)
def test_an_impostor_relaying_the_hello_gets_no_message_and_no_proof(broker, tmp_path, mode, flags):
    """A client holding the token, pointed at an impostor that relays its hello to the
    real broker, refuses the impostor after the hello: it sends no message and no proof,
    and the impostor cannot lease at the broker with what it got. Relayed as it came, the
    hello names the impostor's address, which the broker does not answer for; relayed
    naming the broker's, the broker's proof names the broker's address, which the client
    did not dial."""
    path = broker.path
    table = QueueTable(path, broker="off")
    before, stats = version(path), table.stats("jobs")
    secret = f"secret body via {mode} {flags}"
    journal = tmp_path / "impostor.jsonl"
    with Impostor(mode, broker.address, journal, "--table", path, *flags) as impostor:
        pointed = QueueTable(path, broker=f"127.0.0.1:{impostor.port}", broker_token=TOKEN)
        with pytest.raises(BrokerAuthenticationError, match="did not prove") as refused:
            pointed.publish("jobs", [secret])
        with pytest.raises(BrokerAuthenticationError, match="did not prove"):
            pointed.lease("jobs", consumer="worker")
        got = impostor.journal()
    if mode == "tcp":
        sent = b"".join(bytes.fromhex(event["data"]) for event in got)
        assert b"broker-hello" in sent and secret.encode() not in sent
    else:
        kinds = [event["event"] for event in got]
        assert "call" not in kinds and "rows" not in kinds and "leased" not in kinds
        assert all("authorization" not in event.get("headers", {}) for event in got)
        assert secret not in json.dumps(got)
        if flags:  # the broker answered the hello it was sent: its answer leases nothing
            assert kinds.count("hello-answered") == 2 and kinds.count("lease-refused") == 2
        else:
            assert kinds.count("hello-refused") == 2
    if mode == "tcp" or not flags:
        assert f"does not answer for 127.0.0.1:{impostor.port}" in str(refused.value)
    assert version(path) == before  # nothing published, nothing leased
    assert table.stats("jobs")["leased"] == stats["leased"] == 0
    assert TOKEN not in broker.log_path.read_text()


# Replays captured calls to the broker at argv[1] over a connection of its own, each
# ``[header, method, body (hex), not before (Unix time)]`` of argv[2]; prints what each got.
REPLAY = """
import json, sys, time
import pyarrow.flight as flight

client = flight.FlightClient(f"grpc://{sys.argv[1]}")
outcomes = []
for header, method, body, not_before in json.loads(sys.argv[2]):
    time.sleep(max(0.0, not_before - time.time()))
    options = flight.FlightCallOptions(headers=[(b"authorization", header.encode())])
    try:
        list(client.do_action(flight.Action(method, bytes.fromhex(body)), options))
        outcomes.append("taken")
    except flight.FlightUnauthenticatedError:
        outcomes.append("refused")
print(json.dumps(outcomes))
"""


@contextlib.contextmanager
def captured_calls(folder: Path, *flags: str) -> Iterator[tuple[BrokerProcess, Impostor, str]]:
    """A broker with a token (and ``flags``) whose advertised address is a forwarder's,
    the forwarder, and the address the broker listens on: whatever a client sends it is
    recorded on its way (its leases held back, unanswered), as whoever sees the traffic of
    a broker without TLS would. The table's queue "jobs" holds 10 messages."""
    path = str(folder / "queues")
    QueueTable(path, broker="off").publish("jobs", [f"m{i}" for i in range(10)])
    listen = f"127.0.0.1:{free_port()}"
    with Impostor("forward", listen, folder / "forwarder.jsonl", "--hold", "lease") as forwarder:
        advertised = ["--listen", listen, "--advertise", f"127.0.0.1:{forwarder.port}"]
        with BrokerProcess(
            path, *advertised, *flags, log_path=folder / "broker.log", env=ENV
        ) as broker:
            yield broker, forwarder, listen


def replay(address: str, calls: list[tuple[str, str, str, float]]) -> list[str]:
    """``calls`` replayed to the broker at ``address`` by a process without the token."""
    replayed = subprocess.run(
        [sys.executable, "-c", REPLAY, address, json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "SPARK_QUEUE_BROKER_TOKEN"},
    )
    assert replayed.returncode == 0, replayed.stderr
    outcome: list[str] = json.loads(replayed.stdout)
    return outcome


def test_a_captured_proof_is_taken_once_and_only_for_its_call(tmp_path):
    """Whoever sees a client's calls holds proofs that each serve one call of one session,
    once. Replayed over a new connection by a process without the token: a used proof is
    refused, and an unused one for another call; an unused one serves its own call once
    within its lifetime (60 s), what TLS, required beyond loopback, keeps from anyone on
    the path."""
    with captured_calls(tmp_path) as (broker, forwarder, listen):
        client = QueueTable(broker.path, broker=broker.address, broker_token=TOKEN)
        assert client.stats("jobs")["added"] == 10  # through the forwarder
        # Held back: the client hears of no answer and leases directly.
        assert len(client.lease("jobs", consumer="worker", max_messages=1)) == 1
        got = forwarder.journal()
        (stats,) = [e for e in got if e["method"] == "stats"]
        (held,) = [e for e in got if e["event"] == "held"]
        used, unused = stats["authorization"][0], held["authorization"][0]
        outcomes = replay(
            listen,
            [
                (used, "stats", stats["body"], 0.0),
                (unused, "stats", stats["body"], 0.0),
                (unused, "lease", held["body"], 0.0),
                (unused, "lease", held["body"], 0.0),
            ],
        )
        assert outcomes == ["refused", "refused", "taken", "refused"]
        assert QueueTable(broker.path, broker="off").stats("jobs")["leased"] == 2
        assert broker.stop() == 0
    log = broker.output()
    assert "refused a stats call" in log and "a wrong proof" in log
    assert log.count("a replayed proof") == 2 and TOKEN not in log


def test_a_captured_proof_is_refused_once_its_lifetime_has_passed(tmp_path):
    """With --proof-lifetime 1s, a proof never used, replayed 2 s after it was made by a
    process without the token, is refused as expired; each session has a challenge of its
    own."""
    with captured_calls(tmp_path, "--proof-lifetime", "1s") as (broker, forwarder, listen):
        for _ in range(2):
            client = QueueTable(broker.path, broker=broker.address, broker_token=TOKEN)
            assert len(client.lease("jobs", consumer="worker", max_messages=1)) == 1  # held
        made = time.time()
        first, second = [e for e in forwarder.journal() if e["event"] == "held"]
        header = second["authorization"][0]
        assert header.split(".")[0] != first["authorization"][0].split(".")[0]
        assert replay(listen, [(header, "lease", second["body"], made + 2.0)]) == ["refused"]
        assert time.time() - made >= 2.0
        assert QueueTable(broker.path, broker="off").stats("jobs")["leased"] == 2  # directly
        assert broker.stop() == 0
    log = broker.output()
    assert "refused a lease call" in log and "an expired proof" in log
    assert TOKEN not in log


def test_a_proof_lifetime_below_a_second_is_refused(tmp_path):
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_queue.cli",
            "broker",
            str(tmp_path / "q"),
            "--proof-lifetime",
            "500ms",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--proof-lifetime" in refused.stderr, refused.stderr
    assert not Path(tmp_path / "q").exists()


def test_a_session_takes_each_counter_once_in_any_order_within_its_window(seed):
    """Calls of one session arrive out of order (threads share it): the broker takes each
    counter once while it is less than 4,096 below the highest taken, and refuses it
    after, against a model that remembers every counter."""
    from spark_queue.broker.auth import call_proof, digest, token_key
    from spark_queue.broker.sessions import (
        COUNTER_WINDOW,
        PROOF_SCHEME,
        BrokerAddresses,
        CallChecks,
        clock_ms,
        new_nonce,
    )

    key, challenge, body = token_key(TOKEN), new_nonce(), b"{}"
    checks = CallChecks(key, "b", BrokerAddresses("127.0.0.1", 1, "127.0.0.1:1"))
    rng = random.Random(seed)
    taken: set[int] = set()
    highest = too_far = 0
    for _ in range(20_000):
        counter = max(1, highest + rng.randint(-COUNTER_WINDOW - 100, 100))
        too_far += counter not in taken and counter <= highest - COUNTER_WINDOW
        stamp = clock_ms()
        mac = call_proof(key, "b", challenge, counter, stamp, "stats", digest(body))
        why = checks.check(f"{PROOF_SCHEME} {challenge}.{counter}.{stamp}.{mac}", "stats", body)
        fresh = counter not in taken and counter > highest - COUNTER_WINDOW
        assert why == (None if fresh else "a replayed proof"), (counter, highest)
        if fresh:
            taken.add(counter)
            highest = max(highest, counter)
    assert len(taken) > 1000 and too_far > 10  # both sides of the window were tried


FLIGHT_SERVICE = "/arrow.flight.protocol.FlightService/"
OPENINGS = {"DoPut": PUT_OPENING, "DoExchange": STREAM_OPENING}
# A silent call's gRPC deadline: a broker that waits for its first message answers it
# only then (DEADLINE_EXCEEDED), where a refusal as it starts comes within a second or two.
SILENT_DEADLINE_SECONDS = 6.0


@contextlib.contextmanager
def silent_call(address: str, method: str, proof: str | None) -> Iterator[Any]:
    """A raw gRPC call of Flight's ``method`` at ``address``, opened with ``proof`` in its
    opening header (None: none) and sending no message, as a peer that holds a broker
    thread would: its answers (a gRPC future), cancelled on leaving."""
    release = threading.Event()

    def no_message() -> Iterator[bytes]:
        release.wait()  # until the call is left: gRPC reads this in a thread of its own
        yield from ()

    channel = grpc.insecure_channel(address)
    metadata = [] if proof is None else [(OPENING_HEADER, proof)]
    answers = channel.stream_stream(FLIGHT_SERVICE + method)(
        no_message(), metadata=metadata, timeout=SILENT_DEADLINE_SECONDS
    )
    try:
        yield answers
    finally:
        answers.cancel()
        release.set()
        channel.close()


def refused_as_it_starts(address: str, method: str, proof: str | None) -> float:
    """Open a silent call with ``proof``; the seconds until the broker refused it as
    unauthenticated."""
    with silent_call(address, method, proof) as answers:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as raised:
            next(answers)
        waited = time.monotonic() - started
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED, raised.value
    assert "fresh proof" in raised.value.details()
    return waited


def tampered(proof: str) -> str:
    return proof[:-4] + ("0000" if not proof.endswith("0000") else "1111")


@pytest.mark.parametrize("method", ["DoPut", "DoExchange"])
def test_an_upload_or_a_stream_opened_without_a_fresh_proof_of_its_opening_is_refused_at_once(
    tmp_path, method
):
    """A DoPut or a DoExchange holds a broker thread from its start, and Flight calls its
    handler only once its first message arrives. Opened sending no message, with no proof of
    its opening, a wrong one, one of the other opening, an expired one or one used before
    (by a call that stays open unanswered: its proof held, the broker waits for its first
    message), it is refused within two seconds, before its handler: nothing done, each
    refusal logged and counted."""
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").declare("jobs")
    before = version(path)
    flags = ("--proof-lifetime", "3s")
    with BrokerProcess(
        path, *flags, log_path=tmp_path / "broker.log", env=ENV, token=TOKEN
    ) as broker:
        session = session_with(broker.address, TOKEN)
        opening = OPENINGS[method]
        (other,) = set(OPENINGS.values()) - {opening}
        made, stale = time.monotonic(), session.header(opening, b"")
        used = session.header(opening, b"")
        with silent_call(broker.address, method, used) as taken:
            time.sleep(0.5)
            assert not taken.done()  # open, waiting for its first message
        refusals = [
            (None, "no proof"),
            (tampered(session.header(opening, b"")), "a wrong proof"),
            (session.header(other, b""), "a wrong proof"),
            (used, "a replayed proof"),
        ]
        waited = [refused_as_it_starts(broker.address, method, p) for p, _ in refusals]
        time.sleep(max(0.0, made + 3.5 - time.monotonic()))  # past its lifetime of 3 s
        waited.append(refused_as_it_starts(broker.address, method, stale))
        assert max(waited) < 2.0, waited
        status = broker.status()
        assert (status["unauthenticated"], status["served"], status["streams_opened"]) == (5, 0, 0)
        assert broker.stop() == 0
    assert version(path) == before
    lines = [line for line in broker.output().splitlines() if "refused a" in line]
    whys = [why for _, why in refusals] + ["an expired proof"]
    assert len(lines) == len(whys)
    for line, why in zip(lines, whys, strict=True):
        assert f"refused a {opening} call from an unnamed peer" in line and why in line, line
    assert TOKEN not in broker.output()


def put(address: str, request: bytes, rows: pa.Table, headers: list[tuple[str, str]]) -> None:
    """A publish's upload by ``do_put`` with ``headers``, sent whole; raises the broker's
    refusal."""
    client = flight.FlightClient(f"grpc://{address}")
    sent = [(name.encode(), value.encode()) for name, value in headers]
    options = flight.FlightCallOptions(headers=sent, timeout=30)
    writer, answers = client.do_put(
        flight.FlightDescriptor.for_command(request), rows.schema, options
    )
    try:
        writer.write_table(rows)
        writer.done_writing()
        answers.read()
    finally:
        writer.close()  # raises the broker's error, where it sent one
        client.close()


def upload(session: ClientSession, path: str, body: str) -> tuple[bytes, pa.Table, str]:
    """A publish of ``body``, too large to go inline: its request, its rows, and its
    request's proof in ``session``."""
    request, rows = wire_request(path, "publish", {"queue": "jobs", "rows": [body]})
    assert rows is not None
    return request, rows, session.header("publish", request)


def test_an_upload_is_taken_with_the_proof_of_its_opening_and_that_of_its_request(tmp_path):
    """A client with the token publishes rows too large to go inline (by do_put: its
    opening's proof checked as it starts, its request's before a row is read) and one
    message (on a stream). An upload with its request's proof alone is refused as it
    starts; one with an opening proof and the proof of another request is refused before
    its rows are read; a client without the token is told so: nothing of theirs stored."""
    path = str(tmp_path / "queues")
    large = "x" * (INLINE_BODY_CHARS + 1)
    assert inline_bodies([large]) is None
    with BrokerProcess(path, log_path=tmp_path / "broker.log", env=ENV, token=TOKEN) as broker:
        table = QueueTable(path, broker=broker.address, broker_token=TOKEN)
        assert table.publish("jobs", [large]).seqs == [0]
        assert table.publish("jobs", ["small"]).seqs == [1]
        status = broker.status()
        assert (status["served"], status["unauthenticated"], status["streams_opened"]) == (2, 0, 1)
        session = session_with(broker.address, TOKEN)
        request, rows, proof = upload(session, path, "y" * (INLINE_BODY_CHARS + 1))
        with pytest.raises(flight.FlightUnauthenticatedError, match="fresh proof"):
            put(broker.address, request, rows, [(TOKEN_HEADER, proof)])
        # (a request declares its rows' count and bytes, not their bodies)
        _, _, other_proof = upload(session, path, "z" * (INLINE_BODY_CHARS + 2))
        opening = session.header(PUT_OPENING, b"")
        with pytest.raises(flight.FlightUnauthenticatedError, match="fresh proof"):
            put(
                broker.address,
                request,
                rows,
                [(OPENING_HEADER, opening), (TOKEN_HEADER, other_proof)],
            )
        no_token = QueueTable(path, broker=broker.address, broker_token=None)
        with pytest.raises(BrokerAuthenticationError, match="refused this client's token"):
            no_token.publish("jobs", [large])
        status = broker.status()
        assert (status["served"], status["unauthenticated"]) == (2, 3)
        assert broker.stop() == 0
    log = broker.output()
    assert log.count("refused a put call from an unnamed peer") == 2
    assert "refused a publish call from ipv4:127.0.0.1:" in log and "a wrong proof" in log
    bodies = QueueTable(path, broker="off").peek("jobs")["body"].to_pylist()
    assert bodies == [large.encode(), b"small"]


def test_a_client_whose_broker_restarted_opens_a_new_session_when_its_opening_is_refused(
    tmp_path,
):
    """A broker that restarts at the same address has a new id: a client's session with the
    one before makes opening proofs it refuses as the upload or the stream starts. The
    client opens a new session and sends the call again, once: each call is taken once."""
    path = str(tmp_path / "queues")
    listen = f"127.0.0.1:{free_port()}"
    large = "x" * (INLINE_BODY_CHARS + 1)
    uploader = QueueTable(path, broker=listen, broker_token=TOKEN)
    streamer = QueueTable(path, broker=listen, broker_token=TOKEN)
    for name in ("first", "second"):
        with BrokerProcess(
            path, "--listen", listen, log_path=tmp_path / f"{name}.log", env=ENV, token=TOKEN
        ) as broker:
            assert len(uploader.publish("jobs", [large]).seqs) == 1
            # From a thread of its own: a stream the client opens, not one the broker before
            # ended.
            with ThreadPoolExecutor(1) as thread:
                assert len(thread.submit(streamer.publish, "jobs", [name]).result().seqs) == 1
            status = broker.status()
            refused = 0 if name == "first" else 2
            assert (status["served"], status["unauthenticated"]) == (2, refused)
            assert broker.stop() == 0
    log = broker.output()
    assert "refused a put call from an unnamed peer" in log
    assert "refused a stream call from an unnamed peer" in log
    assert log.count("a wrong proof") == 2
    bodies = QueueTable(path, broker="off").peek("jobs")["body"].to_pylist()
    assert sorted(bodies) == sorted([large.encode(), b"first", large.encode(), b"second"])
