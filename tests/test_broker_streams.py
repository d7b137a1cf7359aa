"""Streams of calls to a broker (``spark_queue.broker.streams``): each client thread's calls
on one Flight stream of its own, with real broker processes on real tables; a broker that
stops with streams open and one that serves no streams keep their calls exact; a broker
with a token opens a stream only with its own proof, and takes each call on it only with the
call's own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from spark_queue import QueueTable
from spark_queue.broker import streams
from spark_queue.broker.client import wire_request
from spark_queue.broker.sessions import ClientSession
from spark_queue.broker.wire import OPENING_HEADER, decode_error, decode_result
from spark_queue.errors import BrokerAuthenticationError
from spark_queue.rules import identity_holds
from tests.brokers import BrokerProcess, session_with, wait_until

TOKEN = "tok-5b2e8c41d07f4a9e"


def test_each_thread_sends_its_calls_on_one_stream_closed_when_it_ends(tmp_path):
    """Three threads' calls (publish, lease, ack, stats) on three streams, each answered
    as an RPC would be; a thread that ends closes its stream."""
    path = str(tmp_path / "queues")
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        table = QueueTable(path, broker=broker.address)

        def work(name: str) -> None:
            for n in range(4):
                table.publish(name, [f"{name}-{n}"])
            leased = table.lease(name, "w", max_messages=10)
            assert leased["body"].to_pylist() == [f"{name}-{n}".encode() for n in range(4)]
            assert table.ack(name, leased["seq"].to_pylist(), "w") == 4
            assert table.stats(name)["acked"] == 4

        threads = [threading.Thread(target=work, args=(f"q{n}",)) for n in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        status = broker.status()
        assert (status["served"], status["streams_opened"]) == (3 * 7, 3)
        wait_until(lambda: broker.status()["streams_open"] == 0, what="the streams closed")
        assert broker.stop() == 0
    direct = QueueTable(path, broker="off")
    assert [direct.stats(f"q{n}")["acked"] for n in range(3)] == [4, 4, 4]


def test_a_broker_stops_at_once_with_idle_streams_and_their_next_calls_commit_directly(
    tmp_path,
):
    """Streams left open, idle, do not hold a stopping broker until its stop timeout; a
    call on such a stream once it stopped is committed directly, once."""
    path = str(tmp_path / "queues")
    with BrokerProcess(path, "--stop-timeout=30", log_path=tmp_path / "broker.log") as broker:
        table = QueueTable(path, broker=broker.address)
        assert table.publish("jobs", ["a"]).seqs == [0]
        assert broker.status()["streams_open"] == 1  # this thread's, idle
        started = time.monotonic()
        assert broker.stop() == 0
        assert time.monotonic() - started < 10  # the linger (2 s), not the 30 s timeout
        assert "idle streams closed" in broker.output()
        assert table.publish("jobs", ["b"]).seqs == [1]  # on a stream that ended: here
    stats = QueueTable(path, broker="off").stats("jobs")
    assert stats["added"] == 2 and identity_holds(stats)


def test_a_broker_with_a_token_serves_calls_on_streams_each_with_its_proof(tmp_path):
    """A client with the token sends its calls on a stream, each with its own proof; the
    broker takes each once its proof holds."""
    path = str(tmp_path / "queues")
    env = {"SPARK_QUEUE_BROKER_TOKEN": TOKEN}
    with BrokerProcess(path, log_path=tmp_path / "broker.log", env=env, token=TOKEN) as broker:
        table = QueueTable(path, broker=broker.address, broker_token=TOKEN)
        assert table.publish("jobs", ["a", "b"]).seqs == [0, 1]
        assert table.publish("jobs", ["c"]).seqs == [2]
        status = broker.status()
        assert (status["served"], status["streams_opened"]) == (2, 1)
        assert status["unauthenticated"] == 0
        assert broker.stop() == 0
    assert QueueTable(path, broker="off").stats("jobs")["added"] == 3


def opening_of(session: ClientSession) -> Callable[[], list[tuple[bytes, bytes]]]:
    """A stream's opening headers: its own proof in ``session``."""
    return lambda: [(OPENING_HEADER.encode(), session.header(streams.STREAM_OPENING, b"").encode())]


def proven_streams(broker: BrokerProcess) -> tuple[ClientSession, streams.CallStreams]:
    """A session with ``broker`` (which has the token) and streams that open with proofs."""
    client = flight.FlightClient(f"grpc://{broker.address}")
    session = session_with(broker.address, TOKEN)
    return session, streams.CallStreams(client, 120.0, opening_of(session))


def publish_proven(
    calls: streams.CallStreams, session: ClientSession, path: str, body: str
) -> list[int]:
    """The seqs of a one-message publish sent on ``calls`` with a fresh proof."""
    request = publish_request(path, body)
    return seqs(calls.call("publish", session.header("publish", request), request))


def seqs(answer: pa.Buffer) -> list[int]:
    """The sequence numbers a publish's answer gives."""
    return decode_result("publish", answer.to_pybytes()).result.seqs


def publish_request(path: str, body: str) -> bytes:
    request, rows = wire_request(path, "publish", {"queue": "jobs", "rows": [body]})
    assert rows is None  # the request carries its body: a call on a stream
    return request


def other_body(session: ClientSession, path: str) -> str:
    return session.header("publish", publish_request(path, "other"))


def other_method(session: ClientSession, path: str) -> str:
    return session.header("lease", publish_request(path, "bad"))


def wrong(session: ClientSession, path: str) -> str:
    header = session.header("publish", publish_request(path, "bad"))
    return header[:-4] + ("0000" if not header.endswith("0000") else "1111")


def expired(session: ClientSession, path: str) -> str:
    header = session.header("publish", publish_request(path, "bad"))
    time.sleep(2.5)  # the proof's lifetime (1 s) and the second it may run ahead
    return header


@pytest.mark.parametrize(
    "proof, why",
    [
        (wrong, "a wrong proof"),
        (other_method, "a wrong proof"),
        (other_body, "a wrong proof"),
        (expired, "an expired proof"),
    ],
)
def test_a_call_on_a_stream_with_a_bad_proof_is_refused_alone(tmp_path, proof, why):
    """A call whose proof is wrong, made for another method or another body, or expired, is
    refused, nothing done, and the next call on the same stream with a good proof is taken."""
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").declare("jobs")
    before = QueueTable(path, broker="off").store.open().version()
    env = {"SPARK_QUEUE_BROKER_TOKEN": TOKEN}
    flags = ("--proof-lifetime", "1s")
    with BrokerProcess(
        path, *flags, log_path=tmp_path / "broker.log", env=env, token=TOKEN
    ) as broker:
        session, calls = proven_streams(broker)
        bad = publish_request(path, "bad")
        with pytest.raises(flight.FlightUnauthenticatedError, match="fresh proof"):
            calls.call("publish", proof(session, path), bad)
        assert QueueTable(path, broker="off").store.open().version() == before
        assert publish_proven(calls, session, path, "good") == [0]
        status = broker.status()
        assert (status["served"], status["unauthenticated"], status["streams_opened"]) == (1, 1, 1)
        assert broker.stop() == 0
    assert "refused a publish call from" in broker.output() and why in broker.output()
    bodies = QueueTable(path, broker="off").peek("jobs")["body"].to_pylist()
    assert bodies == [b"good"]


def test_a_proof_used_once_is_refused_on_the_same_stream(tmp_path):
    """A call sent again with its proof (its counter used) is refused: the message is
    enqueued once; the next call with a fresh proof is taken."""
    path = str(tmp_path / "queues")
    env = {"SPARK_QUEUE_BROKER_TOKEN": TOKEN}
    with BrokerProcess(path, log_path=tmp_path / "broker.log", env=env, token=TOKEN) as broker:
        session, calls = proven_streams(broker)
        once = publish_request(path, "once")
        header = session.header("publish", once)
        assert seqs(calls.call("publish", header, once)) == [0]
        with pytest.raises(flight.FlightUnauthenticatedError, match="fresh proof"):
            calls.call("publish", header, once)
        assert publish_proven(calls, session, path, "after") == [1]
        status = broker.status()
        assert (status["served"], status["unauthenticated"], status["streams_opened"]) == (2, 1, 1)
        assert broker.stop() == 0
    assert "a replayed proof" in broker.output()
    bodies = QueueTable(path, broker="off").peek("jobs")["body"].to_pylist()
    assert bodies == [b"once", b"after"]


def test_a_stream_without_a_proof_of_its_own_is_refused_by_a_broker_with_a_token(tmp_path):
    """A stream opens with a proof of its own, so that no peer without the token holds a
    broker thread: one without is refused before a call is read, nothing done; a client
    without the token is told so."""
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").declare("jobs")
    before = QueueTable(path, broker="off").store.open().version()
    env = {"SPARK_QUEUE_BROKER_TOKEN": TOKEN}
    with BrokerProcess(path, log_path=tmp_path / "broker.log", env=env, token=TOKEN) as broker:
        client = flight.FlightClient(f"grpc://{broker.address}")
        calls = streams.CallStreams(client, 120.0)
        for body in ("a", "b"):
            with pytest.raises(flight.FlightUnauthenticatedError, match="fresh proof"):
                calls.call("publish", None, publish_request(path, body))
        no_token = QueueTable(path, broker=broker.address, broker_token=None)
        with pytest.raises(BrokerAuthenticationError, match="refused this client's token"):
            no_token.stats("jobs")
        status = broker.status()
        assert (status["served"], status["unauthenticated"]) == (0, 3)
        assert (status["streams_opened"], status["streams_open"]) == (0, 0)
        assert broker.stop() == 0
    assert broker.output().count("no proof") == 3
    assert QueueTable(path, broker="off").store.open().version() == before


def test_a_broker_that_serves_no_streams_gets_rpcs(tmp_path, monkeypatch):
    """A broker that refuses the stream (of a release before streams: here, one asked for
    another kind of stream) has each call as an RPC of its own, the first one too."""
    monkeypatch.setattr(streams, "CALLS_COMMAND", b"calls-of-another-kind")
    path = str(tmp_path / "queues")
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        table = QueueTable(path, broker=broker.address)
        assert table.publish("jobs", ["a"]).seqs == [0]
        assert table.publish("jobs", ["b"]).seqs == [1]
        status = broker.status()
        assert (status["served"], status["streams_opened"]) == (2, 0)
        assert broker.stop() == 0
    assert QueueTable(path, broker="off").stats("jobs")["added"] == 2


@pytest.mark.parametrize("frame", [b"publish", b"\xff\xfe\nnot json"])
def test_a_malformed_frame_is_refused_alone_and_the_stream_goes_on(tmp_path, frame):
    """A frame that is no call is refused as a malformed request, nothing done, and the
    stream stays open for the next."""
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").declare("jobs")
    before = QueueTable(path, broker="off").store.open().version()
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        client = flight.FlightClient(f"grpc://{broker.address}")
        writer, reader = client.do_exchange(
            flight.FlightDescriptor.for_command(streams.CALLS_COMMAND)
        )
        for _ in range(2):
            writer.write_metadata(pa.py_buffer(frame))
            answer = reader.read_chunk().app_metadata.to_pybytes()
            assert answer[0] == streams.REFUSED
            assert "malformed request" in str(decode_error(answer[1:]))
        writer.close()
        assert broker.status()["refused"] == 2
        assert broker.stop() == 0
    assert QueueTable(path, broker="off").store.open().version() == before
