"""The queue broker at its edges: uploads too large or cut off, tokens gRPC cannot carry,
forged discovery records, a stop held up by a stalled upload, long error messages, Flight
methods it does not serve, failed logins, and the token kept out of pickles. Real broker
processes on real Delta tables."""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from spark_queue import QueueTable
from spark_queue.broker.discovery import BROKERS_FOLDER, DEFAULT_MAX_REQUEST_BYTES, read_records
from spark_queue.broker.wire import PROTOCOL, decode_error, encode_result
from spark_queue.errors import (
    BrokerAuthenticationError,
    BrokerRequestError,
    QueueError,
)
from spark_queue.model.messages import as_input_table
from spark_queue.model.results import PublishOutcome, PublishResult
from spark_queue.storage.location import Location
from tests.brokers import BrokerProcess, wait_until

TOKEN = "edge-token-5b1f0c9e27d4"
LIMIT = 1024 * 1024  # the open broker's --max-request-bytes


def version(path: str) -> int:
    return QueueTable(path, broker="off").store.open().version()


@pytest.fixture(scope="module")
def open_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker without a token, refusing requests above 1 MiB."""
    folder = tmp_path_factory.mktemp("open-broker")
    path = str(folder / "queues")
    QueueTable(path, broker="off").publish("jobs", ["first"])
    with BrokerProcess(
        path, "--max-request-bytes", str(LIMIT), log_path=folder / "broker.log"
    ) as broker:
        yield broker


@pytest.fixture(scope="module")
def token_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    folder = tmp_path_factory.mktemp("token-broker")
    path = str(folder / "queues")
    QueueTable(path, broker="off").publish("jobs", ["first"])
    env = {"SPARK_QUEUE_BROKER_TOKEN": TOKEN}
    with BrokerProcess(path, log_path=folder / "broker.log", env=env, token=TOKEN) as broker:
        yield broker


def peak_memory(pid: int) -> int:
    """A process's peak resident memory so far, in bytes (Linux)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def upload(
    address: str, request: bytes, rows: pa.Table, *, finish: bool = True
) -> tuple[bytes | None, Exception | None]:
    """A publish sent by a Flight client of its own: ``request`` then ``rows`` one row a
    batch, ended with ``done_writing`` (``finish``) or closed without it; the broker's
    answer, or the error it sent."""
    client = flight.FlightClient(f"grpc://{address}")
    descriptor = flight.FlightDescriptor.for_command(request)
    writer, answers = client.do_put(descriptor, rows.schema)
    try:
        writer.write_table(rows, max_chunksize=1)
        if finish:
            writer.done_writing()
            answer = answers.read()
            writer.close()
            return answer.to_pybytes(), None
        writer.close()
    except flight.FlightError as error:
        return None, decode_error(error.extra_info) if error.extra_info else error
    finally:
        client.close()
    return None, None


def publish_request(path: str, rows: pa.Table, declared_rows: int) -> bytes:
    """A publish of ``rows`` to the queue "jobs" that declares ``declared_rows``."""
    request = {
        "protocol": PROTOCOL,
        "table": path,
        "method": "publish",
        "arguments": {"queue": "jobs"},
        "upload": {"rows": declared_rows, "bytes": rows.nbytes},
    }
    return json.dumps(request).encode()


def test_an_upload_over_the_limit_is_refused_before_the_broker_holds_it(open_broker):
    """A 128 MiB message to a broker with a 1 MiB limit is refused on its request, before
    the broker reads it: the broker's peak memory does not grow by the message. An upload
    that brings more than its request declares is refused as soon as it passes the limit
    or the rows declared."""
    path, broker = open_broker.path, open_broker
    before, peak = version(path), peak_memory(broker.process.pid)
    pinned = QueueTable(path, broker=broker.address)
    huge = pa.table({"body": pa.array([b"x" * (128 << 20)], pa.binary())})
    for _ in range(2):
        with pytest.raises(BrokerRequestError, match=r"request too large: .* limit of 1048576"):
            pinned.publish("jobs", huge)
    del huge
    assert peak_memory(broker.process.pid) - peak < 32 << 20
    rows = as_input_table([b"y" * (256 << 10)] * 8)  # 2 MiB in 8 batches
    answer, error = upload(broker.address, publish_request(path, rows.slice(0, 1), 8), rows)
    assert answer is None and isinstance(error, BrokerRequestError), error
    assert "request too large" in str(error)
    rows = as_input_table(["a", "b", "c"])
    answer, error = upload(broker.address, publish_request(path, rows, 2), rows)
    assert isinstance(error, BrokerRequestError), error
    assert "brings more than the 2 rows its request declares" in str(error)
    assert version(path) == before


def test_a_cut_off_upload_is_refused_and_nothing_is_written(open_broker):
    """A publish declares its rows: an upload closed without ``done_writing`` after 5 of
    its 10 rows is refused, every time, and nothing is stored; the whole upload is."""
    path, broker = open_broker.path, open_broker
    rows = as_input_table([f"m{i}" for i in range(10)])
    request = publish_request(path, rows, 10)
    before = version(path)
    for _ in range(3):
        answer, error = upload(broker.address, request, rows.slice(0, 5), finish=False)
        assert answer is None and isinstance(error, BrokerRequestError), error
        assert str(error).startswith("cut-off upload: 5 of the 10 rows")
    assert version(path) == before
    answer, error = upload(broker.address, request, rows)
    assert error is None and len(json.loads(answer)["seqs"]) == 10
    assert version(path) == before + 1


def test_tokens_grpc_cannot_carry_are_refused_with_a_named_error(token_broker, tmp_path):
    """A token with a newline (read from a file), a non-ASCII character, or only spaces is
    refused where it is given, naming it, in the client (gRPC would abort on it) and
    in the broker."""
    script = """if True:
        import os, sys
        from spark_queue import QueueTable
        def attempt(token):
            try:
                table = QueueTable(sys.argv[1], broker=sys.argv[2], broker_token=token)
                table.publish("jobs", ["x"])
                print("accepted")
            except Exception as error:
                print(type(error).__name__, error)
        for token in ("tok\\n", "t\\u00f6k", "   ", ""):
            attempt(token)
        os.environ["SPARK_QUEUE_BROKER_TOKEN"] = "secret\\n"
        attempt(None)
    """
    env = {k: v for k, v in os.environ.items() if k != "SPARK_QUEUE_BROKER_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-c", script, token_broker.path, token_broker.address],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 5 and all(line.startswith("InvalidOptionError ") for line in lines)
    assert "broker_token must be printable ASCII" in lines[0] and "a newline" in lines[0]
    assert "character U+00F6" in lines[1]
    assert "broker_token is blank" in lines[2] and "broker_token is blank" in lines[3]
    assert "$SPARK_QUEUE_BROKER_TOKEN must be printable ASCII" in lines[4]
    assert "secret" not in done.stdout
    path = str(tmp_path / "queues")
    for flags, given, text in (
        (["--token", "tok\n"], {}, "--token must be printable ASCII"),
        ([], {"SPARK_QUEUE_BROKER_TOKEN": "   "}, "$SPARK_QUEUE_BROKER_TOKEN is blank"),
    ):
        refused = subprocess.run(
            [sys.executable, "-m", "spark_queue.cli", "broker", path, *flags],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, **given},
        )
        assert refused.returncode == 2 and text in refused.stderr, refused.stderr
        assert refused.stdout == ""
    assert not (tmp_path / "queues").exists()


class FakeBroker(flight.FlightServerBase):
    """What anyone who can write to a table's store can run and record there: it notes
    every call it gets (method, headers) and answers every publish with seq 424242."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        calls = self.calls

        class Recorder(flight.ServerMiddlewareFactory):
            def start_call(self, info, headers):
                calls.append((str(info.method), headers))

        super().__init__("grpc://127.0.0.1:0", middleware={"recorder": Recorder()})

    def do_action(self, context, action):
        answer = {"broker": "forged", "token_required": True, "proof": "0" * 64}
        yield flight.Result(pa.py_buffer(json.dumps(answer).encode()))

    def do_put(self, context, descriptor, reader, writer):
        count = reader.read_all().num_rows
        result = PublishResult("jobs", [424242], 0, 0, 0)
        writer.write(pa.py_buffer(encode_result("publish", PublishOutcome(result, np.ones(count)))))

    def sent_token(self) -> bool:
        return any(TOKEN in json.dumps(headers) for _, headers in self.calls)


def forge(path: str, fake: FakeBroker, **fields: object) -> None:
    """A record a store writer wrote by hand: the earliest start, a heartbeat for hours."""
    record = {
        "id": "forged",
        "address": f"127.0.0.1:{fake.port}",
        "table": path,
        "pid": 1,
        "host": socket.gethostname(),
        "started_at": 0.0,
        "heartbeat_at": time.time() + 3600,
        "heartbeat_seconds": 2.0,
        "token_required": True,
        "max_request_bytes": DEFAULT_MAX_REQUEST_BYTES,
        "protocol": PROTOCOL,
        "tls": False,
        **fields,
    }
    fs, base = Location.of(path).filesystem()
    fs.create_dir(f"{base}/{BROKERS_FOLDER}", recursive=True)
    with fs.open_output_stream(f"{base}/{BROKERS_FOLDER}/forged.json") as out:
        out.write(json.dumps(record).encode())


def test_a_forged_broker_record_gets_neither_the_token_nor_the_messages(
    token_broker, tmp_path, caplog
):
    """A record written into the store by someone without the token is not used: the
    client goes to the genuine broker, sends the forger nothing, and its message is stored.
    A signed record whose address answers without proving it holds the token gets a hello
    and nothing else: the client commits directly. A client without a token uses no record
    of a broker elsewhere than on its own loopback."""
    path, broker = token_broker.path, token_broker
    with FakeBroker() as fake:
        forge(path, fake)
        try:
            table = QueueTable(path, broker_token=TOKEN)
            served = broker.status()["served"]
            published = table.publish("jobs", ["trusted"])
            assert published.seqs != [424242]
            assert fake.calls == [] and not fake.sent_token()
            assert broker.status()["served"] == served + 1
            assert table.peek("jobs", limit=100)["body"].to_pylist()[-1] == b"trusted"
            # The warning says the record is ignored, not that calls go direct: they did not.
            (ignored,) = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
            assert "not signed with this client's token" in ignored
            assert "directly" not in ignored
        finally:
            Location.of(path).delete([f"{BROKERS_FOLDER}/forged.json"])

        from spark_queue.broker.auth import token_key
        from spark_queue.broker.discovery import BrokerRecord, write_record

        # The genuine record, signed, pointing at an address that a process without the
        # token took over.
        (genuine,) = read_records(Location.of(path))
        other = str(tmp_path / "other")
        QueueTable(other, broker="off").publish("jobs", ["first"])
        taken = BrokerRecord(**{**genuine.__dict__, "address": f"127.0.0.1:{fake.port}"})
        write_record(Location.of(other), taken.signed(token_key(TOKEN)))
        moved = QueueTable(other, broker_token=TOKEN)
        assert moved.publish("jobs", ["direct"]).seqs == [1]  # committed here
        assert [method for method, _ in fake.calls] == ["FlightMethod.DO_ACTION"]
        assert "authorization" not in fake.calls[0][1] and not fake.sent_token()
        with pytest.raises(BrokerAuthenticationError, match="did not prove"):
            QueueTable(other, broker=f"127.0.0.1:{fake.port}", broker_token=TOKEN).publish(
                "jobs", ["pinned"]
            )
        assert len(fake.calls) == 2 and not fake.sent_token()

        # No token: a record of a broker on another machine (or wanting a token) is not used.
        lone = str(tmp_path / "lone")
        QueueTable(lone, broker="off").publish("jobs", ["first"])
        forge(lone, fake, token_required=False, host="elsewhere")
        assert QueueTable(lone, broker_token=None).publish("jobs", ["here"]).seqs == [1]
        assert len(fake.calls) == 2


def test_sigterm_cancels_a_stalled_upload_at_the_stop_deadline(tmp_path):
    """A client that holds an upload open does not hold the broker's stop up: past
    --stop-timeout the upload is cancelled, nothing of it is stored, and the broker exits."""
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").publish("jobs", ["first"])
    before = version(path)
    rows = as_input_table(["a", "b"])
    with BrokerProcess(path, "--stop-timeout", "1s", log_path=tmp_path / "broker.log") as broker:
        client = flight.FlightClient(f"grpc://{broker.address}")
        descriptor = flight.FlightDescriptor.for_command(publish_request(path, rows, 2))
        writer, _ = client.do_put(descriptor, rows.schema)
        writer.write_batch(rows.to_batches(max_chunksize=1)[0])  # then nothing more
        wait_until(lambda: broker.status()["in_flight"] == 1, what="the upload under way")
        broker.process.send_signal(signal.SIGTERM)
        assert broker.process.wait(timeout=60) == 0
        with pytest.raises((flight.FlightError, pa.ArrowException)):
            writer.close()
        client.close()
    assert "requests still open after 1 s (--stop-timeout): cancelled" in broker.output()
    assert version(path) == before


def test_a_long_error_message_is_trimmed_and_keeps_its_class(open_broker):
    """An error quoting a 20,000-character argument (a filter) reaches the client as its
    own class, its message cut below gRPC's header limit: the broker is not taken for
    unreachable."""
    path, broker = open_broker.path, open_broker
    table = QueueTable(path)
    assert table.router.address() == broker.address
    refused = broker.status()["refused"]
    long_filter = "x" * 20_000
    with pytest.raises(QueueError) as direct:
        QueueTable(path, broker="off").lease("jobs", "w", filter=long_filter)
    assert len(str(direct.value)) > 16_384  # what would not fit in gRPC's headers
    with pytest.raises(type(direct.value)) as routed:
        table.lease("jobs", "w", filter=long_filter)
    assert type(routed.value) is type(direct.value)
    assert len(str(routed.value).encode()) <= 4096 and "(cut: " in str(routed.value)
    assert str(routed.value)[:200] == str(direct.value)[:200]
    assert broker.status()["refused"] == refused + 1
    assert table.router.address() == broker.address  # still used, not skipped


@pytest.mark.parametrize("kind", ["open_broker", "token_broker"])
def test_flight_methods_a_broker_does_not_serve_get_one_clean_error(kind, request):
    """A broker with a token refuses them in its middleware: one line each. A broker
    without one (on loopback only) has no middleware, for speed: its handlers refuse them,
    and pyarrow adds a traceback to GetSchema's, after the same first line."""
    broker = request.getfixturevalue(kind)
    client = flight.FlightClient(f"grpc://{broker.address}")
    descriptor = flight.FlightDescriptor.for_command(b"x")
    # A stream of another kind, opened as a client opens a stream of calls (with a token,
    # with its opening proof: one without is refused as unauthenticated before this).
    opened = flight.FlightCallOptions(headers=broker.client()._stream_opening())
    for name, call in (
        ("DoGet", lambda: client.do_get(flight.Ticket(b"x")).read_all()),
        ("ListFlights", lambda: list(client.list_flights())),
        ("GetFlightInfo", lambda: client.get_flight_info(descriptor)),
        ("GetSchema", lambda: client.get_schema(descriptor)),
        ("DoExchange", lambda: client.do_exchange(descriptor, opened)[1].read_all()),
    ):
        # (pyarrow's client raises GetSchema's error as an OSError)
        with pytest.raises((flight.FlightServerError, OSError, pa.ArrowException)) as raised:
            call()
        message = str(raised.value).split(". Detail:")[0].removeprefix("Unknown error: ")
        assert message.startswith(f"{name} is not served by a spark-queue broker"), message
        if kind == "token_broker" or name != "GetSchema":
            assert "Traceback" not in str(raised.value) and "pyarrow" not in str(raised.value)
    client.close()


@pytest.mark.parametrize(
    "arguments",
    ["[" * 100_000 + "]" * 100_000, "9" * 5_000],
    ids=["nested too deeply", "a number of 5000 digits"],
)
def test_json_that_python_cannot_read_is_a_malformed_request(open_broker, arguments):
    """JSON a client may send but Python's decoder refuses (it raised RecursionError and
    ValueError, which came back as the broker's own failure) is the client's malformed
    request, and nothing is done."""
    path, broker = open_broker.path, open_broker
    before, failed = version(path), broker.status()["failed"]
    body = f'{{"protocol": {PROTOCOL}, "table": {json.dumps(path)}, "method": "ack", '
    body += f'"arguments": {{"queue": "jobs", "seqs": {arguments}}}}}'
    client = flight.FlightClient(f"grpc://{broker.address}")
    with pytest.raises(flight.FlightServerError) as raised:
        list(client.do_action(flight.Action("ack", body.encode())))
    client.close()
    error = decode_error(raised.value.extra_info)
    assert isinstance(error, BrokerRequestError), error
    assert str(error).startswith("malformed request: not a JSON object") and "\n" not in str(error)
    assert broker.status()["failed"] == failed
    assert version(path) == before


def test_failed_logins_are_logged_without_the_token_and_counted(token_broker):
    path, broker = token_broker.path, token_broker
    before = version(path)
    with pytest.raises(BrokerAuthenticationError, match="refused this client's token"):
        QueueTable(path, broker=broker.address, broker_token=None).publish("jobs", ["x"])
    client = flight.FlightClient(f"grpc://{broker.address}")
    forged = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer guessed")])
    with pytest.raises(flight.FlightUnauthenticatedError):
        list(client.do_action(flight.Action("stats", b"{}"), forged))
    client.close()
    assert broker.status()["unauthenticated"] == 2
    assert version(path) == before
    log = broker.log_path.read_text()
    assert "refused a stream call from an unnamed peer" in log  # the publish's stream
    assert "refused a stats call from ipv4:127.0.0.1:" in log and "a wrong proof" in log
    assert TOKEN not in log


def test_the_token_is_in_no_pickle_or_repr(token_broker, monkeypatch):
    """A pickled QueueTable keeps no token (nor its key); unpickled, it takes the token of
    $SPARK_QUEUE_BROKER_TOKEN, and finds and uses the broker with it."""
    monkeypatch.delenv("SPARK_QUEUE_BROKER_TOKEN", raising=False)
    table = QueueTable(token_broker.path, broker_token=TOKEN)
    pickled = pickle.dumps(table)
    assert TOKEN.encode() not in pickled
    assert TOKEN not in repr(table) and TOKEN not in repr(table.router)
    from spark_queue.broker.auth import token_key

    assert token_key(TOKEN) not in pickled
    assert pickle.loads(pickled).router.address() is None  # no token: the record is not used
    monkeypatch.setenv("SPARK_QUEUE_BROKER_TOKEN", TOKEN)
    restored = pickle.loads(pickled)
    assert restored.router.address() == token_broker.address
    served = token_broker.status()["served"]
    restored.publish("jobs", ["restored"])
    assert token_broker.status()["served"] == served + 1
