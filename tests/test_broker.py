"""The queue broker (``spark-queue broker``): real broker processes on real Delta
tables; discovery, clean stops, faults (kill -9 under load, two brokers, an unreachable
one) and bad input (a wrong token, a request too large or malformed)."""

from __future__ import annotations

import ipaddress
import json
import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from deltalake import write_deltalake

from spark_queue import QueueTable
from spark_queue.broker.client import BrokerClient, wire_request
from spark_queue.broker.discovery import BROKERS_FOLDER, read_records, write_record
from spark_queue.broker.wire import INLINE_BODY_CHARS, PROTOCOL, decode_error, encode_request
from spark_queue.errors import BrokerAuthenticationError, BrokerRequestError, InvalidInputError
from spark_queue.model.schema import BROWSE_ARROW_SCHEMA
from spark_queue.rules import identity_holds
from spark_queue.storage.location import Location
from tests.brokers import BrokerProcess, Impostor, wait_until

TOKEN = "tok-3d9f1c77a0b24e5f"


def version(path: str) -> int:
    return QueueTable(path, broker="off").store.open().version()


def free_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_broker_serves_the_table_and_stops_cleanly_on_sigterm(tmp_path):
    path = str(tmp_path / "queues")
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        assert broker.address.startswith("127.0.0.1:")
        (record,) = read_records(Location.of(path))
        assert (record.address, record.id, record.token_required) == (
            broker.address,
            broker.id,
            False,
        )
        table = QueueTable(path)  # broker="auto": finds it in the table
        assert table.router.address() == broker.address
        assert table.publish("jobs", ["a", "b", "c"]).seqs == [0, 1, 2]
        leased = table.lease("jobs", "w", max_messages=2)
        assert leased["body"].to_pylist() == [b"a", b"b"]
        assert table.ack("jobs", leased["seq"].to_pylist(), "w") == 2
        stats = table.stats("jobs")
        assert (stats["acked"], stats["ready"]) == (2, 1) and identity_holds(stats)
        assert broker.status()["served"] == 4
        assert broker.stop() == 0
    assert read_records(Location.of(path)) == []  # a clean stop removes its record
    assert "stopped" in broker.output()
    direct = QueueTable(path)
    assert direct.router.address() is None
    assert direct.publish("jobs", ["d"]).seqs == [3]


def test_a_broker_beats_and_a_stale_record_is_ignored_then_removed(tmp_path):
    path = str(tmp_path / "queues")
    location = Location.of(path)
    with BrokerProcess(path, log_path=tmp_path / "first.log") as broker:
        (first,) = read_records(location)
        wait_until(
            lambda: read_records(location)[0].heartbeat_at > first.heartbeat_at,
            what="a second heartbeat",
        )
        # A record that started earlier but stopped beating is not used, nor tried.
        stale = replace(first, id="stale", started_at=0.0, heartbeat_at=time.time() - 60)
        write_record(location, stale)
        assert QueueTable(path).router.address() == broker.address
        with BrokerProcess(path, log_path=tmp_path / "second.log") as second:
            assert sorted(r.id for r in read_records(location)) == sorted([broker.id, second.id])
            assert second.stop() == 0
        assert broker.stop() == 0


def stopping_or_gone(broker: BrokerProcess) -> bool:
    try:
        return broker.status()["stopping"]
    except flight.FlightUnavailableError:
        return True


def test_sigterm_lets_the_requests_in_flight_finish(tmp_path):
    """A broker told to stop answers what it has started (here a publish of 500,000
    messages) before it exits, and refuses what comes after, which its client then commits
    directly: each publish enqueued once."""
    path = str(tmp_path / "queues")
    rows = pa.table({"body": pa.array([b"m" * 16] * 500_000, pa.binary())})
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        table = QueueTable(path, broker=broker.address)
        published: list = []
        thread = threading.Thread(target=lambda: published.append(table.publish("jobs", rows)))
        thread.start()
        wait_until(lambda: broker.status()["in_flight"] == 1, what="the publish under way")
        broker.process.send_signal(signal.SIGTERM)
        wait_until(lambda: stopping_or_gone(broker), what="the broker stopping")
        late = QueueTable(path, broker=broker.address).publish("jobs", ["late"])
        thread.join()
        assert broker.process.wait(timeout=60) == 0
    assert len(published[0].seqs) == 500_000 and len(late.seqs) == 1
    assert "'served': 1," in broker.output()  # answered by the broker, not run again here
    assert QueueTable(path, broker="off").stats("jobs")["added"] == 500_001


def test_an_unreachable_broker_is_passed_over_and_calls_commit_directly(tmp_path):
    path = str(tmp_path / "queues")
    nowhere = QueueTable(path, broker=f"127.0.0.1:{free_port()}")
    assert nowhere.publish("jobs", ["a"]).seqs == [0]  # nothing listens: committed here
    assert nowhere.router.address() is None  # and skipped for a while
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        broker.kill()  # kill -9: its record stays, with a fresh heartbeat
        (record,) = read_records(Location.of(path))
        assert record.live(record.heartbeat_at)
        table = QueueTable(path)
        assert table.router.address() == broker.address
        before = version(path)
        assert table.publish("jobs", ["b"]).seqs == [1]
        assert version(path) == before + 1
        assert table.router.address() is None
        leased = table.lease("jobs", "w", max_messages=5)
        assert table.ack("jobs", leased["seq"].to_pylist(), "w") == 2


def test_a_restarted_broker_takes_over_from_a_killed_one(tmp_path):
    path = str(tmp_path / "queues")
    first = BrokerProcess(path, log_path=tmp_path / "first.log")
    table = QueueTable(path)
    table.publish("jobs", ["a"])
    first.kill()
    assert table.publish("jobs", ["b"]).seqs == [1]  # directly
    with BrokerProcess(path, log_path=tmp_path / "second.log") as second:
        # A new client skips nothing: the killed broker's record is fresh, and first.
        fresh = QueueTable(path)
        fresh.publish("jobs", ["c"])  # fails over to here, skipping the dead one
        assert fresh.router.address() == second.address
        assert fresh.publish("jobs", ["d"]).seqs == [3]
        assert second.status()["served"] >= 1  # 2 if it got the first one's port
        assert second.stop() == 0
    assert [r.id for r in read_records(Location.of(path))] == [first.id]


def test_a_token_is_required_checked_and_never_shown(tmp_path):
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").publish("jobs", ["a"])
    env = {"SPARK_QUEUE_BROKER_TOKEN": TOKEN}
    with BrokerProcess(path, log_path=tmp_path / "broker.log", env=env, token=TOKEN) as broker:
        before = version(path)
        for token in (None, "wrong", TOKEN[:-1]):
            table = QueueTable(path, broker=broker.address, broker_token=token)
            with pytest.raises(BrokerAuthenticationError, match="this client's token") as e:
                table.publish("jobs", ["x"])
            assert TOKEN not in str(e.value)
        assert version(path) == before  # nothing was done
        table = QueueTable(path, broker_token=TOKEN)  # found in the table
        assert table.router.address() == broker.address
        assert table.publish("jobs", ["b"]).seqs == [1]
        assert broker.status()["served"] == 1
        (record,) = read_records(Location.of(path))
        assert record.token_required
        assert broker.stop() == 0
    assert TOKEN not in broker.output()
    assert TOKEN not in repr(table.router)


def test_a_broker_refuses_to_start_on_a_delta_table_that_is_not_a_queue_table(tmp_path):
    """The broker opens the table before it listens (warming up what its first requests
    would wait for), so a wrong path is an error at start, not in every client's call."""
    path = str(tmp_path / "events")
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}))
    refused = subprocess.run(
        [sys.executable, "-m", "spark_queue.cli", "broker", path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith("spark-queue: ")
    assert "holds a Delta table that is not a spark-queue table" in refused.stderr
    assert refused.stdout == ""  # it never announced an address
    assert not (tmp_path / "events" / BROKERS_FOLDER).exists()  # nor recorded one


def test_a_broker_beyond_loopback_needs_a_token_and_tls_and_answers_for_its_own_addresses(
    tmp_path, monkeypatch
):
    """Beyond loopback the broker starts only with a token and TLS (exit 2 otherwise, one
    line naming what is missing, nothing created). Listening on 0.0.0.0 it answers a
    client that dialed any IPv4 address of this machine on its port, and refuses one that
    reached it through a relay at another port, TLS or not."""
    path = str(tmp_path / "queues")
    untokened = {k: v for k, v in os.environ.items() if k != "SPARK_QUEUE_BROKER_TOKEN"}
    cert, key = self_signed(tmp_path, "127.0.0.1", "127.0.0.2")
    for env, flags, missing in (
        (untokened, [], "beyond loopback, without a token"),
        ({**untokened, "SPARK_QUEUE_BROKER_TOKEN": TOKEN}, [], "without TLS: give --tls-cert"),
    ):
        refused = subprocess.run(
            [
                sys.executable,
                "-m",
                "spark_queue.cli",
                "broker",
                path,
                "--listen",
                "0.0.0.0:0",
                *flags,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert refused.returncode == 2 and missing in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "queues").exists()
    port = free_port()
    flags = ["--listen", f"0.0.0.0:{port}", "--tls-cert", str(cert), "--tls-key", str(key)]
    env = {"SPARK_QUEUE_BROKER_TOKEN": TOKEN}
    monkeypatch.setenv("SPARK_QUEUE_BROKER_TLS_ROOTS", str(cert))
    with BrokerProcess(path, *flags, log_path=tmp_path / "broker.log", env=env) as broker:
        assert broker.address == f"{socket.gethostname()}:{port}"
        assert "TLS, token required" in broker.announcement
        for seq, host in enumerate(("127.0.0.1", "127.0.0.2")):
            dialed = QueueTable(path, broker=f"tls://{host}:{port}", broker_token=TOKEN)
            assert dialed.publish("jobs", [host]).seqs == [seq]
        with Impostor("tcp", f"127.0.0.1:{port}", tmp_path / "relay.jsonl") as relay:
            relayed = QueueTable(path, broker=f"tls://127.0.0.1:{relay.port}", broker_token=TOKEN)
            with pytest.raises(
                BrokerAuthenticationError, match=r"does not answer for 127\.0\.0\.1:"
            ):
                relayed.publish("jobs", ["relayed"])
        status = BrokerClient(f"tls://127.0.0.1:{port}", path, TOKEN).status()
        assert (status["served"], status["unauthenticated"]) == (2, 1)
        assert broker.stop() == 0
    assert TOKEN not in broker.output()
    assert "refused a broker-hello call from ipv4:127.0.0.1:" in broker.output()


def self_signed(folder: Path, *addresses: str) -> tuple[Path, Path]:
    """A certificate for ``addresses`` (default 127.0.0.1) signed by its own key (PEM
    files): its own root."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spark-queue test broker")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses or ("127.0.0.1",)]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "broker.pem", folder / "broker.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_a_broker_over_tls_is_used_by_clients_that_trust_it(tmp_path, monkeypatch):
    path = str(tmp_path / "queues")
    cert, key = self_signed(tmp_path)
    flags = ["--tls-cert", str(cert), "--tls-key", str(key)]
    with BrokerProcess(path, *flags, log_path=tmp_path / "broker.log") as broker:
        assert broker.target == f"tls://{broker.address}"
        (record,) = read_records(Location.of(path))
        assert record.tls
        # A client that cannot check the broker's certificate sends it nothing: it commits
        # directly.
        untrusting = QueueTable(path)
        assert untrusting.publish("jobs", ["a"]).seqs == [0]
        monkeypatch.setenv("SPARK_QUEUE_BROKER_TLS_ROOTS", str(cert))
        trusting = QueueTable(path)
        assert trusting.router.address() == broker.target
        assert trusting.publish("jobs", ["b"]).seqs == [1]
        assert broker.status()["served"] == 1
        pinned = QueueTable(path, broker=broker.target)
        assert pinned.stats("jobs")["added"] == 2
        assert broker.stop() == 0
    refused = subprocess.run(
        [sys.executable, "-m", "spark_queue.cli", "broker", path, "--tls-cert", str(cert)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--tls-cert and --tls-key go together" in refused.stderr


def test_too_large_and_malformed_requests_are_refused_and_change_nothing(tmp_path):
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").publish("jobs", ["a"])
    with BrokerProcess(
        path, "--max-request-bytes", "2000", log_path=tmp_path / "broker.log"
    ) as broker:
        before = version(path)
        pinned = QueueTable(path, broker=broker.address)
        large = [b"x" * 100] * 50
        with pytest.raises(BrokerRequestError, match=r"request too large: .* limit of 2000"):
            pinned.publish("jobs", large)
        with pytest.raises(BrokerRequestError, match="request too large"):
            pinned.ack("jobs", list(range(1000)))
        assert version(path) == before
        # A client that found the broker in the table knows its limit: it commits a larger
        # request itself, and sends the small ones.
        found = QueueTable(path)
        assert found.publish("jobs", large).seqs == list(range(1, 51))
        assert found.publish("jobs", ["small"]).seqs == [51]
        assert broker.status()["served"] == 1
        # It weighs a request as the broker does, whole: seqs whose arguments alone are
        # under the limit and whose request is over it are acked here too, not refused.
        seqs = list(range(1000, 1100))
        while (
            len(encode_request(found.router.location.uri, "ack", {"queue": "jobs", "seqs": seqs}))
            <= 2000
        ):
            seqs.append(seqs[-1] + 1)
        assert len(json.dumps({"queue": "jobs", "seqs": seqs})) < 2000
        assert found.ack("jobs", seqs) == 0
        assert broker.status()["served"] == 1
        before = version(path)
        client = flight.FlightClient(f"grpc://{broker.address}")

        def refusal(kind: str, body: bytes) -> str:
            with pytest.raises(flight.FlightServerError) as raised:
                list(client.do_action(flight.Action(kind, body)))
            error = decode_error(raised.value.extra_info)
            assert isinstance(error, BrokerRequestError)
            return str(error)

        def request(method: str, arguments: object, table: str = path, protocol=PROTOCOL):
            return json.dumps(
                {"protocol": protocol, "table": table, "method": method, "arguments": arguments}
            ).encode()

        for kind, body, text in (
            ("ack", b"\xff not json", "malformed request: not a JSON object"),
            ("ack", b"[1, 2]", "malformed request: not a JSON object"),
            ("ack", request("ack", {"queue": "jobs"}, protocol=9), "protocol 9"),
            ("ack", request("ack", {}, table="/elsewhere"), "wrong table"),
            ("drop", request("drop", {}), "method 'drop' is not one of"),
            ("ack", request("ack", [1]), "'arguments' is not a JSON object"),
            ("ack", request("ack", {"queue": "jobs", "seqs": [], "sqs": 1}), "unexpected keyword"),
            ("publish", request("publish", {"queue": "q", "rows": 1}), "no argument 'rows'"),
            ("ack", request("ack", {"queue": "jobs"}), "missing a required argument: 'seqs'"),
            ("lease", request("ack", {"queue": "jobs", "seqs": [0]}), "names the method 'ack'"),
            ("publish", request("publish", {"queue": "jobs"}), "publish goes by do_put"),
            ("publish", request("publish", {"queue": "jobs", "bodies": [1]}), "string bodies"),
            ("publish", request("publish", {"queue": "jobs", "bodies": []}), "string bodies"),
            ("ack", request("ack", {"queue": "jobs", "bodies": ["x"]}), "string bodies"),
        ):
            assert text in refusal(kind, body), (kind, body)
        assert version(path) == before
        status = broker.status()
        assert (status["refused"], status["failed"]) == (16, 0)


def run_load(
    tmp_path: Path, path: str, publishers: int, consumers: int, count: int, brokers: list[str]
) -> tuple[list[subprocess.Popen], list[subprocess.Popen], Path, Path]:
    """Start publisher and consumer processes (tests/broker_load.py) on ``path``; clients
    are given ``brokers`` in turn (an empty string: the one the table records)."""
    stop = tmp_path / "stop"
    started: dict[str, list[subprocess.Popen]] = {"publish": [], "consume": []}
    outputs = tmp_path / "out"
    outputs.mkdir()
    roles = [("publish", f"p{n}") for n in range(publishers)]
    roles += [("consume", f"c{n}") for n in range(consumers)]
    for number, (role, name) in enumerate(roles):
        command = [sys.executable, "-m", "tests.broker_load", role, path]
        command += [str(outputs / name), name, "--count", str(count), "--stop-file", str(stop)]
        broker = brokers[number % len(brokers)]
        if broker:
            command += ["--broker", broker]
        started[role].append(subprocess.Popen(command, cwd=Path(__file__).parent.parent))
    return started["publish"], started["consume"], stop, outputs


def lines(outputs: Path, kind: str) -> list[list[str]]:
    found = []
    for output in outputs.iterdir():
        for line in output.read_text().splitlines():
            if line.startswith(f"{kind} "):
                found.append(line.split()[1:])
    return found


def acked(outputs: Path) -> int:
    return sum(int(n) for (n,) in lines(outputs, "A"))


def check_delivery(path: str, outputs: Path) -> None:
    """Every acknowledged publish was consumed; a message seen twice was seen again only
    because a lease ran out (each delivery has a higher count); the queue is empty."""
    published = {body for (body,) in lines(outputs, "P")}
    deliveries: dict[str, list[int]] = defaultdict(list)
    for body, count in lines(outputs, "D"):
        deliveries[body].append(int(count))
    lost = published - set(deliveries)
    assert not lost, f"lost {len(lost)}: {sorted(lost)[:10]}"
    for body, counts in deliveries.items():
        assert len(counts) == len(set(counts)), f"{body} delivered twice with one count"
    stats = QueueTable(path, broker="off").stats("jobs")
    assert stats["added"] == len(published) == stats["acked"]
    assert (stats["ready"], stats["leased"], stats["scheduled"]) == (0, 0, 0)
    assert identity_holds(stats)


def finish(publishers: list, consumers: list, stop: Path) -> None:
    for process in publishers:
        assert process.wait(timeout=300) == 0
    stop.touch()
    for process in consumers:
        assert process.wait(timeout=300) == 0


def test_a_broker_killed_under_load_loses_nothing(tmp_path, seed):
    """kill -9 of the broker while 2 publishers and 3 consumers run through it: the clients
    commit directly, then go to a new broker; lost 0, duplicates only from expired leases."""
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").declare("jobs")
    kill_after = random.Random(seed).randrange(5, 40)
    print(f"killing the first broker after {kill_after} acks")
    first = BrokerProcess(path, log_path=tmp_path / "first.log")
    publishers, consumers, stop, outputs = run_load(tmp_path, path, 2, 3, 40, [""])
    try:
        wait_until(lambda: acked(outputs) >= kill_after, what=f"{kill_after} acks")
        first.kill()
        wait_until(lambda: acked(outputs) >= kill_after + 10, what="acks without a broker")
        with BrokerProcess(path, log_path=tmp_path / "second.log") as second:
            wait_until(lambda: second.status()["served"] > 0, what="the second broker used")
            finish(publishers, consumers, stop)
            assert second.stop() == 0
    finally:
        for process in publishers + consumers:
            if process.poll() is None:
                process.kill()
    check_delivery(path, outputs)


def test_two_brokers_on_one_table_stay_exact(tmp_path):
    """Two brokers serve one table at once, each to half the clients: optimistic commits
    keep the table exact (no message lost or delivered twice)."""
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").declare("jobs")
    with (
        BrokerProcess(path, log_path=tmp_path / "one.log") as one,
        BrokerProcess(path, log_path=tmp_path / "two.log") as two,
    ):
        publishers, consumers, stop, outputs = run_load(
            tmp_path, path, 2, 2, 30, [one.address, two.address]
        )
        try:
            finish(publishers, consumers, stop)
        finally:
            for process in publishers + consumers:
                if process.poll() is None:
                    process.kill()
        assert one.status()["served"] > 0 and two.status()["served"] > 0
        assert (one.stop(), two.stop()) == (0, 0)
    check_delivery(path, outputs)
    counts = Counter(body for body, _ in lines(outputs, "D"))
    assert set(counts.values()) == {1}  # no lease ran out: each message once


def test_a_broker_on_object_storage_records_itself_there(tmp_path, s3_table, s3_options):
    flags = [f"--storage-option={k}={v}" for k, v in s3_options.items()]
    location = Location.of(s3_table, s3_options)
    with BrokerProcess(s3_table, *flags, log_path=tmp_path / "broker.log") as broker:
        (record,) = read_records(location)
        assert record.address == broker.address
        table = QueueTable(s3_table, storage_options=s3_options)
        assert table.router.address() == broker.address
        assert table.publish("jobs", ["a", "b"]).seqs == [0, 1]
        leased = table.lease("jobs", "w")
        assert table.ack("jobs", leased["seq"].to_pylist(), "w") == 2
        assert broker.status()["served"] == 3
        assert broker.stop() == 0
    assert read_records(location) == []
    assert s3_options["AWS_SECRET_ACCESS_KEY"] not in broker.output()
    fs, base = location.filesystem()
    assert fs.get_file_info(f"{base}/{BROKERS_FOLDER}").type.name in ("NotFound", "Directory")


def test_results_and_arrow_rows_travel_intact(tmp_path):
    """Publish's rows go as Arrow and the leased rows come back as Arrow, types and all; a
    QueueTable still pickles (its router without its connections)."""
    path = str(tmp_path / "queues")
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        table = pickle.loads(pickle.dumps(QueueTable(path, broker=broker.address)))
        rows = pa.table(
            {
                "body": pa.array([b"\x00\xff", b"two"], pa.binary()),
                "key": ["k", None],
                "headers": pa.array([[("h", "v")], None], pa.map_(pa.string(), pa.string())),
                "priority": pa.array([1, 0], pa.int32()),
            }
        )
        assert table.publish("jobs", rows).seqs == [0, 1]
        leased = table.lease("jobs", "w", max_messages=2)
        assert leased.schema == BROWSE_ARROW_SCHEMA
        assert leased["body"].to_pylist() == [b"\x00\xff", b"two"]
        assert leased["headers"].to_pylist() == [[("h", "v")], None]
        assert leased["key"].to_pylist() == ["k", None]
        # numpy values travel as the numbers they hold, through the broker all the same
        assert table.publish("jobs", ["three"]).seqs == [2]
        more = table.lease("jobs", "w", max_messages=np.int64(1), lease_period=np.int64(60))
        assert more["seq"].to_pylist() == [2]
        assert broker.status()["served"] == 4


def test_string_bodies_travel_in_the_request_and_other_rows_as_arrow(tmp_path):
    """A publish of a few string bodies carries them in its request (a do_action, no
    upload); other rows go as Arrow record batches (do_put). Both store what was given, and
    a body the table refuses is refused as it is without a broker."""
    path = str(tmp_path / "queues")
    bodies = ["one", "", "é\u2603"]
    request, rows = wire_request(path, "publish", {"queue": "jobs", "rows": bodies})
    assert rows is None and json.loads(request)["arguments"]["bodies"] == bodies
    assert "upload" not in json.loads(request)
    for given in ([b"bytes"], ["x" * (INLINE_BODY_CHARS + 1)], [{"body": "one"}]):
        request, rows = wire_request(path, "publish", {"queue": "jobs", "rows": given})
        assert rows is not None and "bodies" not in json.loads(request)["arguments"], given
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        table = QueueTable(path, broker=broker.address)
        assert table.publish("jobs", bodies).seqs == [0, 1, 2]
        assert table.publish("jobs", ("four",)).seqs == [3]
        assert table.publish("jobs", [b"five"]).seqs == [4]
        with pytest.raises(InvalidInputError) as raised:
            table.publish("jobs", ["six", "\ud800"])
        with pytest.raises(InvalidInputError) as direct:
            QueueTable(path, broker="off").publish("jobs", ["six", "\ud800"])
        assert str(raised.value) == str(direct.value)
        status = broker.status()
        assert (status["served"], status["refused"]) == (3, 1)
    leased = QueueTable(path, broker="off").lease("jobs", "w", max_messages=10)
    assert leased["body"].to_pylist() == [b"one", b"", "é\u2603".encode(), b"four", b"five"]
