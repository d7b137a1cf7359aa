"""How a queue broker with a token and its clients authenticate each other, attacked by
processes without the token (docs/BROKER.md "Security"): an impostor that relays a client's
hello to the real broker, and a replay of captured proofs. Real broker processes, real
attacker processes (``tests/impostor.py``), real clients."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_queue import QueueTable
from spark_queue.errors import BrokerAuthenticationError
from tests.brokers import BrokerProcess, Impostor
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
