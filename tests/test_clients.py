"""Clients for services: the consumer (prefetch, batched acknowledgements, lease
extension, nack with delay, long polling, close) and the publisher (linger, batch size,
futures), on real tables. Waits are for conditions, with generous time limits."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from deltalake import DeltaTable

from spark_queue import ClientClosedError, QueueTable, StorageError
from spark_queue.rules import identity_holds
from tests.object_store import new_bucket, server_options, start_s3_server

PATIENCE = 60.0  # seconds a condition may take on a loaded machine before a test fails
PATIENCE_WAIT = "60s"  # the same, as a receive's wait_time


@pytest.fixture
def table(tmp_path) -> QueueTable:
    table = QueueTable(str(tmp_path / "queues"))
    table.declare("q")
    return table


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def receive_all(consumer, count: int) -> list:
    taken: list = []
    while len(taken) < count:
        got = consumer.receive(count - len(taken), wait_time=PATIENCE_WAIT)
        assert got, f"received {len(taken)} of {count}"
        taken += got
    return taken


def test_competing_consumers_deliver_every_message_once(table, seed):
    """Threads of three consumers (two sharing a name) handle 600 messages: each is acked
    exactly once, whatever the prefetch made of the sharing."""
    rng = random.Random(seed)
    total = 600
    table.publish("q", [f"m{i}" for i in range(total)])
    handled: list[str] = []
    lock = threading.Lock()
    names = ["a", "a", "b"]
    consumers = [table.consumer("q", name, ack_batch=rng.randint(1, 50)) for name in names]

    def work(consumer) -> None:
        for message in consumer:
            message.ack()  # before it counts as handled: the test closes at the last one
            with lock:
                handled.append(message.body.decode())
                finished = len(handled) >= total
            if finished:
                return

    threads = [threading.Thread(target=work, args=(c,)) for c in consumers for _ in range(2)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(handled) >= total, "every message was handled")
    for consumer in consumers:
        consumer.close()  # ends the other threads' iterations
    for thread in threads:
        thread.join()
    assert sorted(handled) == sorted(f"m{i}" for i in range(total))
    stats = table.stats("q")
    assert (stats["acked"], stats["ready"], stats["leased"]) == (total, 0, 0)
    assert identity_holds(stats)


def test_prefetch_never_exceeds_its_bound_and_a_slow_handler_holds_few(table):
    table.publish("q", [f"m{i}" for i in range(50)])
    with table.consumer("q", "bounded", max_prefetch=5) as consumer:
        taken = receive_all(consumer, 5)
        assert consumer.receive(1, wait_time="200ms") == []  # five in hand: no more leases
        assert table.stats("q")["leased"] == 5 and consumer.held() == 5
        taken[0].ack()
        assert len(receive_all(consumer, 1)) == 1
        assert consumer.held() <= 5
    # A handler slower than a lease: one in hand, at most one ahead (two, should a lease on
    # this loaded machine take longer than the handler's half second).
    with table.consumer("q", "slow") as consumer:
        for _ in range(6):
            (message,) = consumer.receive(1, wait_time=PATIENCE_WAIT)
            time.sleep(0.5)  # the handler's work
            assert consumer.held() <= 3
            assert table.stats("q")["leased_by_consumer"].get("slow", 0) <= 3
            message.ack()
            consumer.flush()


def test_acknowledgements_are_batched_and_flushed_by_count_time_and_close(table):
    table.publish("q", [f"m{i}" for i in range(5)])
    slow = {"ack_interval": "1h", "idle_lease_interval": "1h", "lease_period": "3h"}
    with table.consumer("q", "c", ack_batch=1000, **slow) as consumer:
        taken = receive_all(consumer, 5)
        wait_until(lambda: consumer.idle, "the consumer found the queue drained")
        for message in taken:
            message.ack()
        assert table.stats("q")["acked"] == 0  # pending: no count, time or close yet
    assert table.stats("q")["acked"] == 5  # close flushed them

    table.publish("q", [f"n{i}" for i in range(5)])
    with table.consumer("q", "c", ack_batch=3, **slow) as consumer:
        for message in receive_all(consumer, 3):
            message.ack()
        wait_until(lambda: table.stats("q")["acked"] >= 8, "three acks were flushed")
    with table.consumer("q", "c", ack_batch=1000, ack_interval=50) as consumer:
        for message in receive_all(consumer, 2):
            message.ack()
        wait_until(lambda: table.stats("q")["acked"] == 10, "acks were flushed by time")
    stats = table.stats("q")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (10, 0, 0)


def test_leases_in_hand_are_extended_while_the_handler_works(table):
    table.publish("q", ["slow work"])
    with table.consumer("q", "c", lease_period="2 seconds") as consumer:
        (message,) = consumer.receive(1, wait_time=PATIENCE_WAIT)
        time.sleep(5)  # the handler's work: two and a half lease periods
        assert table.lease("q", "other").num_rows == 0  # never redelivered meanwhile
        message.ack()
    stats = table.stats("q")
    assert (stats["acked"], stats["leased"]) == (1, 0)
    assert message.delivery_count == 1


def test_nack_with_delay_and_without(table):
    table.publish("q", ["again", "later"])
    with table.consumer("q", "c", max_prefetch=2) as consumer:
        first, second = receive_all(consumer, 2)
        second.nack(delay="1 hour")
        assert table.stats("q")["scheduled"] == 1
        first.nack(delay=0)
        (redelivered,) = consumer.receive(1, wait_time=PATIENCE_WAIT)
        assert (redelivered.body, redelivered.delivery_count) == (b"again", 2)
        redelivered.ack()
    stats = table.stats("q")
    assert (stats["acked"], stats["scheduled"], stats["ready"]) == (1, 1, 0)
    assert identity_holds(stats)


def test_an_idle_consumer_polls_cheaply_and_wakes_on_a_publish(table):
    """Publishes from this process (the commit wakes it) and from another process (a new
    log entry does); while idle, with two threads waiting in ``receive``, it checks the log
    at most every idle_check_interval."""
    with table.consumer("q", "c", idle_check_interval=50) as consumer:
        wait_until(lambda: consumer.idle, "the consumer found the queue empty")
        polls, leases, start = consumer.polls, consumer.leases, time.monotonic()
        # Idle on purpose, count what waiting costs: two receivers that find nothing must
        # not wake each other (nor the log checks) over and over.
        receivers = [
            threading.Thread(target=consumer.receive, args=(1,), kwargs={"wait_time": "1s"})
            for _ in "ab"
        ]
        for receiver in receivers:
            receiver.start()
        for receiver in receivers:
            receiver.join()
        elapsed = time.monotonic() - start
        assert consumer.polls - polls <= elapsed / 0.05 + 2
        assert consumer.leases - leases <= elapsed / 1.0 + 1  # idle_lease_interval: 1 s
        published = time.monotonic()
        table.publish("q", ["here"])
        (message,) = consumer.receive(1, wait_time=PATIENCE_WAIT)
        in_process = time.monotonic() - published
        message.ack()
        wait_until(lambda: consumer.idle, "the consumer found the queue empty again")
        script = (
            f"from spark_queue import QueueTable; QueueTable({table.path!r}).publish('q', ['x'])"
        )
        subprocess.run([sys.executable, "-c", script], check=True, timeout=PATIENCE)
        published = time.monotonic()
        (message,) = consumer.receive(1, wait_time=PATIENCE_WAIT)
        across = time.monotonic() - published
        message.ack()
    print(f"\nwake after a publish: {in_process * 1000:.0f} ms here, {across * 1000:.0f} ms across")
    assert in_process < 5 and across < 5  # loose: tens of ms on an idle machine
    stats = table.stats("q")
    assert stats["acked"] == 2 and identity_holds(stats)


def test_an_idle_consumer_wakes_for_its_own_queue_only(table):
    """Commits of this process to another queue of the table do not wake an idle consumer
    into a lease; a publish to its queue does."""
    table.declare("other")
    with table.consumer("q", "c", idle_lease_interval="1h") as consumer:
        wait_until(lambda: consumer.idle, "the consumer found the queue empty")
        leases = consumer.leases
        for n in range(5):
            table.publish("other", [f"x{n}"])
        table.publish("q", ["mine"])
        (message,) = consumer.receive(1, wait_time=PATIENCE_WAIT)
        assert message.body == b"mine"
        # The lease that got it, and perhaps the one that follows a delivery: none for
        # the other queue's commits (no idle lease is due in an hour).
        assert consumer.leases - leases <= 2


def test_close_releases_what_was_prefetched_and_not_handled(table):
    table.publish("q", [f"m{i}" for i in range(10)])
    consumer = table.consumer("q", "c", max_prefetch=10)
    first, second = receive_all(consumer, 2)
    first.ack()
    wait_until(lambda: consumer.held() >= 2, "more was prefetched")
    consumer.close()
    stats = table.stats("q")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (1, 0, 9)
    assert stats["killed"] == 0  # a release counts no cancel
    with pytest.raises(ClientClosedError):
        consumer.receive(1, wait_time="0s")
    with pytest.raises(ClientClosedError):
        second.ack()
    with table.consumer("q", "d") as other:
        assert [m.body for m in receive_all(other, 1)] == [b"m1"]


def test_publisher_batches_by_size_and_linger_and_flushes_on_close(table):
    publisher = table.publisher("q", linger="1h", max_batch=10)
    futures = [publisher.send(f"m{i}") for i in range(25)]
    seqs = [f.result(timeout=PATIENCE) for f in futures[:20]]  # two full batches went
    assert not any(f.done() for f in futures[20:])  # the rest lingers
    publisher.flush()
    seqs += [f.result(timeout=0) for f in futures[20:]]
    assert seqs == sorted(seqs) and publisher.batches == 3
    late = publisher.send("last", key="k", headers={"h": "v"})
    publisher.close()
    seqs.append(late.result(timeout=0))
    rows = table.peek("q", 100)
    assert rows["seq"].to_pylist() == seqs
    assert [bytes(b).decode() for b in rows["body"].to_pylist()] == [
        *(f"m{i}" for i in range(25)),
        "last",
    ]
    with pytest.raises(ClientClosedError):
        publisher.send("after close")


def test_a_cancelled_publisher_future_is_not_published_and_the_rest_are(table):
    publisher = table.publisher("q", linger="1h", max_batch=10)
    first, second, third = (publisher.send(body) for body in ("a", "b", "c"))
    assert second.cancel()
    publisher.close()  # flushes: the batch goes without "b"
    assert second.cancelled()
    seqs = [first.result(timeout=0), third.result(timeout=0)]
    rows = table.peek("q", 10)
    assert rows["body"].to_pylist() == [b"a", b"c"] and rows["seq"].to_pylist() == seqs


def test_publisher_futures_of_many_threads_and_refused_messages(table):
    table.declare("small", max_length=3, overflow="reject-publish")
    with table.publisher("small", linger="1h", max_batch=5) as publisher:
        futures = [publisher.send(f"s{i}") for i in range(5)]
        results = [f.result(timeout=PATIENCE) for f in futures]
    assert [r is None for r in results] == [False, False, False, True, True]
    assert table.stats("small")["rejected"] == 2

    threads, per_thread = 8, 40
    sent: dict[int, list] = {}
    with table.publisher("q", linger=2, max_batch=64) as publisher:

        def send(n: int) -> None:
            sent[n] = [publisher.send(f"t{n}-{i}") for i in range(per_thread)]

        workers = [threading.Thread(target=send, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    rows = table.peek("q", threads * per_thread)
    by_seq = dict(zip(rows["seq"].to_pylist(), rows["body"].to_pylist(), strict=True))
    for n, futures in sent.items():
        seqs = [f.result(timeout=0) for f in futures]
        assert seqs == sorted(seqs)  # one thread's messages in send order
        assert [bytes(by_seq[s]).decode() for s in seqs] == [f"t{n}-{i}" for i in range(per_thread)]
    assert table.stats("q")["added"] == threads * per_thread


def test_threads_and_a_consumer_on_the_s3_server(s3_table, s3_options):
    """On object storage: 16 threads publish one message a call through the group commit,
    while a consumer of another QueueTable of the same table handles them all."""
    table = QueueTable(s3_table, storage_options=s3_options)
    table.declare("q")
    threads, calls = 16, 5
    handled: list[str] = []
    with QueueTable(s3_table, storage_options=s3_options).consumer("q", "c") as consumer:
        workers = [
            threading.Thread(
                target=lambda n=n: [table.publish("q", [f"t{n}-{i}"]) for i in range(calls)]
            )
            for n in range(threads)
        ]
        for worker in workers:
            worker.start()
        while len(handled) < threads * calls:
            for message in consumer.receive(100, wait_time=PATIENCE_WAIT):
                handled.append(message.body.decode())
                message.ack()
        for worker in workers:
            worker.join()
    expected = [f"t{n}-{i}" for n in range(threads) for i in range(calls)]
    assert sorted(handled) == sorted(expected)
    stats = table.stats("q")
    assert (stats["acked"], stats["ready"], stats["leased"]) == (len(expected), 0, 0)
    assert identity_holds(stats)


@contextlib.contextmanager
def stoppable_store(label: str) -> Iterator[tuple[subprocess.Popen, str, dict[str, str]]]:
    """An S3 server of the test's own (SIGSTOP stops it answering, SIGCONT resumes it),
    a table URI in a bucket of it, and storage options that give up on it in seconds:
    delta-rs's own retries (10, over up to 3 minutes, by default) cut short, so that an
    outage reaches the consumer within the test."""
    server, endpoint = start_s3_server()
    try:
        options = server_options(endpoint)
        path = f"s3://{new_bucket(options, label)}/lake/queues"
        yield server, path, {**options, "timeout": "1s", "max_retries": "1", "retry_timeout": "2s"}
    finally:
        server.send_signal(signal.SIGCONT)
        server.kill()
        server.wait()


def wait_for_retries(consumer, count: int) -> None:
    """Each try waits out delta-rs's own retries: seconds to tens of seconds."""
    deadline = time.monotonic() + 10 * PATIENCE
    while consumer.retries < count:
        assert time.monotonic() < deadline, "the consumer did not try again"
        time.sleep(0.1)


def test_retry_options_in_any_case_bound_how_long_a_call_waits_for_the_store():
    """``MAX_RETRIES`` and ``RETRY_TIMEOUT`` reach delta-rs whatever their case: a call on a
    store that stopped answering fails after the one retry they allow, not after delta-rs's
    default of 10 over 3 minutes, and its error says so."""
    with stoppable_store("retries") as (server, path, options):
        shouted = {key.upper(): value for key, value in options.items()}
        QueueTable(path, storage_options=shouted).publish("q", ["a"])
        server.send_signal(signal.SIGSTOP)
        with pytest.raises(StorageError, match="after 1 retries"):
            QueueTable(path, storage_options=shouted).stats("q")


def test_a_consumer_waits_out_a_store_that_stops_answering():
    """The store stops answering under a consumer (its S3 server stopped with SIGSTOP):
    the background thread tries again with backoff instead of failing; once the store
    answers again (SIGCONT), it delivers what was published before and flushes the acks it
    kept."""
    with stoppable_store("outage") as (server, path, options):
        table = QueueTable(path, storage_options=options)
        table.declare("q")
        table.publish("q", ["a", "b", "c", "d"])
        # Leases that outlast the outage: the messages in hand stay this consumer's.
        with table.consumer(
            "q", "c", max_prefetch=2, idle_lease_interval=200, lease_period="1 hour"
        ) as consumer:
            first = receive_all(consumer, 2)
            server.send_signal(signal.SIGSTOP)
            for message in first:
                consumer.ack(message)  # kept by the consumer until the store answers
            wait_for_retries(consumer, 1)  # failed, kept, and waits to try again
            server.send_signal(signal.SIGCONT)
            later = receive_all(consumer, 2)
            for message in later:
                consumer.ack(message)
        assert [m.body for m in first + later] == [b"a", b"b", b"c", b"d"]
        stats = table.stats("q")
        assert (stats["acked"], stats["ready"], stats["leased"]) == (4, 0, 0)
        assert identity_holds(stats)


def delivery_counts(path: str, options: dict[str, str]) -> list[int]:
    """The delivery counts of the messages leased now, from the table's lease index."""
    leases = DeltaTable(path, storage_options=options).to_pyarrow_table(
        filters=[("record", "=", "lease")], columns=["delivery_count"]
    )
    return leases["delivery_count"].to_pylist()


def test_a_message_whose_lease_ran_out_in_hand_is_not_delivered_twice():
    """An outage longer than the lease period: the lease of the message in hand runs out
    (its extension cannot land), and the consumer's next lease takes it again. It is not
    handed to a second receiver of the same consumer, and its ack still counts."""
    with stoppable_store("re-leased") as (server, path, options):
        table = QueueTable(path, storage_options=options)
        table.publish("q", ["a"])
        with table.consumer(
            "q", "c", max_prefetch=2, idle_lease_interval=200, lease_period="2 seconds"
        ) as consumer:
            (message,) = receive_all(consumer, 1)
            server.send_signal(signal.SIGSTOP)
            wait_for_retries(consumer, 1)  # the outage outlasts the 2 s lease
            server.send_signal(signal.SIGCONT)
            wait_until(lambda: delivery_counts(path, options) == [2], "the message leased again")
            assert consumer.receive(1, wait_time="1s") == []
            consumer.ack(message)
        stats = table.stats("q")
        assert (stats["acked"], stats["ready"], stats["leased"]) == (1, 0, 0)
