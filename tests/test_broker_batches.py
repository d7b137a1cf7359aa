"""Batches of publishes through a broker (``spark_queue.broker.batching`` and
``spark_queue.server.call_batches``): a client process's concurrent one-message publishes
share a message on a stream, and the broker answers each as if it came alone, with real
broker processes on real tables."""

from __future__ import annotations

import random
import threading
import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from spark_queue import QueueTable
from spark_queue.broker import streams
from spark_queue.broker.batching import PublishBatcher
from spark_queue.broker.client import BrokerClient, wire_request
from spark_queue.broker.wire import decode_error, decode_result
from spark_queue.errors import InvalidOptionError
from spark_queue.rules import identity_holds
from tests.brokers import BrokerProcess, wait_until
from tests.test_broker_streams import TOKEN, proven_streams, publish_request

Call = tuple[str, str | None, bytes]


def plain_streams(broker: BrokerProcess) -> streams.CallStreams:
    return streams.CallStreams(flight.FlightClient(f"grpc://{broker.address}"), 120.0)


def seqs_of(outcome: object) -> list[int]:
    assert isinstance(outcome, pa.Buffer), outcome
    return list(decode_result("publish", outcome.to_pybytes()).result.seqs)


def refusal_of(outcome: object) -> Exception | None:
    assert isinstance(outcome, flight.FlightServerError), outcome
    return decode_error(outcome.extra_info)


def publish_call(path: str, queue: str, body: str, **arguments: object) -> Call:
    request, rows = wire_request(
        path, "publish", {"queue": queue, "rows": [body], "arguments": arguments}
    )
    assert rows is None  # the request carries its body: a call on a stream
    return ("publish", None, request)


def test_a_batch_is_answered_call_by_call_each_with_its_own_result_or_error(tmp_path):
    """A batch of publishes to two queues, one of them partitioned (served on a thread of
    its own), and one whose queue arguments the table refuses: each is answered as alone,
    the refused one with its own error and nothing of it stored."""
    path = str(tmp_path / "queues")
    direct = QueueTable(path, broker="off")
    direct.declare("jobs")
    direct.declare("spread", partitions=3)
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        calls = [
            publish_call(path, "jobs", "a"),
            publish_call(path, "spread", "s1"),
            publish_call(path, "jobs", "b", max_length="many"),
            publish_call(path, "jobs", "c"),
            publish_call(path, "spread", "s2"),
        ]
        outcomes = plain_streams(broker).call_batch(calls)
        jobs = seqs_of(outcomes[0]) + seqs_of(outcomes[3])
        assert isinstance(refusal_of(outcomes[2]), InvalidOptionError)
        assert "max_length" in str(refusal_of(outcomes[2]))
        spread = seqs_of(outcomes[1]) + seqs_of(outcomes[4])
        assert len(spread) == 2 and len(set(jobs)) == 2  # seqs are unique in a table
        status = broker.status()
        assert (status["batches"], status["batched"]) == (1, 5)
        assert (status["served"], status["refused"]) == (4, 1)
        assert broker.stop() == 0
    assert sorted(direct.peek("jobs")["body"].to_pylist()) == [b"a", b"c"]
    assert direct.stats("spread")["added"] == 2 and identity_holds(direct.stats("jobs"))


def test_a_publish_whose_queue_was_partitioned_since_the_broker_looked_is_served_again(
    tmp_path,
):
    """The broker counted the queue's partitions as one; another process raised them
    since: the batch's publish, handed on as one of a queue without partitions, is refused
    by its commit and served again by partition, stored once."""
    path = str(tmp_path / "queues")
    direct = QueueTable(path, broker="off")
    direct.declare("jobs")
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        calls = plain_streams(broker)
        assert [
            len(seqs_of(o)) for o in calls.call_batch([publish_call(path, "jobs", "a")] * 2)
        ] == [1, 1]
        direct.alter("jobs", partitions=2)
        outcomes = calls.call_batch(
            [publish_call(path, "jobs", "b"), publish_call(path, "jobs", "c")]
        )
        assert [len(seqs_of(o)) for o in outcomes] == [1, 1]
        assert broker.stop() == 0
    assert direct.stats("jobs")["added"] == 4


def test_a_batch_holds_publishes_only_and_a_malformed_one_is_refused_whole(tmp_path):
    """A call of another method in a batch is refused alone; a batch that does not parse,
    or of more calls than a batch may hold, is refused whole, nothing done, and the stream
    goes on."""
    path = str(tmp_path / "queues")
    direct = QueueTable(path, broker="off")
    direct.declare("jobs")
    before = direct.store.open().version()
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        calls = plain_streams(broker)
        stats, _ = wire_request(path, "stats", {"queue": "jobs"})
        outcomes = calls.call_batch([("stats", None, stats), publish_call(path, "jobs", "a")])
        assert "a batch holds publishes only" in str(refusal_of(outcomes[0]))
        assert seqs_of(outcomes[1]) == [0]
        too_many = [publish_call(path, "jobs", "x")] * (streams.MAX_BATCH_CALLS + 1)
        for outcome in calls.call_batch(too_many):
            assert "malformed request: a batch of calls" in str(refusal_of(outcome))
        cut = streams.joined_frames(streams.BATCH, [b"publish\n\n{}"])[:-3]
        answer = calls._exchange(cut)  # a length past the frame's end
        assert answer[0] == streams.REFUSED
        assert "does not parse" in str(decode_error(answer[1:].to_pybytes()))
        assert seqs_of(calls.call_batch([publish_call(path, "jobs", "b")] * 2)[0]) in ([1], [2])
        assert broker.stop() == 0
    assert direct.stats("jobs")["added"] == 3
    assert direct.store.open().version() > before


def test_each_call_of_a_batch_needs_its_own_proof(tmp_path):
    """At a broker with a token, a call of a batch whose proof fails is refused alone, its
    request unread; the others are served."""
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").declare("jobs")
    env = {"SPARK_QUEUE_BROKER_TOKEN": TOKEN}
    with BrokerProcess(path, log_path=tmp_path / "broker.log", env=env, token=TOKEN) as broker:
        session, calls = proven_streams(broker)
        good, bad = publish_request(path, "good"), publish_request(path, "bad")
        forged = session.header("publish", good)  # made for another body
        batch = [
            ("publish", session.header("publish", good), good),
            ("publish", forged, bad),
            ("publish", None, bad),
        ]
        outcomes = calls.call_batch(batch)
        assert seqs_of(outcomes[0]) == [0]
        for outcome in outcomes[1:]:
            assert isinstance(outcome, flight.FlightUnauthenticatedError)
        status = broker.status()
        assert (status["served"], status["unauthenticated"]) == (1, 2)
        assert broker.stop() == 0
    assert QueueTable(path, broker="off").peek("jobs")["body"].to_pylist() == [b"good"]


class GatedSender:
    """A client's streams whose sends wait at ``gate``, each batch's size noted in ``sent``."""

    def __init__(self, streams: streams.CallStreams, gate: threading.Event, sent: list[int]):
        self.streams, self.gate, self.sent = streams, gate, sent

    def call(self, method: str, proof: str | None, request: bytes) -> pa.Buffer:
        self.sent.append(1)
        self.gate.wait()
        return self.streams.call(method, proof, request)

    def call_batch(self, calls: list[Call]) -> list[object]:
        self.sent.append(len(calls))
        self.gate.wait()
        return self.streams.call_batch(calls)


def test_publishes_that_come_while_a_batch_is_in_flight_go_together(tmp_path):
    """The batcher's turns, with the sends held at a gate, for the callers of two clients
    with sessions of their own at a broker with a token: the first publish goes alone; one
    that comes while it is in flight waits (the broker's round in flight holds as many);
    with more waiting than it holds, they go as a batch, each call with its own client's
    proof; two more wait for the batches in flight, then go together. Every caller has its
    own seqs, all distinct."""
    path = str(tmp_path / "queues")
    env = {"SPARK_QUEUE_BROKER_TOKEN": TOKEN}
    with BrokerProcess(path, log_path=tmp_path / "broker.log", env=env, token=TOKEN) as broker:
        gate = threading.Event()
        sent: list[int] = []
        clients = [proven_streams(broker) for _ in range(2)]
        batcher = PublishBatcher()
        answers: dict[str, list[int]] = {}

        def publish(body: str, n: int) -> None:
            session, calls = clients[n % 2]
            request = publish_request(path, body)
            call = ("publish", session.header("publish", request), request)
            answers[body] = seqs_of(batcher.call(call, GatedSender(calls, gate, sent)))

        threads = []
        for arrived, body in enumerate("abcde", start=1):
            threads.append(threading.Thread(target=publish, args=(body, arrived)))
            threads[-1].start()
            # Sent or queued: the next comes once this one is in its place.
            wait_until(lambda n=arrived: sum(sent) + len(batcher._queue) == n, timeout=30)
        assert sent == [1, 2]
        gate.set()
        for thread in threads:
            thread.join()
        assert sent == [1, 2, 2]
        assert sorted(s for seqs in answers.values() for s in seqs) == [0, 1, 2, 3, 4]
        status = broker.status()
        assert (status["batches"], status["unauthenticated"]) == (2, 0)
        assert broker.stop() == 0


def test_many_threads_publish_through_a_broker_each_message_once(tmp_path):
    """16 threads' one-message publishes through a broker, each thread with a QueueTable of
    its own (the process's publishes to the broker share batches all the same), released
    together in waves: every caller has its own seqs, every message is stored once, and
    the broker served every publish (in batches or alone)."""
    path = str(tmp_path / "queues")
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        QueueTable(path, broker=broker.address).publish("jobs", ["first"])
        barrier = threading.Barrier(16)
        seen: list[list[int]] = [[] for _ in range(16)]

        def work(n: int) -> None:
            table = QueueTable(path, broker=broker.address)
            for wave in range(6):
                barrier.wait()
                seen[n] += table.publish("jobs", [f"{n}-{wave}"]).seqs

        threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(s for seqs in seen for s in seqs) == list(range(1, 97))
        status = broker.status()
        assert status["served"] == 97 and status["refused"] == status["failed"] == 0
        assert broker.stop() == 0
    bodies = QueueTable(path, broker="off").peek("jobs", limit=200)["body"].to_pylist()
    assert sorted(bodies) == sorted(
        [b"first", *(f"{n}-{w}".encode() for n in range(16) for w in range(6))]
    )


def test_one_threads_publishes_go_alone_and_a_publish_of_rows_by_its_upload(tmp_path):
    """One thread's publishes never wait for a batch (each goes as a plain call), a publish
    of rows the request does not carry goes by its own upload, and the table's refusal
    reaches the caller as its own error."""
    path = str(tmp_path / "queues")
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        table = QueueTable(path, broker=broker.address)
        assert [table.publish("jobs", [body]).seqs for body in "abc"] == [[0], [1], [2]]
        rows = pa.table({"body": [b"x"], "priority": [3]})
        assert table.publish("jobs", rows).seqs == [3]
        with pytest.raises(InvalidOptionError, match="max_length"):
            table.publish("jobs", ["y"], max_length="many")
        status = broker.status()
        assert (status["batches"], status["served"], status["refused"]) == (0, 4, 1)
        assert broker.stop() == 0
    assert QueueTable(path, broker="off").stats("jobs")["added"] == 4


def test_the_batcher_answers_every_call_of_threads_that_come_and_go(seed):
    """16 threads, released together every third call, through a batcher whose sends take
    0-3 ms (an echo: each call's answer is its request): every call is answered with its
    own request, none waits for ever."""
    rng = random.Random(seed)

    class Echo:
        def call(self, method: str, proof: str | None, request: bytes) -> pa.Buffer:
            time.sleep(rng.random() * 0.003)
            return pa.py_buffer(request)

        def call_batch(self, calls: list[Call]) -> list[object]:
            time.sleep(rng.random() * 0.003)
            return [pa.py_buffer(request) for _, _, request in calls]

    batcher, echo = PublishBatcher(), Echo()
    threads, calls = 16, 120
    together = threading.Barrier(threads)
    answered = [0] * threads

    def work(n: int) -> None:
        for k in range(calls):
            if k % 3 == 0:
                together.wait()
            request = f"{n}-{k}".encode()
            assert batcher.call(("publish", None, request), echo).to_pybytes() == request
            answered[n] += 1

    workers = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(threads)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + 60
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    together.abort()  # a thread stuck in a call leaves the others at the barrier
    assert answered == [calls] * threads


def test_clients_share_a_batcher_only_where_they_trust_the_broker_alike():
    """The clients of a process for one broker and table share one batcher where they have
    the same token (and broker id and TLS roots); a call never travels on the stream of a
    client with another token, or none."""
    address, table = "127.0.0.1:1", "/tmp/batched-table"
    first, second = BrokerClient(address, table, TOKEN), BrokerClient(address, table, TOKEN)
    assert first._publishes is second._publishes
    for other in (
        BrokerClient(address, table, TOKEN + "x"),
        BrokerClient(address, table, None),
        BrokerClient(address, table, TOKEN, "another-broker"),
        BrokerClient(address, "/tmp/another-table", TOKEN),
    ):
        assert other._publishes is not first._publishes
