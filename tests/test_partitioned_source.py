"""The streaming source over a partitioned queue, called as Spark calls it (the driver-side
reader's methods, then ``read`` on each input partition), without Spark: every partition
read in each batch, offsets per partition, acknowledgements per partition table, a batch's
bounds shared, a raise of the count met by a running query, and a queue without partitions
keeping its offsets. The driver kills are tests/test_exactly_once.py's."""

from __future__ import annotations

import json
import os
import pickle
import signal
import threading
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from spark_queue import QueueTable
from spark_queue.model.partitions import key_partition, partition_of
from spark_queue.model.schema import BROWSE_ARROW_SCHEMA
from spark_queue.spark.options import parse_source_options
from spark_queue.spark.source import (
    MAX_THREADS,
    OFFSET_VERSION,
    DriverReadStreamReader,
    RingQueueStreamReader,
    in_parallel,
    read_leased,
    shares,
)

KEYS = [f"customer-{i % 13}" for i in range(40)]  # a key has 3 or 4 messages


def keyed(keys: list[str]) -> list[dict]:
    return [{"body": f"{i}:{key}".encode(), "key": key} for i, key in enumerate(keys)]


def reader_of(path: str, **options: str) -> RingQueueStreamReader:
    given = {"path": path, "queue": "q", "consumer": "pipeline", **options}
    return RingQueueStreamReader(parse_source_options(given))


def read_batch(reader: RingQueueStreamReader, start: dict, end: dict) -> pa.Table:
    """The batch from ``start`` to ``end``: ``partitions``, then ``read`` of each."""
    tasks = reader.partitions(start, end)
    return pa.Table.from_batches([b for t in tasks for b in reader.read(t)], BROWSE_ARROW_SCHEMA)


def run_batches(reader: RingQueueStreamReader, start: dict, limit: object) -> list[pa.Table]:
    """Batches as Spark runs them until one finds nothing: ``latestOffset``, then
    ``partitions`` and ``read`` of each input partition (in its pickled copy's stead)."""
    batches = []
    while (end := reader.latestOffset(start, limit)) != start:
        batches.append(read_batch(reader, start, end))
        start = end
    return batches


def test_a_partitioned_queue_is_read_from_every_partition_each_message_once(tmp_path):
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=4)
    table.publish("q", keyed(KEYS))
    reader = reader_of(path, maxMessagesPerTrigger="12")
    reader.getDefaultReadLimit()
    start = reader.initialOffset()
    assert sorted(start["partitions"]) == ["0", "1", "2", "3"]
    first = reader.latestOffset(start, ReadMaxRows(12))
    # A person reads it: each partition's offset is a table's, keyed by partition number.
    assert json.loads(json.dumps(first)) == first
    assert (first["version"], first["queue"], first["consumer"]) == (
        OFFSET_VERSION,
        "q",
        "pipeline",
    )
    parts = first["partitions"]
    assert sum(r[1] - r[0] + 1 for p in parts.values() for r in p.get("ranges", [])) == 12
    tasks = reader.partitions(start, first)
    locations = {task.location.uri for task in tasks}
    per_key = Counter(key_partition(key, 4) for key in KEYS)
    assert len(locations) == len(per_key)  # an input partition, at least, per partition
    batches = run_batches(reader, start, ReadMaxRows(12))
    assert all(batch.num_rows <= 12 for batch in batches)
    rows = pa.concat_tables(batches)
    assert Counter(rows["key"].to_pylist()) == Counter(KEYS)  # each message once
    seqs, keys = rows["seq"].to_pylist(), rows["key"].to_pylist()
    for key in set(KEYS):  # each key's messages in publish order
        mine = [seq for seq, of in zip(seqs, keys, strict=True) if of == key]
        assert mine == sorted(mine)
    owners = partition_of(np.array(seqs))
    assert all(owners[i] == key_partition(keys[i], 4) for i in range(len(keys)))
    stats = table.stats("q")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (len(KEYS), 0, 0)
    assert [s["acked"] for s in table.partition_stats("q")] == [per_key[k] for k in range(4)]


def test_a_bound_below_the_partition_count_leaves_no_partition_out(tmp_path):
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=4)
    table.publish("q", keyed(KEYS))
    reader = reader_of(path, maxMessagesPerTrigger="3")
    reader.getDefaultReadLimit()
    batches = run_batches(reader, reader.initialOffset(), ReadMaxRows(3))
    assert all(0 < batch.num_rows <= 3 for batch in batches)
    assert sorted(k for b in batches for k in b["key"].to_pylist()) == sorted(KEYS)
    assert shares(3, 4, 0) == [1, 1, 1, 0] and shares(3, 4, 1) == [0, 1, 1, 1]
    assert shares(10, 4, 3) == [3, 2, 2, 3] and shares(None, 2, 0) == [None, None]


def test_a_partition_the_queue_gains_while_a_query_runs_is_read(tmp_path):
    """A query started on a queue without partitions logs the root's offsets; once the
    queue has more, it reads every partition, its first offsets carried over as
    partition 0's."""
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.publish("q", ["a", "b"])
    reader = reader_of(path)
    reader.getDefaultReadLimit()
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadAllAvailable())
    assert "partitions" not in first and first["ranges"] == [[0, 1]]  # a table's, as ever
    table.alter("q", partitions=3)
    table.publish("q", keyed(KEYS[:12]))
    reader.layout.count("q", fresh=True)  # the count, read again (a second at most)
    batches = run_batches(reader, first, ReadAllAvailable())
    later = sorted(k for b in batches for k in b["key"].to_pylist())
    assert later == sorted(KEYS[:12])
    assert table.stats("q")["acked"] == 14


def test_available_now_stops_at_what_every_partition_held_when_it_started(tmp_path):
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=2)
    table.publish("q", keyed(KEYS[:10]))
    reader = reader_of(path, maxMessagesPerTrigger="4")
    reader.prepareForTriggerAvailableNow()
    reader.getDefaultReadLimit()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(4))
    table.publish("q", keyed(KEYS[10:20]))  # after the start: left for the next run
    batches = [read_batch(reader, start, end), *run_batches(reader, end, ReadMaxRows(4))]
    first = pa.concat_tables(batches)
    assert sorted(first["key"].to_pylist()) == sorted(KEYS[:10])
    assert table.stats("q")["ready"] == 10


def test_a_driver_read_of_a_partitioned_queue_replays_what_it_delivered(tmp_path):
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=3)
    table.publish("q", keyed(KEYS))
    options = parse_source_options(
        {"path": path, "queue": "q", "readmode": "driver", "maxmessagespertrigger": "9"}
    )
    reader = DriverReadStreamReader(options)
    start, seen = reader.initialOffset(), []
    while True:
        batches, end = reader.read(start)
        got = pa.Table.from_batches(list(batches), BROWSE_ARROW_SCHEMA)
        if end == start:
            break
        assert 0 < got.num_rows <= 9
        copy = pickle.loads(pickle.dumps(reader))  # a replay runs in an executor's copy
        replayed = pa.Table.from_batches(
            list(copy.readBetweenOffsets(start, end)), BROWSE_ARROW_SCHEMA
        )
        assert replayed.sort_by("seq").equals(got.sort_by("seq"))
        seen += got["key"].to_pylist()
        start = end
    assert sorted(seen) == sorted(KEYS)
    assert table.stats("q")["acked"] == len(KEYS)


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_restarted_query_replays_its_logged_batch_and_acknowledges_it_once(tmp_path, partitions):
    """A restart (a new reader) replays the batch Spark logged from its offset alone, then
    acknowledges it in each partition's table; what a lost ``latestOffset`` leased comes
    next, whole."""
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=partitions)
    table.publish("q", keyed(KEYS[:20]))
    first_run = reader_of(path, maxMessagesPerTrigger="6")
    first_run.getDefaultReadLimit()
    start = first_run.initialOffset()
    logged = first_run.latestOffset(start, ReadMaxRows(6))
    written = [r for t in first_run.partitions(start, logged) for r in read_leased(t)]
    first_run.latestOffset(logged, ReadMaxRows(6))  # leased, never logged: the query dies
    next_run = reader_of(path, maxMessagesPerTrigger="6")
    next_run.getDefaultReadLimit()
    replay = [
        r for t in next_run.partitions(next_run.initialOffset(), logged) for r in read_leased(t)
    ]
    assert (
        pa.concat_tables(replay)
        .sort_by("seq")["seq"]
        .equals(pa.concat_tables(written).sort_by("seq")["seq"])
    )
    rest = run_batches(next_run, logged, ReadMaxRows(6))
    every = [k for t in [*written, *rest] for k in t["key"].to_pylist()]
    assert sorted(every) == sorted(KEYS[:20])
    stats = table.stats("q")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (20, 0, 0)


@pytest.mark.parametrize("queue", ["q", None])
def test_a_browse_read_returns_the_whole_partitioned_queue(tmp_path, queue):
    """``spark.read.format("ringqueue")``'s reader (without Spark): every partition's
    messages, leased ones with their state; each seq names its partition."""
    from spark_queue.spark.datasource import BrowseReader
    from spark_queue.spark.options import parse_browse_options

    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q", partitions=3)
    table.publish("q", keyed(KEYS))
    table.publish("other", ["x"])
    leased = table.lease("q", "c", max_messages=5)["seq"].to_pylist()
    given = {"path": path} if queue is None else {"path": path, "queue": queue}
    reader = BrowseReader(parse_browse_options(given))
    rows = pa.Table.from_batches(
        [b for p in reader.partitions() for b in reader.read(p)], BROWSE_ARROW_SCHEMA
    )
    mine = rows.filter(pc.equal(rows["queue"], "q"))
    assert sorted(mine["key"].to_pylist()) == sorted(KEYS)
    states = dict(zip(mine["seq"].to_pylist(), mine["state"].to_pylist(), strict=True))
    assert sorted(s for s, state in states.items() if state == "leased") == sorted(leased)
    assert set(partition_of(np.array(list(states)))) == {0, 1, 2}
    assert rows.num_rows == len(KEYS) + (queue is None)


def test_the_partitions_work_runs_on_threads_every_call_shares():
    """Each call's 8 partitions wait for one another, so each call runs on 8 threads at
    once; three calls stay within the shared pool's threads rather than start 8 each."""

    def thread_name(_: int) -> str:
        together.wait(timeout=10)
        return threading.current_thread().name

    names: set[str] = set()
    for _ in range(3):
        together = threading.Barrier(8)
        names |= set(in_parallel(thread_name, range(8)).values())
    assert 8 <= len(names) <= MAX_THREADS, sorted(names)


def test_a_forked_child_runs_the_partitions_work_on_threads_of_its_own():
    """The shared pool's threads are the parent's: a child forked after they started runs
    its partitions' work on a pool of its own, where it would wait for them forever."""
    assert in_parallel(lambda k: k * 2, range(4)) == {0: 0, 1: 2, 2: 4, 3: 6}  # threads up
    child = os.fork()
    if child == 0:  # the child: killed by the alarm where its work never runs
        signal.alarm(20)
        os._exit(0 if in_parallel(lambda k: k * 3, range(4)) == {0: 0, 1: 3, 2: 6, 3: 9} else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
