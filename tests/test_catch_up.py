"""Clients left behind by log cleanup catch up (docs/MAINTENANCE.md, "Log cleanup").

A long-lived client (a ``QueueTable``, its consumer and publisher, a broker, a streaming
source) keeps a Delta table open between calls. Here another process (a real one) commits
past the log's bound while it is idle, and log cleanup deletes the log entries of the
version it knew and of the next ones: its next call must see the present and work.

The tables keep a short log (``delta.checkpointInterval`` 10,
``spark_queue.logRetentionVersions`` 5), so a few dozen commits do what 750 do at the
defaults. In place of waiting for the log's files to age past ``LOG_MIN_AGE_SECONDS``, the
other process backdates them before its last commits (local disk), or runs the cleanup as
if its clock were past the floor (S3, where a file's age cannot be set). Either way only
entries written ``TRUSTED_SECONDS`` or more before the cleanup go: a client that knew the
table later than that takes a missing next entry for one not written yet, as the floor makes
true
(``storage.table_view``), and this process's clients may be at work meanwhile (a consumer's
long poll reads the log, and leases, as the other process commits).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from spark_queue import CommitUnknownError, QueueTable, StorageError
from spark_queue.commit.maintenance import LOG_RETENTION_VERSIONS_KEY, cleanup_log
from spark_queue.storage.location import Location
from spark_queue.storage.table_view import TRUSTED_SECONDS
from tests.brokers import BrokerProcess
from tests.helpers import consume, cut_log, output_columns, set_table_property

# The other process: ``count`` one-message publishes straight to the table (no broker),
# then, with every log file written ``TRUSTED_SECONDS`` ago made older than cleanup's
# floor, publishes on to the next checkpoint, whose log cleanup deletes everything before
# the newest checkpoint it may.
ELSEWHERE = """
import os, sys, time
from pathlib import Path
from spark_queue import QueueTable
from spark_queue.commit.maintenance import LOG_MIN_AGE_SECONDS, checkpoint_interval
from spark_queue.storage.table_view import TRUSTED_SECONDS

path, queue, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
table = QueueTable(path, broker="off")
for i in range(count):
    table.publish(queue, [f"elsewhere {i}"])
time.sleep(TRUSTED_SECONDS)
now = time.time()
then = now - 2 * LOG_MIN_AGE_SECONDS
for entry in (Path(path) / "_delta_log").iterdir():
    if entry.stat().st_mtime <= now - TRUSTED_SECONDS:
        os.utime(entry, (then, then))
interval = checkpoint_interval(table.store.open().metadata().configuration)
while True:
    table.publish(queue, ["elsewhere last"])
    if table.store.open().version() % interval == 0:
        break
print(table.store.open().version())
"""


def short_log(path: str) -> None:
    """A checkpoint every 10 versions, and cleanup down to 5 versions back."""
    set_table_property(path, "delta.checkpointInterval", "10")
    set_table_property(path, LOG_RETENTION_VERSIONS_KEY, "5")


def publish_elsewhere(path: str, queue: str, count: int) -> int:
    """``count`` publishes and more (:data:`ELSEWHERE`) in another process, past log
    cleanup; returns the table's version after."""
    done = subprocess.run(
        [sys.executable, "-c", ELSEWHERE, path, queue, str(count)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def log_entry(path: str, version: int) -> Path:
    return Path(path) / "_delta_log" / f"{version:020d}.json"


def published_elsewhere(path: str, queue: str) -> int:
    """How many messages a fresh table says ``queue`` was given."""
    return QueueTable(path, broker="off").stats(queue)["added"]


def test_a_table_and_its_clients_left_behind_by_log_cleanup_see_the_present(queue_path):
    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    short_log(queue_path)
    assert table.publish("q", ["here 0"]).seqs == [0]
    known = table.store.open().version()
    consumer = table.consumer("q", "w", idle_lease_interval="1h", idle_check_interval=50)
    publisher = table.publisher("q")
    try:
        (first,) = consumer.receive(1, wait_time="30s")
        assert first.body == b"here 0"
        first.ack()
        consumer.flush()
        assert consumer.receive(1, wait_time="0s") == []  # idle: it watches the log from here
        known = max(known, table.store.open().version())

        latest = publish_elsewhere(queue_path, "q", 30)
        # The other process's cleanup deleted the entries of the version this process
        # knew and of the next one: a probe of the next entry alone finds none.
        assert not log_entry(queue_path, known).exists()
        assert not log_entry(queue_path, known + 1).exists()
        assert latest > known + 30

        added = published_elsewhere(queue_path, "q")
        assert added > 31
        assert table.stats("q")["added"] == added  # the present, not the version it knew

        # The consumer's long poll (its lease interval an hour) wakes for them.
        received = consumer.receive(added - 1, wait_time="60s")
        while len(received) < added - 1:
            more = consumer.receive(added - 1 - len(received), wait_time="60s")
            assert more, f"the consumer stopped at {len(received)} of {added - 1}"
            received += more
        assert [m.body for m in received[:2]] == [b"elsewhere 0", b"elsewhere 1"]
        assert len({m.seq for m in received}) == added - 1
        for message in received:
            message.ack()
        consumer.close()  # it would lease what comes next

        assert publisher.send("sent here").result(timeout=60) == added
        assert table.publish("q", ["here 1"]).seqs == [added + 1]
        leased = table.lease("q", "x", max_messages=10)
        assert leased["body"].to_pylist() == [b"sent here", b"here 1"]
    finally:
        publisher.close()
        consumer.close()
    stats = table.stats("q")
    assert (stats["added"], stats["acked"], stats["leased"]) == (added + 2, added, 2)


def test_a_commit_planned_before_cleanup_passed_its_version_is_planned_again(queue_path):
    """Other writers commit past cleanup between a transaction's plan and its commit: the
    commit is refused, nothing is written at the old version, and it is planned again on
    the present."""
    from spark_queue.commit.transaction import run
    from spark_queue.storage.store import QueueStore

    QueueTable(queue_path, broker="off").declare("q")
    short_log(queue_path)
    store = QueueStore(queue_path)
    planned_on = []

    def alter(transaction):
        planned_on.append(transaction.snapshot.version)
        if len(planned_on) == 1:
            planned_on.append(publish_elsewhere(queue_path, "q", 25))
            assert not log_entry(queue_path, planned_on[0]).exists()
        transaction.declare("q", {"max_length": 77}, alter=True)
        transaction.commit(operation="ALTER q")

    run(store, alter, create=False)
    known, latest, again = planned_on
    assert again == latest
    assert DeltaTable(queue_path).version() == latest + 1
    assert not log_entry(queue_path, known + 1).exists()  # nothing written at the old one
    assert QueueTable(queue_path, broker="off").arguments("q").max_length == 77


def test_a_long_poll_left_behind_by_cleanup_wakes(queue_path):
    """A consumer's long poll watches the log from the version its last lease saw; when
    cleanup has deleted that entry and the next, it wakes (and its lease looks)."""
    from spark_queue.clients.polling import LogWatch

    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    short_log(queue_path)
    known = table.store.open().version()
    watch = LogWatch(table, "q", known)
    assert not watch.moved()
    publish_elsewhere(queue_path, "q", 25)
    assert not log_entry(queue_path, known + 1).exists()
    assert watch.moved()


def test_a_broker_left_idle_while_others_commit_past_cleanup_serves_the_present(tmp_path):
    path = str(tmp_path / "queues")
    direct = QueueTable(path, broker="off")
    direct.declare("q")
    short_log(path)
    with BrokerProcess(path, log_path=tmp_path / "broker.log") as broker:
        table = QueueTable(path)  # broker="auto": finds it in the table
        assert table.router.address() == broker.address
        assert table.publish("q", ["through the broker"]).seqs == [0]
        assert table.lease("q", "w", max_messages=1)["body"].to_pylist() == [b"through the broker"]
        served = broker.status()["served"]

        publish_elsewhere(path, "q", 30)
        added = published_elsewhere(path, "q")

        assert table.publish("q", ["after"]).seqs == [added]
        leased = table.lease("q", "w", max_messages=2)
        assert leased["body"].to_pylist() == [b"elsewhere 0", b"elsewhere 1"]
        assert broker.status()["served"] == served + 2  # both went through the broker
        assert broker.stop() == 0
    stats = direct.stats("q")
    assert (stats["added"], stats["leased"]) == (added + 1, 3)


def test_a_running_stream_source_left_behind_by_cleanup_delivers_each_message_once(queue_path):
    """The streaming source's driver side (``latestOffset``, ``partitions``), as Spark's
    source worker keeps it between triggers, after cleanup passed the version it knew."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from spark_queue.spark.options import SourceOptions
    from spark_queue.spark.source import RingQueueStreamReader, read_leased

    table = QueueTable(queue_path, broker="off")
    table.publish("q", [f"before {i}" for i in range(3)])
    short_log(queue_path)
    reader = RingQueueStreamReader(SourceOptions(path=queue_path, queue="q"))

    def batch(start: dict) -> tuple[dict, list[bytes]]:
        end = reader.latestOffset(start, ReadAllAvailable())
        if end == start:
            return end, []
        rows = [part for task in reader.partitions(start, end) for part in read_leased(task)]
        return end, [(r["seq"], r["body"]) for part in rows for r in part.to_pylist()]

    offset, first = batch(reader.initialOffset())
    assert first == [
        (0, b"before 0"),
        (1, b"before 1"),
        (2, b"before 2"),
    ]
    known = reader.root.open().version()

    publish_elsewhere(queue_path, "q", 30)  # between two triggers
    assert not log_entry(queue_path, known).exists()
    added = published_elsewhere(queue_path, "q")

    offset, second = batch(offset)  # acknowledges the first batch, leases the rest
    offset, third = batch(offset)
    assert third == []
    # Each message once: every seq after the first batch's, and no other.
    assert sorted(seq for seq, _ in second) == list(range(3, added))
    assert [body for _, body in second[:2]] == [b"elsewhere 0", b"elsewhere 1"]
    stats = QueueTable(queue_path, broker="off").stats("q")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (added, 0, 0)


# A client in another process: each line it reads is a call ("publish BODY", "lease",
# "stats"), answered once made with its result as JSON (an error as its message).
CLIENT = """
import json, sys
from spark_queue import QueueTable, QueueError

table = QueueTable(sys.argv[1], broker="off")
for line in sys.stdin:
    call, *body = line.split()
    try:
        if call == "publish":
            answer = table.publish("q", body).seqs
        elif call == "lease":
            answer = table.lease("q", "w", max_messages=1)["seq"].to_pylist()
        else:
            answer = table.stats("q")
    except QueueError as error:
        answer = str(error)
    print(json.dumps(answer), flush=True)
"""


class Client:
    """:data:`CLIENT`, started on the table at ``path``."""

    def __init__(self, path: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", CLIENT, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, line: str) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0


def commit_past_a_checkpoint(table: QueueTable) -> None:
    """Two commits, then a checkpoint of the latest version."""
    for i in range(2):
        table.alter("q", max_length=1000 + i)
    table.checkpoint()


def test_a_client_that_committed_a_moment_before_cleanup_passed_it_commits_on_the_present(
    queue_path,
):
    """A client of another process commits; this one commits past a checkpoint, and log
    cleanup deletes the entries after the client's version as soon as the client no longer
    trusts its view (``cut_log``). The client's next commit lands in the present, not in
    the log's past."""
    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    client = Client(queue_path)
    try:
        assert client.call("publish first") == [0]
        known = table.store.open().version()
        commit_past_a_checkpoint(table)
        cut_log(queue_path)
        assert not log_entry(queue_path, known + 1).exists()
        assert client.call("publish second") == [1]
    finally:
        client.close()
    assert table.peek("q")["body"].to_pylist() == [b"first", b"second"]
    assert table.stats("q")["added"] == 2


def test_a_view_off_the_logs_line_is_loaded_afresh_not_moved_on(queue_path):
    """Where log cleanup runs faster than its floor (here at once, as a store whose clock
    jumped would have it), a client that knew the table a moment before commits into the
    log's past, where no reader looks: one request cannot tell. Its next read meets an entry
    planned on another version (it leaves the client's state files in place) and loads the
    table afresh: it never joins two commits' queue states."""
    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    table.publish("q", ["a"])
    client = Client(queue_path)
    try:
        assert client.call("lease") == [0]
        commit_past_a_checkpoint(table)
        cleanup_log(Location.of(queue_path), retention_hours=0, min_age_seconds=0)
        assert client.call("publish b") == [1]  # in the log's past
        seen = client.call("stats")
    finally:
        client.close()
    assert isinstance(seen, dict), seen
    stats = table.stats("q")
    assert (seen["added"], seen["ready"], seen["leased"]) == (stats["added"], 0, 1) == (1, 0, 1)


def test_log_cleanup_stops_at_the_first_entry_it_cannot_delete(queue_path):
    """The entries log cleanup deletes are always all those below some version (what
    makes a reader's probe of the log sound): it deletes oldest first, and where one
    cannot go, nothing after it goes."""
    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    set_table_property(queue_path, "delta.checkpointInterval", "10")
    for i in range(10):
        table.alter("q", max_length=1000 + i)  # checkpoint 10
    blocker = Path(queue_path) / "_delta_log" / f"{4:020d}.crc"  # a folder: not deletable
    blocker.mkdir()
    removed = cleanup_log(Location.of(queue_path), retention_hours=0, min_age_seconds=0)
    assert removed == [f"{v:020d}.json" for v in range(4)]
    assert log_entry(queue_path, 4).exists() and log_entry(queue_path, 9).exists()
    blocker.rmdir()
    removed = cleanup_log(Location.of(queue_path), retention_hours=0, min_age_seconds=0)
    assert removed == [f"{v:020d}.json" for v in range(4, 10)]
    assert DeltaTable(queue_path).version() == 12


def test_a_stream_query_restarted_after_cleanup_passed_its_stop_delivers_each_once(
    spark, queue_path, tmp_path
):
    """A ``format("ringqueue")`` query stopped while others committed past log cleanup,
    then restarted from its checkpoint: its offsets are lease ids in the queue's state, not
    log versions, so every message is delivered once."""
    table = QueueTable(queue_path, broker="off")
    table.publish("q", [f"before {i}" for i in range(3)])
    short_log(queue_path)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    consume(spark, queue_path, out, checkpoint)
    known = DeltaTable(queue_path).version()
    publish_elsewhere(queue_path, "q", 30)
    assert not log_entry(queue_path, known).exists()
    added = published_elsewhere(queue_path, "q")
    consume(spark, queue_path, out, checkpoint)
    seqs, counts = output_columns(out, "seq", "delivery_count")
    assert sorted(seqs) == list(range(added))
    assert set(counts) == {1}


def test_a_running_stream_sink_left_behind_by_cleanup_enqueues_each_batch_once(
    spark, queue_path, tmp_path
):
    """A running ``writeStream.format("ringqueue")`` query, idle between two micro-batches
    while others committed past log cleanup, commits its next batch on the present: the
    Python workers Spark reuses keep no table from the batch before."""
    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    short_log(queue_path)
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "1.json").write_text('{"body": "first"}\n')
    query = (
        spark.readStream.schema("body string")
        .json(str(landing))
        .writeStream.format("ringqueue")
        .option("queue", "q")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start(queue_path)
    )
    try:
        query.processAllAvailable()
        known = DeltaTable(queue_path).version()
        publish_elsewhere(queue_path, "q", 30)
        assert not log_entry(queue_path, known).exists()
        (landing / "2.json").write_text('{"body": "second"}\n')
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    bodies = [b.decode() for b in table.peek("q", 100)["body"].to_pylist()]
    assert bodies.count("first") == bodies.count("second") == 1
    assert table.stats("q")["added"] == published_elsewhere(queue_path, "q") == len(bodies)


# On S3 a log file's age cannot be set: the other process runs the cleanup as if the
# commits were past the floor, after a checkpoint, once they are ``TRUSTED_SECONDS`` old.
ELSEWHERE_S3 = """
import json, sys, time
from spark_queue import QueueTable
from spark_queue.commit.maintenance import cleanup_log
from spark_queue.storage.table_view import TRUSTED_SECONDS

uri, options, count = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
table = QueueTable(uri, storage_options=options, broker="off")
for i in range(count):
    table.publish("q", [f"elsewhere {i}"])
table.checkpoint()
time.sleep(TRUSTED_SECONDS)
print(len(cleanup_log(table.store.location, 7 * 24, max_versions=5, min_age_seconds=0)))
"""


def test_a_table_on_s3_left_behind_by_log_cleanup_sees_the_present(s3_table, s3_options):
    table = QueueTable(s3_table, storage_options=s3_options, broker="off")
    table.declare("q")
    DeltaTable(s3_table, storage_options=s3_options).alter.set_table_properties(
        {"delta.checkpointInterval": "10", LOG_RETENTION_VERSIONS_KEY: "5"},
        raise_if_not_exists=False,
    )
    assert table.publish("q", ["here"]).seqs == [0]
    known = table.store.open().version()
    done = subprocess.run(
        [sys.executable, "-c", ELSEWHERE_S3, s3_table, json.dumps(s3_options), "30"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > 0
    store = table.store
    entries = store.fs.get_file_info([store.log_entry(known), store.log_entry(known + 1)])
    assert all(entry.type == pafs.FileType.NotFound for entry in entries)
    fresh = QueueTable(s3_table, storage_options=s3_options, broker="off")
    assert table.stats("q")["added"] == fresh.stats("q")["added"] == 31
    assert table.publish("q", ["after"]).seqs == [31]
    leased = table.lease("q", "w", max_messages=2)
    assert leased["body"].to_pylist() == [b"here", b"elsewhere 0"]


def test_a_commit_held_up_while_cleanup_passed_its_version_says_its_fate_is_unknown(queue_path):
    """A log entry created more than ``TRUSTED_SECONDS`` after it was asked for, while
    others committed past log cleanup: it landed where cleanup had deleted the version
    before it, and so much time passed that whether the log moved on from it cannot be
    told. The publish fails saying so; the entry, in the log's past, counts for nothing,
    and the same producer and sequence again publish once."""
    from spark_queue.commit.group import group_of

    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    short_log(queue_path)
    group = group_of(table.store.location)
    entries = group.store.entries
    create = entries.create
    held: list[int] = []

    def held_up(version: int, data: bytes) -> bool:  # others commit while it is on its way
        if not held:
            held.append(version)
            group._host_lock.__exit__()  # the other process's rounds need not wait for it
            publish_elsewhere(queue_path, "q", 25)
            assert not log_entry(queue_path, version - 1).exists()
        return create(version, data)

    entries.create = held_up  # type: ignore[method-assign]
    with pytest.raises(StorageError, match="whether it counts is unknown"):
        table.publish("q", ["here"], producer="p", sequence=1)
    assert log_entry(queue_path, held[0]).exists()  # in the log's past
    added = published_elsewhere(queue_path, "q")
    assert table.publish("q", ["here"], producer="p", sequence=1).seqs == [added]
    assert table.publish("q", ["here"], producer="p", sequence=1).duplicate
    assert table.stats("q")["added"] == added + 1


def test_a_commit_whose_check_goes_unanswered_keeps_its_entry_and_its_files(queue_path):
    """A publish whose log entry landed more than ``TRUSTED_SECONDS`` after it was asked
    for, and whose look at the entry before it gets no answer: it may have landed, so its
    caller hears ``CommitUnknownError`` and nothing it wrote is deleted. It did land: the
    same producer and sequence again is a duplicate, and its message is there."""
    from spark_queue.commit.group import group_of

    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    entries = group_of(table.store.location).store.entries
    create, exists = entries.create, entries.exists

    def late(version: int, data: bytes) -> bool:
        time.sleep(TRUSTED_SECONDS)
        return create(version, data)

    def unanswered(version: int) -> bool:
        raise OSError("the store did not answer")

    entries.create, entries.exists = late, unanswered  # type: ignore[method-assign]
    try:
        with pytest.raises(CommitUnknownError):
            table.publish("q", ["kept"], producer="p", sequence=1)
    finally:
        entries.create, entries.exists = create, exists  # type: ignore[method-assign]
    assert table.publish("q", ["kept"], producer="p", sequence=1).duplicate
    assert table.peek("q")["body"].to_pylist() == [b"kept"]
