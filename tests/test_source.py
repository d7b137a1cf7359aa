"""The streaming source: readStream.format("ringqueue") with leases and acknowledgement."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from spark_queue import QueueTable, UnsupportedFormatError
from spark_queue.model.queue_arguments import READ_MODES
from spark_queue.storage.store import QueueStore
from tests.clock import now_micros, wait_past
from tests.helpers import assert_identity, consume, delivered, messages, write_batch

# Both ways a batch is read: by executor tasks (the default) and by the driver's source worker
# as it leases it (readMode=driver, PySpark's simple stream reader).
EACH_READ_MODE = pytest.mark.parametrize("read_mode", READ_MODES)


def fail_once_then_rerun(
    spark, queue_path: str, checkpoint: Path, record, **options: object
) -> None:
    """Consume in batches of 2 into ``record(batch)``; the sink fails once, on batch 1, and
    the query is run again from its checkpoint."""
    failed: list[bool] = []

    def handle(batch, batch_id):
        record(batch)
        if batch_id == 1 and not failed:
            failed.append(True)
            raise RuntimeError("the sink failed")

    def run_query():
        reader = spark.readStream.format("ringqueue").option("queue", "q")
        for key, value in {"maxMessagesPerTrigger": 2, **options}.items():
            reader = reader.option(key, str(value))
        return (
            reader.load(queue_path)
            .writeStream.foreachBatch(handle)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    query = run_query()
    with pytest.raises(Exception, match="the sink failed"):
        query.awaitTermination()
    run_query().awaitTermination()


@pytest.mark.connect
@EACH_READ_MODE
def test_consume_in_bounded_batches_and_ack_after_commit(spark, queue_path, tmp_path, read_mode):
    write_batch(messages(spark, [f"m{i}" for i in range(10)]), queue_path, queue="q")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    bounds = {"maxMessagesPerTrigger": 4, "readMode": read_mode}
    consume(spark, queue_path, out, checkpoint, **bounds)
    assert delivered(out) == sorted(f"m{i}" for i in range(10))
    assert len(list((checkpoint / "commits").iterdir())) >= 3  # 4 + 4 + 2
    stats = QueueTable(queue_path).stats("q")
    # AvailableNow's closing latestOffset call starts at the last committed batch: all acked.
    assert (stats["acked"], stats["leased"], stats["ready"]) == (10, 0, 0)
    write_batch(messages(spark, ["late"]), queue_path, queue="q")
    consume(spark, queue_path, out, checkpoint, **bounds)
    assert QueueTable(queue_path).stats("q")["acked"] == 11
    assert delivered(out).count("late") == 1
    assert_identity(queue_path)


@EACH_READ_MODE
def test_two_consumers_compete_each_message_once(spark, queue_path, tmp_path, read_mode):
    bodies = [f"m{i}" for i in range(24)]  # ~4 batches each: every batch costs ~2 s here
    write_batch(messages(spark, bodies), queue_path, queue="q")
    queries = []
    for name in ("a", "b"):
        query = (
            spark.readStream.format("ringqueue")
            .option("queue", "q")
            .option("consumer", name)
            .option("maxMessagesPerTrigger", 3)
            .option("readMode", read_mode)
            .load(queue_path)
            .select("seq", "body")
            .writeStream.format("delta")
            .option("checkpointLocation", str(tmp_path / f"checkpoint-{name}"))
            .trigger(availableNow=True)
            .start(str(tmp_path / f"out-{name}"))
        )
        queries.append(query)
    for query in queries:
        query.awaitTermination()
        assert query.exception() is None
    got_a = delivered(tmp_path / "out-a")
    got_b = delivered(tmp_path / "out-b")
    assert sorted(got_a + got_b) == sorted(bodies)  # union is the input, no duplicates
    assert_identity(queue_path)


@EACH_READ_MODE
def test_at_most_once_removes_on_delivery(spark, queue_path, tmp_path, read_mode):
    write_batch(messages(spark, list("abc")), queue_path, queue="q")
    out = tmp_path / "out"
    consume(spark, queue_path, out, tmp_path / "chk", semantics="at-most-once", readMode=read_mode)
    assert delivered(out) == ["a", "b", "c"]
    stats = QueueTable(queue_path).stats("q")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (3, 0, 0)
    assert_identity(queue_path)


@EACH_READ_MODE
def test_failed_batch_replays_the_same_messages(spark, queue_path, tmp_path, read_mode):
    """With ``readMode=driver`` the replay runs ``readBetweenOffsets`` in an executor task:
    the restarted query's source worker has not read the logged batch."""
    write_batch(messages(spark, [f"m{i}" for i in range(6)]), queue_path, queue="q")
    seen: list[list[int]] = []
    fail_once_then_rerun(
        spark,
        queue_path,
        tmp_path / "chk",
        lambda batch: seen.append(sorted(r.seq for r in batch.collect())),
        readMode=read_mode,
    )
    first, failed, replayed, last = seen  # batch 1 failed, then ran again on restart
    assert replayed == failed  # the same messages, from the offset log
    assert sorted(first + replayed + last) == sorted(set(first + replayed + last))
    assert len(first + replayed + last) == 6
    assert_identity(queue_path)


def test_lease_period_lets_another_consumer_take_over(spark, queue_path, tmp_path):
    """The query's ``leasePeriod`` bounds its leases; once they run out another consumer
    takes the messages, delivered again. The period is minutes (the failed query may take
    seconds to stop on a loaded machine, and the leases must be held at the check); the
    test then makes them run out now (``extend``: ``period`` from now)."""
    write_batch(messages(spark, ["x", "y"]), queue_path, queue="q")

    def crash(batch, batch_id):
        raise RuntimeError("consumer died")

    started = now_micros()
    query = (
        spark.readStream.format("ringqueue")
        .option("queue", "q")
        .option("consumer", "a")
        .option("leasePeriod", "10 minutes")
        .load(queue_path)
        .writeStream.foreachBatch(crash)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="consumer died"):
        query.awaitTermination()
    stopped = now_micros()
    table = QueueTable(queue_path)
    assert table.stats("q")["leased"] == 2
    leases = QueueStore(queue_path).snapshot().states["q"].leases
    assert all(started + 600_000_000 <= u <= stopped + 600_000_000 for u in leases.until)
    assert table.lease("q", "b").num_rows == 0  # still held by the dead consumer
    assert table.extend("q", leases.seq.tolist(), "a", 1) == 2
    wait_past(int(QueueStore(queue_path).snapshot().states["q"].leases.until.max()))
    taken = table.lease("q", "b", max_messages=10)
    assert taken["delivery_count"].to_pylist() == [2, 2]
    assert_identity(queue_path)


def test_bad_source_options(spark, queue_path):
    QueueTable(queue_path).declare("q")
    for option, value in [
        ("semantics", "exactly-twice"),
        ("ackMode", "sometimes"),
        ("readMode", "turbo"),
        ("maxMessagesPerTrigger", "0"),
        ("leasePeriod", "soon"),
        ("colour", "red"),
    ]:
        reader = spark.readStream.format("ringqueue").option("queue", "q").option(option, value)
        with pytest.raises(Exception, match=f"(?i){option}"):  # at load(), before any query
            reader.load(queue_path)


def test_manual_ack_mode_leaves_leases_to_the_api(spark, queue_path, tmp_path):
    write_batch(messages(spark, list("ab")), queue_path, queue="q")
    acked: list[int] = []

    def handle(batch, batch_id):
        seqs = [r.seq for r in batch.select("seq").collect()]
        acked.append(QueueTable(queue_path).ack("q", seqs))

    query = (
        spark.readStream.format("ringqueue")
        .option("queue", "q")
        .option("ackMode", "manual")
        .load(queue_path)
        .writeStream.foreachBatch(handle)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert acked == [2]
    stats = QueueTable(queue_path).stats("q")
    assert (stats["acked"], stats["leased"]) == (2, 0)


def test_at_most_once_loses_a_failed_batch_once_its_files_are_gone(spark, queue_path, tmp_path):
    import os

    from spark_queue.storage.store import QueueStore

    for pair in (["a", "b"], ["c", "d"], ["e", "f"]):  # one file each
        write_batch(messages(spark, pair), queue_path, queue="q")
    batches: list[list[str]] = []
    table = QueueTable(queue_path)

    def files() -> set[str]:
        snapshot = QueueStore(queue_path).snapshot(with_states=False)
        return set(snapshot.message_files("q")["path"].to_pylist())

    def record(batch):
        batches.append([bytes(r.body).decode() for r in batch.collect()])
        if len(batches) == 2:  # batch 1 is about to fail: by now it was removed at lease,
            assert table.stats("q")["acked"] == 4
            before = files()
            assert table.compact()["dropped"] == 2  # compaction drops its files,
            for path in before - files():  # and a vacuum deletes them
                os.remove(os.path.join(queue_path, path))

    fail_once_then_rerun(spark, queue_path, tmp_path / "chk", record, semantics="at-most-once")
    delivered_once = batches[0] + batches[2] + batches[3]  # batch 1 failed, then replayed
    assert batches[1] == ["c", "d"] and batches[2] == []  # the replay found nothing: lost
    assert sorted(delivered_once) == ["a", "b", "e", "f"]
    stats = table.stats("q")
    assert (stats["acked"], stats["ready"], stats["leased"]) == (6, 0, 0)
    assert_identity(queue_path)


def test_a_large_batch_is_read_by_several_tasks_each_message_once(spark, queue_path):
    """A batch of more than TASK_BYTES is split at the offset's ``splits``: every leased
    message is read by exactly one task, with its delivery count."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from spark_queue.spark.options import SourceOptions
    from spark_queue.spark.source import RingQueueStreamReader, read_leased

    write_batch(messages(spark, [f"m{i}" for i in range(1000)]), queue_path, queue="q")
    table = QueueTable(queue_path)
    returned = table.lease("q", "other", max_messages=10)["seq"].to_pylist()
    table.cancel("q", returned)  # delivered before: these come back with delivery_count 2
    reader = RingQueueStreamReader(SourceOptions(path=queue_path, queue="q"))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert "splits" not in end  # 1000 small bodies: one task
    (task,) = reader.partitions(start, end)
    assert all(task.whole)  # every file is wholly leased: read without a filter
    whole = pa.concat_tables(read_leased(task))
    end["splits"] = [end["ranges"][0][0] + 300, end["ranges"][0][0] + 700]
    tasks = reader.partitions(start, end)
    assert len(tasks) == 3
    assert not all(w for task in tasks for w in task.whole)  # cut files are filtered
    rows = [part for task in tasks for part in read_leased(task)]
    assert pa.concat_tables(rows).sort_by("seq").equals(whole.sort_by("seq"))
    seqs = [s for part in rows for s in part["seq"].to_pylist()]
    assert len(seqs) == len(set(seqs)) == 1000
    counts = {
        s: c
        for part in rows
        for s, c in zip(part["seq"].to_pylist(), part["delivery_count"].to_pylist(), strict=True)
    }
    assert sorted(s for s, c in counts.items() if c == 2) == sorted(returned)
    assert set(counts.values()) == {1, 2}


def test_a_file_leased_whole_is_streamed_in_bounded_tables(spark, queue_path):
    """A file read whole comes in tables of about ARROW_BATCH_BYTES, not as one table of
    the file, and they hold the rows the filtered read of the same file returns."""
    from dataclasses import replace

    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from spark_queue.spark.options import SourceOptions
    from spark_queue.spark.source import ARROW_BATCH_BYTES, RingQueueStreamReader, read_leased

    bodies = [f"{i:05d}" + "x" * 20_000 for i in range(1000)]  # 20 MB in one file
    write_batch(messages(spark, bodies), queue_path, queue="q")
    reader = RingQueueStreamReader(SourceOptions(path=queue_path, queue="q"))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    end.pop("splits", None)  # one task: the file is read once, whole
    (task,) = reader.partitions(start, end)
    assert task.whole == [True]
    streamed = list(read_leased(task))
    assert len(streamed) >= 2
    assert all(part.nbytes < 2 * ARROW_BATCH_BYTES for part in streamed)
    filtered = pa.concat_tables(read_leased(replace(task, whole=[False])))
    assert pa.concat_tables(streamed).equals(filtered)
    assert filtered["body"].to_pylist() == [b.encode() for b in bodies]


def test_an_at_most_once_batch_reads_the_files_it_was_leased_from(spark, queue_path):
    """At-most-once removes messages when it leases them, so a compaction (a producer's)
    committed before Spark plans the batch's reads drops their rows from the files: the batch
    reads the files of the version it was leased at. Once those are vacuumed, a replay reads
    the latest version and finds nothing, as an at-most-once replay may."""
    import os

    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from spark_queue.commit.maintenance import compact
    from spark_queue.spark.options import SourceOptions
    from spark_queue.spark.source import RingQueueStreamReader, read_leased
    from spark_queue.storage.store import QueueStore

    for part in range(3):
        write_batch(messages(spark, [f"m{part}-{i}" for i in range(5)]), queue_path, queue="q")
    options = SourceOptions(path=queue_path, queue="q", semantics="at-most-once")
    reader = RingQueueStreamReader(options)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    store = QueueStore(queue_path)
    leased_at = store.snapshot()
    assert end["table_version"] == leased_at.version
    assert compact(store, leased_at)["dropped"] == 3  # every message file's rows are removed
    rows = [part for task in reader.partitions(start, end) for part in read_leased(task)]
    bodies = sorted(b.decode() for part in rows for b in part["body"].to_pylist())
    assert bodies == sorted(f"m{p}-{i}" for p in range(3) for i in range(5))
    for path in leased_at.message_files("q")["path"].to_pylist():  # as a vacuum would
        os.remove(os.path.join(queue_path, path))
    assert RingQueueStreamReader(options).partitions(start, end) == []
    assert_identity(queue_path)


def test_a_lease_spark_never_logged_is_the_next_batch_not_lost(spark, queue_path):
    """The query dies after ``latestOffset`` leased a batch and before Spark logged its
    offset: the next run delivers that batch first, and no later ack takes it unread."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from spark_queue.spark.options import SourceOptions
    from spark_queue.spark.source import RingQueueStreamReader

    write_batch(messages(spark, [f"m{i}" for i in range(10)]), queue_path, queue="q")
    options = SourceOptions(path=queue_path, queue="q", max_messages=4)

    def seqs(offset: dict) -> list[int]:
        return [s for first, last in offset["ranges"] for s in range(first, last + 1)]

    first_run = RingQueueStreamReader(options)
    first_run.getDefaultReadLimit()
    start = first_run.initialOffset()
    logged = first_run.latestOffset(start, ReadMaxRows(4))  # batch 0: Spark logs and runs it
    lost = first_run.latestOffset(logged, ReadMaxRows(4))  # leased; the query dies here
    table = QueueTable(queue_path)
    assert table.stats("q")["leased"] == 4  # batch 0 is acked: Spark committed it

    next_run = RingQueueStreamReader(options)  # restarted from the checkpoint: at ``logged``
    next_run.getDefaultReadLimit()
    delivered = [seqs(logged)]
    offset = logged
    while (following := next_run.latestOffset(offset, ReadMaxRows(4))) != offset:
        delivered.append(seqs(following))
        offset = following
    assert delivered[1] == seqs(lost)  # the unlogged lease comes first, whole
    everything = [s for batch in delivered for s in batch]
    assert len(everything) == len(set(everything)) == 10
    stats = table.stats("q")
    assert (stats["acked"], stats["leased"], stats["ready"]) == (10, 0, 0)
    assert_identity(queue_path)


def test_a_driver_read_batch_without_bounds_takes_at_most_driver_batch_bytes(
    queue_path, monkeypatch
):
    """``readMode=driver`` holds a batch whole in the driver's source worker, so with no
    ``maxMessagesPerTrigger``/``maxBytesPerTrigger`` it bounds a batch by bodies; a replay
    (``readBetweenOffsets``) reads exactly what ``read`` delivered. Called as PySpark's
    simple-reader wrapper calls it, without Spark (the bound is patched small)."""
    from spark_queue.model.schema import BROWSE_ARROW_SCHEMA
    from spark_queue.spark import source
    from spark_queue.spark.options import parse_source_options

    monkeypatch.setattr(source, "DRIVER_BATCH_BYTES", 2500)
    QueueTable(queue_path).publish("q", [bytes([i]) * 1000 for i in range(5)])
    options = parse_source_options({"path": queue_path, "queue": "q", "readmode": "driver"})
    reader = source.DriverReadStreamReader(options)
    start, seen = reader.initialOffset(), []
    while True:
        batches, end = reader.read(start)
        table = pa.Table.from_batches(list(batches), BROWSE_ARROW_SCHEMA)
        if end == start:
            assert table.num_rows == 0
            break
        assert 0 < sum(len(b) for b in table["body"].to_pylist()) <= 2500
        replayed = pa.Table.from_batches(
            list(reader.readBetweenOffsets(start, end)), BROWSE_ARROW_SCHEMA
        )
        assert replayed.equals(table)
        seen += table["body"].to_pylist()
        start = end
    assert seen == [bytes([i]) * 1000 for i in range(5)]  # in order, each once
    # Each read acknowledged the batch before it; the last, finding nothing, the last batch.
    assert QueueTable(queue_path).stats("q")["acked"] == 5


@pytest.mark.parametrize("version", [1, 3])
def test_a_checkpoint_offset_of_another_format_version_is_refused_by_name(queue_path, version):
    """An offset from a checkpoint written in another format version (version 1 held
    ``redelivered`` as a count per seq) is refused, where Spark hands it back after a
    restart (``latestOffset``'s start, the end of a batch it replays), in one line naming
    the queue, the version found and the version read; nothing is leased or acknowledged.
    Called as Spark calls the reader, without Spark."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from spark_queue.spark.options import parse_source_options
    from spark_queue.spark.source import OFFSET_VERSION, DriverReadStreamReader

    table = QueueTable(queue_path, broker="off")
    table.publish("q", ["a", "b"])
    options = parse_source_options({"path": queue_path, "queue": "q", "readmode": "driver"})
    reader = DriverReadStreamReader(options)
    start = reader.initialOffset()
    _, logged = reader.read(start)  # batch 0: leases both
    assert logged["version"] == OFFSET_VERSION and logged["ranges"] == [[0, 1]]
    old = {**logged, "version": version, "redelivered": {"0": 2}}
    before = table.store.open().version()
    for call in (
        lambda: reader.leases.latestOffset(old, ReadAllAvailable()),
        lambda: reader.read(old),
        lambda: reader.leases.partitions(start, old),
        lambda: list(reader.readBetweenOffsets(start, old)),
    ):
        with pytest.raises(UnsupportedFormatError) as refused:
            call()
        assert str(refused.value) == (
            f"the checkpoint's offset of queue 'q' has format version {version}; this "
            f"spark-queue reads version {OFFSET_VERSION} only: start the query with a new "
            "checkpointLocation"
        )
    assert QueueStore(queue_path).open().version() == before
    assert table.stats("q")["leased"] == 2
