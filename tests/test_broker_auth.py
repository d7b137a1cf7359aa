"""How a queue broker with a token and its clients authenticate each other, attacked by
processes without the token (docs/BROKER.md "Security"): an impostor that relays a client's
hello to the real broker, and a replay of captured proofs. Real broker processes, real
attacker processes (``tests/impostor.py``), real clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.flight as flight
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


REPLAY = """
import json, sys, time
import pyarrow.flight as flight

address, captured, deadline = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
client = flight.FlightClient(f"grpc://{address}")


def attempt(header, action, body):
    options = flight.FlightCallOptions(headers=[(b"authorization", header.encode())])
    try:
        list(client.do_action(flight.Action(action, bytes.fromhex(body)), options))
        return "taken"
    except flight.FlightUnauthenticatedError:
        return "refused"


stats, held = captured["stats"], captured["held"]
outcomes = [
    attempt(stats["header"], "stats", stats["body"]),  # used once already
    attempt(held["header"], "stats", stats["body"]),  # made for another call
]
time.sleep(max(0.0, deadline - time.time()))
outcomes.append(attempt(held["header"], "lease", held["body"]))  # never used, expired
print(json.dumps(outcomes))
"""


def test_a_captured_proof_is_taken_once_for_its_call_and_only_within_its_lifetime(tmp_path):
    """Whoever sees a client's calls (here a process forwarding them, at the broker's
    advertised address) holds proofs that each serve one call of one session, once, for
    --proof-lifetime (4 s here). Replayed over new connections by a process without the
    token: a used proof is refused, as is an unused one for another call, and an unused
    one 6 s after it was made; an unused one inside its lifetime serves its own call once
    (what TLS, required beyond loopback, keeps from anyone on the path)."""
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").publish("jobs", [f"m{i}" for i in range(10)])
    port = free_port()
    journal = tmp_path / "forwarder.jsonl"
    to = f"127.0.0.1:{port}"
    with Impostor("forward", to, journal, "--hold", "lease") as forwarder:
        flags = ["--listen", to, "--advertise", f"127.0.0.1:{forwarder.port}"]
        flags += ["--proof-lifetime", "4s"]
        with BrokerProcess(path, *flags, log_path=tmp_path / "broker.log", env=ENV) as broker:
            dialing = f"127.0.0.1:{forwarder.port}"
            first = QueueTable(path, broker=dialing, broker_token=TOKEN)
            assert first.stats("jobs")["added"] == 10  # through the forwarder
            # Held back: the client hears of no answer and leases directly.
            assert len(first.lease("jobs", consumer="worker", max_messages=1)) == 1
            (stats,) = [e for e in forwarder.journal() if e.get("method") == "stats"]
            (held,) = [e for e in forwarder.journal() if e["event"] == "held"]
            unused = {"header": held["authorization"][0], "body": held["body"]}
            # Inside its lifetime, the unused proof serves its call, once.
            replayer = flight.FlightClient(f"grpc://{to}")
            header = [(b"authorization", unused["header"].encode())]
            action = flight.Action("lease", bytes.fromhex(unused["body"]))
            options = flight.FlightCallOptions(headers=header)
            assert len(list(replayer.do_action(action, options))) == 1
            with pytest.raises(flight.FlightUnauthenticatedError, match="used before"):
                list(replayer.do_action(action, options))
            replayer.close()
            # A second session's lease, held back: a proof made and never used.
            second = QueueTable(path, broker=dialing, broker_token=TOKEN)
            assert len(second.lease("jobs", consumer="worker", max_messages=1)) == 1
            made = time.time()
            (_, later) = [e for e in forwarder.journal() if e["event"] == "held"]
            assert later["authorization"][0].split(".")[0] != unused["header"].split(".")[0]
            captured = {
                "stats": {"header": stats["authorization"][0], "body": stats["body"]},
                "held": {"header": later["authorization"][0], "body": later["body"]},
            }
            replayed = subprocess.run(
                [sys.executable, "-c", REPLAY, to, json.dumps(captured), str(made + 6.0)],
                capture_output=True,
                text=True,
                timeout=120,
                env={k: v for k, v in os.environ.items() if k != "SPARK_QUEUE_BROKER_TOKEN"},
            )
            assert replayed.returncode == 0, replayed.stderr
            assert json.loads(replayed.stdout) == ["refused"] * 3
            assert time.time() - made >= 6.0
            leased = QueueTable(path, broker="off").stats("jobs")["leased"]
            assert leased == 3  # two direct leases and the one inside the lifetime
            assert broker.stop() == 0
    log = broker.output()
    assert log.count("a replayed proof") == 2
    assert "refused a stats call" in log and "a wrong proof" in log
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
