"""Streams of calls to a broker (``spark_queue.broker.streams``): each client thread's calls
on one Flight stream of its own, with real broker processes on real tables; a broker that
stops with streams open, one with a token and one that serves no streams keep their calls
exact."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from spark_queue import QueueTable
from spark_queue.broker import streams
from spark_queue.broker.wire import decode_error
from spark_queue.rules import identity_holds
from tests.brokers import BrokerProcess, wait_until

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


def test_a_broker_with_a_token_takes_each_call_as_an_rpc(tmp_path):
    """A stream's calls carry no proof of the token: such a broker serves no streams, and
    its clients send RPCs, each with its proof."""
    path = str(tmp_path / "queues")
    env = {"SPARK_QUEUE_BROKER_TOKEN": TOKEN}
    with BrokerProcess(path, log_path=tmp_path / "broker.log", env=env, token=TOKEN) as broker:
        table = QueueTable(path, broker=broker.address, broker_token=TOKEN)
        assert table.publish("jobs", ["a", "b"]).seqs == [0, 1]
        assert table.publish("jobs", ["c"]).seqs == [2]
        status = broker.status()
        assert (status["served"], status["streams_opened"]) == (2, 0)
        assert broker.stop() == 0


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
