"""Many producers on one queue: none fails because another committed first.

The shape of Artemis's ``RingQueueTest#testMultipleConcurrentProducers``: 4 writers, 3 batch
writes of 4 messages each, one queue with a ring of 5; in threads of one application and in
separate processes. Limits stay exact, every message is counted once, and each producer's
messages keep their order in ``seq``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from spark_queue import QueueTable
from tests.crash import DRIVERS, PRODUCER, crashed, make_input, restart, start
from tests.helpers import assert_identity, messages, write_batch

pytestmark = pytest.mark.spark
WRITERS, BATCHES, PER_BATCH, RING = 4, 3, 4, 5


def write_concurrently(spark, queue_path: str, **options: object) -> list[BaseException]:
    """WRITERS threads, each writing BATCHES batches to queue ``orders``; their errors."""
    errors: list[BaseException] = []
    go = threading.Barrier(WRITERS)
    # One write from this thread first, to a table of its own: the writers then race each
    # other's commits, not the session's first use of the Python data source (threads
    # starting Python data source queries on a fresh session at once failed a task now and
    # then with java.io.OptionalDataException; see test_groups).
    write_batch(messages(spark, ["warm-up"]), f"{queue_path}-warm-up", queue="warm-up")

    def writer(name: str) -> None:
        try:
            go.wait()
            for batch in range(BATCHES):
                rows = [f"{name}-b{batch}-m{i}" for i in range(PER_BATCH)]
                write_batch(messages(spark, rows), queue_path, queue="orders", **options)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(f"w{w}",)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def by_producer(spark, queue_path: str) -> dict[str, list[str]]:
    """Each producer's messages in ``seq`` order, read as a plain Delta table."""
    rows = (
        spark.read.format("delta")
        .load(queue_path)
        .where("record = 'message' and queue = 'orders'")
        .orderBy("seq")
        .collect()
    )
    found: dict[str, list[str]] = {}
    for row in rows:
        body = bytes(row.body).decode()
        found.setdefault(body.split("-")[0], []).append(body)
    return found


def in_write_order(name: str, kept: list[str]) -> bool:
    order = [f"{name}-b{b}-m{i}" for b in range(BATCHES) for i in range(PER_BATCH)]
    return kept == [body for body in order if body in set(kept)]


def test_threads_of_one_application_write_one_ring_queue(spark, queue_path):
    assert write_concurrently(spark, queue_path, ringSize=RING) == []
    stats = QueueTable(queue_path).stats("orders")
    assert stats["ready"] == RING
    assert stats["added"] == WRITERS * BATCHES * PER_BATCH
    assert stats["replaced"] == WRITERS * BATCHES * PER_BATCH - RING
    assert_identity(queue_path)


def test_threads_of_one_application_keep_each_producers_order(spark, queue_path):
    assert write_concurrently(spark, queue_path) == []
    found = by_producer(spark, queue_path)
    assert sorted(found) == [f"w{w}" for w in range(WRITERS)]
    for name, kept in found.items():
        assert len(kept) == BATCHES * PER_BATCH  # each message once
        assert in_write_order(name, kept)
    assert QueueTable(queue_path).stats("orders")["added"] == WRITERS * BATCHES * PER_BATCH
    assert_identity(queue_path)


def test_separate_processes_write_one_queue(spark, tmp_path):
    """Three producer processes write each batch to an unbounded queue and to a ring."""
    queue_path, go = tmp_path / "queues", tmp_path / "go"
    names = ["p0", "p1", "p2"]
    drivers = [
        start(DRIVERS / "produce_batches.py", queue_path, name, BATCHES, PER_BATCH, go, RING)
        for name in names
    ]
    deadline = time.monotonic() + 300
    while not all(Path(f"{go}.{n}").exists() for n in names) and time.monotonic() < deadline:
        assert all(d.poll() is None for d in drivers), "a producer died before writing"
        time.sleep(0.05)
    go.touch()  # all three write at once
    assert [d.wait(timeout=300) for d in drivers] == [0, 0, 0]
    table = QueueTable(str(queue_path))
    found = by_producer(spark, str(queue_path))
    assert sorted(found) == names
    for name, kept in found.items():
        assert len(kept) == BATCHES * PER_BATCH
        assert in_write_order(name, kept)
    ring = table.stats("ring")
    assert (ring["ready"], ring["added"]) == (RING, len(names) * BATCHES * PER_BATCH)
    assert table.stats("orders")["added"] == len(names) * BATCHES * PER_BATCH
    assert_identity(str(queue_path))


def test_two_streaming_queries_and_a_publisher_one_killed_each_message_once(spark, tmp_path):
    """Two streaming producers and a ``QueueTable.publish`` service on one queue; one query
    is SIGKILLed with a batch staged and restarted: every message once, each producer's in
    its order."""
    queue_path = tmp_path / "queues"
    streams = {}
    for name in ("s1", "s2"):
        folder = tmp_path / name
        expected = make_input(spark, folder, 4, 50, prefix=f"{name}-")
        streams[name] = (expected, (queue_path, folder / "flat", tmp_path / f"{name}-chk"))
    victim = start(PRODUCER, *streams["s1"][1], crash_at="sink.staged:2")  # batch 1
    steady = start(PRODUCER, *streams["s2"][1])
    table = QueueTable(str(queue_path))
    published = []
    for n in range(20):
        rows = [f"py-{n}-{i}" for i in range(10)]
        table.publish("orders", rows)
        published += rows
    assert crashed(victim)
    restart(spark, PRODUCER, *streams["s1"][1])  # in this session, beside the steady one
    assert steady.wait(timeout=300) == 0

    stored = table.peek("orders", 10_000)
    seqs, found = stored["seq"].to_pylist(), [bytes(b).decode() for b in stored["body"].to_pylist()]
    assert seqs == sorted(seqs)
    everything = streams["s1"][0] + streams["s2"][0] + published
    assert sorted(found) == sorted(everything)  # each message exactly once
    for prefix, expected in (("s1-", streams["s1"][0]), ("s2-", streams["s2"][0])):
        assert [b for b in found if b.startswith(prefix)] == expected  # in its order
    assert [b for b in found if b.startswith("py-")] == published
    assert table.stats("orders")["added"] == len(everything)
    assert_identity(str(queue_path))
