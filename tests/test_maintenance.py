"""Maintenance on real queue tables: checkpoints, log cleanup, vacuum, and all of it running
while a producer stream and a consumer stream run."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.transaction import RemoveAction

from spark_queue import InvalidOptionError, QueueTable
from spark_queue.commit.group import group_of
from spark_queue.commit.maintenance import (
    AUTO_VACUUM_APP_ID,
    AUTO_VACUUM_KEY,
    AUTO_VACUUM_PERIOD_SECONDS,
    LOG_MIN_AGE_SECONDS,
    LOG_RETENTION_VERSIONS,
    LOG_RETENTION_VERSIONS_KEY,
    MIN_RETENTION_HOURS,
    auto_vacuum,
    auto_vacuum_hours,
    cleanup_log,
    compact,
    log_retention_versions,
)
from spark_queue.model.schema import TABLE_SCHEMA
from spark_queue.storage.files import MESSAGE, new_file
from spark_queue.storage.location import Location
from spark_queue.storage.store import QueueStore
from tests.helpers import (
    assert_identity,
    cut_log,
    messages,
    set_table_property,
    write_batch,
    write_stream,
)

DAY = 86400.0


def log_files(path: str) -> list[str]:
    return sorted(os.listdir(Path(path) / "_delta_log"))


def checkpoints(path: str) -> list[int]:
    return [int(n.split(".")[0]) for n in log_files(path) if ".checkpoint." in n]


def commits(table: QueueTable, count: int) -> None:
    """``count`` connector commits (alter rewrites the queue state every time)."""
    for i in range(count):
        table.alter("q", max_length=1000 + i)


# -- checkpoints ------------------------------------------------------------------------------


def test_connector_commits_checkpoint_at_the_tables_interval(queue_path):
    table = QueueTable(queue_path)
    table.declare("q")  # versions 0 (create) and 1
    assert DeltaTable(queue_path).metadata().configuration["delta.checkpointInterval"] == "50"
    commits(table, 48)
    assert checkpoints(queue_path) == []  # version 49
    commits(table, 1)
    assert checkpoints(queue_path) == [50]
    commits(table, 50)
    assert checkpoints(queue_path) == [50, 100]
    assert table.arguments("q").max_length == 1049  # the last of the 50


def test_a_failed_checkpoint_never_fails_the_commit(queue_path, caplog):
    table = QueueTable(queue_path)
    table.declare("q")
    commits(table, 47)  # version 48
    # A directory where checkpoint 50 must go: delta-rs cannot write it, the commit is fine.
    blocker = Path(queue_path) / "_delta_log" / f"{50:020d}.checkpoint.parquet"
    blocker.mkdir()
    with caplog.at_level(logging.WARNING, logger="spark_queue"):
        commits(table, 2)  # versions 49 and 50
    assert DeltaTable(queue_path).version() == 50
    assert table.arguments("q").max_length == 1001  # the second of 2
    assert "checkpoint of" in caplog.text and "the next interval tries again" in caplog.text
    blocker.rmdir()
    commits(table, 50)
    assert checkpoints(queue_path) == [100]


@pytest.mark.spark
def test_delta_spark_reads_a_table_whose_log_starts_at_a_delta_rs_checkpoint(spark, queue_path):
    write_batch(messages(spark, [f"m{i}" for i in range(5)]), queue_path, queue="q")
    table = QueueTable(queue_path)
    commits(table, 3)
    version = table.checkpoint()
    # Every commit before the checkpoint goes: readers must start from the checkpoint.
    removed = cut_log(queue_path)
    assert f"{0:020d}.json" in removed and f"{version:020d}.json" not in removed
    assert log_files(queue_path)[0] == f"{version:020d}.checkpoint.parquet"
    set_log_retention_versions(queue_path, "1000")  # a property Delta does not know
    delta = spark.read.format("delta").load(queue_path)
    assert delta.where("record = 'message'").count() == 5
    history = spark.sql(f"DESCRIBE HISTORY delta.`{queue_path}`").collect()
    assert max(r.version for r in history) == version + 1
    properties = spark.sql(f"SHOW TBLPROPERTIES delta.`{queue_path}`").collect()
    assert {r.key: r.value for r in properties}[LOG_RETENTION_VERSIONS_KEY] == "1000"
    browsed = spark.read.format("ringqueue").option("queue", "q").load(queue_path).collect()
    assert [bytes(r.body).decode() for r in browsed] == [f"m{i}" for i in range(5)]
    write_batch(messages(spark, ["after"]), queue_path, queue="q")
    assert table.stats("q")["ready"] == 6


def test_log_cleanup_keeps_every_version_inside_the_log_retention(queue_path):
    table = QueueTable(queue_path)
    table.declare("q")
    commits(table, 118)  # versions up to 119, checkpoints 50 and 100
    assert checkpoints(queue_path) == [50, 100]
    old = time.time() - 10 * DAY
    for name in log_files(queue_path):  # versions 0..60 written 10 days ago
        if name[:20].isdigit() and int(name[:20]) <= 60:
            os.utime(Path(queue_path) / "_delta_log" / name, (old, old))
    removed = cleanup_log(Location.of(queue_path), retention_hours=7 * 24)
    # Version 60 is the newest commit past the retention: it needs checkpoint 50 and what
    # follows it; delta-rs's cleanup_metadata would cut at checkpoint 100 instead.
    assert removed == [f"{v:020d}.json" for v in range(50)]
    assert DeltaTable(queue_path, version=60).version() == 60
    assert DeltaTable(queue_path, version=99).version() == 99
    assert cleanup_log(Location.of(queue_path), retention_hours=7 * 24) == []


def age_log(path: str, seconds: float) -> None:
    """Every log file of ``path`` as if written ``seconds`` ago."""
    then = time.time() - seconds
    for name in log_files(path):
        os.utime(Path(path) / "_delta_log" / name, (then, then))


def set_log_retention_versions(path: str, value: str) -> None:
    set_table_property(path, LOG_RETENTION_VERSIONS_KEY, value)


def test_the_log_keeps_at_most_the_tables_retention_in_versions(queue_path):
    table = QueueTable(queue_path)
    table.declare("q")  # versions 0 and 1
    assert log_retention_versions(DeltaTable(queue_path).metadata().configuration) == 500
    assert LOG_RETENTION_VERSIONS == 500
    set_log_retention_versions(queue_path, "60")  # version 2
    commits(table, 97)  # up to version 99: checkpoint 50, all of it young
    assert log_files(queue_path)[0] == f"{0:020d}.json"
    before = DeltaTable(queue_path, version=10)  # a reader left behind, its log since cut
    age_log(queue_path, 2 * LOG_MIN_AGE_SECONDS)
    commits(table, 1)  # version 100: its checkpoint cleans up, well inside 7 days
    # 100 - 60 = 40 is the newest version past the retention: it needs checkpoint 0 (the
    # table's start) and what follows, so nothing goes yet.
    assert log_files(queue_path)[0] == f"{0:020d}.json"
    commits(table, 49)  # version 149: young again, so checkpoint 150 cuts only aged ones
    age_log(queue_path, 2 * LOG_MIN_AGE_SECONDS)
    commits(table, 1)  # version 150: 90 is past the retention, and needs checkpoint 50
    assert checkpoints(queue_path) == [50, 100, 150]
    assert log_files(queue_path)[0] == f"{50:020d}.checkpoint.parquet"
    assert DeltaTable(queue_path, version=90).version() == 90
    with pytest.raises(DeltaError):  # gone: "no files in log segment"
        DeltaTable(queue_path, version=49)
    before.update_incremental()  # across the cut: from the checkpoint, not a gap
    fresh = DeltaTable(queue_path)
    assert before.version() == fresh.version() == 150
    assert sorted(before.file_uris()) == sorted(fresh.file_uris())
    assert table.arguments("q").max_length == 1000  # the last alter (commits(table, 1))
    table.publish("q", ["after"])
    assert table.stats("q")["ready"] == 1


def test_young_commits_are_never_cut_by_count(queue_path):
    table = QueueTable(queue_path)
    table.declare("q")
    commits(table, 60)  # checkpoint 50
    location = Location.of(queue_path)
    assert cleanup_log(location, retention_hours=7 * 24, max_versions=1) == []
    # The floor is the store's clock against the newest commit, not the cleaner's.
    later = time.time() + 10 * DAY
    assert cleanup_log(location, retention_hours=0, max_versions=1, now=later) == []
    # Older than the newest commit by the floor, they go, up to the newest checkpoint.
    age_log(queue_path, 2 * LOG_MIN_AGE_SECONDS)
    commits(table, 1)
    removed = cleanup_log(location, retention_hours=7 * 24, max_versions=1)
    assert removed == [f"{v:020d}.json" for v in range(50)]
    assert DeltaTable(queue_path).version() == 62


def test_a_bad_log_retention_in_versions_is_named_and_deletes_nothing(queue_path, caplog):
    for value in ("0", "-5", "many", "1.5", "\u0663", "9" * 20):
        with pytest.raises(InvalidOptionError) as error:
            log_retention_versions({LOG_RETENTION_VERSIONS_KEY: value})
        assert f"{LOG_RETENTION_VERSIONS_KEY}={value!r}" in str(error.value)
        assert "whole number of versions >= 1" in str(error.value)
    table = QueueTable(queue_path)
    table.declare("q")
    commits(table, 60)  # checkpoint 50
    set_log_retention_versions(queue_path, "none")
    age_log(queue_path, 10 * DAY)  # past the 7 days: a cleanup would cut at checkpoint 50
    files = log_files(queue_path)
    with caplog.at_level(logging.WARNING, logger="spark_queue"):
        commits(table, 40)  # crosses checkpoint 100, whose cleanup refuses the property
    assert DeltaTable(queue_path).version() == 102
    assert set(files) <= set(log_files(queue_path))  # nothing deleted
    assert f"{LOG_RETENTION_VERSIONS_KEY}='none'" in caplog.text
    assert "log cleanup of" in caplog.text and "(the checkpoint was written)" in caplog.text
    assert checkpoints(queue_path)[-1] == 100
    assert table.arguments("q").max_length == 1039
    set_log_retention_versions(queue_path, "1000")  # mended: the next checkpoint cleans up
    commits(table, 47)  # version 150
    assert log_files(queue_path)[0] == f"{50:020d}.checkpoint.parquet"


def removal_paths(checkpoint: Path) -> set[str]:
    removes = pq.read_table(checkpoint, columns=["remove"])["remove"].drop_null()
    return set(pc.struct_field(removes, "path").to_pylist())


def test_checkpoints_keep_the_removals_of_the_last_hour_only(queue_path):
    """A removal stays in every checkpoint (a tombstone) for the table's
    delta.deletedFileRetentionDuration: an hour on queue tables, so that a table that
    commits all day writes checkpoints of an hour's removals, not a day's."""
    table = QueueTable(queue_path)
    table.declare("q")
    configuration = DeltaTable(queue_path).metadata().configuration
    assert configuration["delta.deletedFileRetentionDuration"] == "interval 1 hours"
    now = int(time.time() * 1000)
    removals = {"part-removed-61-minutes-ago.parquet": 61, "part-removed-a-minute-ago.parquet": 1}
    DeltaTable(queue_path).create_write_transaction(
        [
            RemoveAction(
                f"record=message/{name}", True, now - minutes * 60_000, 100, {"record": "message"}
            )
            for name, minutes in removals.items()
        ],
        mode="append",
        schema=TABLE_SCHEMA,
        partition_by=["record"],
    )
    commits(table, 2)  # two state files replaced: removals of now
    version = table.checkpoint()
    kept = removal_paths(Path(queue_path) / "_delta_log" / f"{version:020d}.checkpoint.parquet")
    assert "record=message/part-removed-a-minute-ago.parquet" in kept
    assert "record=message/part-removed-61-minutes-ago.parquet" not in kept
    assert len([p for p in kept if p.startswith("record=queue/")]) == 2


# -- vacuum -----------------------------------------------------------------------------------


def data_files(path: str) -> set[str]:
    root = Path(path)
    return {
        str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts
    }


def keep_removed_files_for_a_day(path: str) -> None:
    """What a user who wants a day of time travel sets (new queue tables keep an hour)."""
    set_table_property(path, "delta.deletedFileRetentionDuration", "interval 1 days")


def test_vacuum_refuses_retentions_below_its_floors_and_deletes_nothing(queue_path):
    table = QueueTable(queue_path)
    table.declare("q")
    commits(table, 3)
    before = data_files(queue_path)
    refusals = (
        (0, False, "below 1 hour, which even force does not allow"),
        (0.0, True, "below 1 hour, which even force does not allow"),
        (MIN_RETENTION_HOURS / 2, True, "below 1 hour"),
        (MIN_RETENTION_HOURS / 2, False, "below 1 hour"),  # the table's own floor is an hour
        (-1, True, "must be a number >= 0, got -1"),
        (float("nan"), True, "must be a number >= 0"),
        ("168", False, "must be a number of hours, got '168'"),
        # Beyond what delta-rs takes: it raised OverflowError or panicked (PanicException).
        (1e300, True, "must be at most 8760000 hours (365000 days), got 1e+300"),
        (10**15, True, "must be at most 8760000 hours"),
        (2.0**64, False, "must be at most 8760000 hours"),
    )
    for hours, force, message in refusals:
        with pytest.raises(InvalidOptionError, match="retention_hours") as error:
            table.vacuum(hours, dry_run=False, force=force)
        assert message in str(error.value)
    # A table that keeps removed files for a day has that floor.
    keep_removed_files_for_a_day(queue_path)
    with pytest.raises(InvalidOptionError, match="retention_hours") as error:
        table.vacuum(23.5, dry_run=False)
    assert "below the safe floor of 24 hours" in str(error.value)
    assert data_files(queue_path) == before


def test_vacuum_deletes_what_no_version_needs_after_the_retention(queue_path):
    table = QueueTable(queue_path)
    table.declare("q")
    keep_removed_files_for_a_day(queue_path)  # a floor above the hard one, to go below
    commits(table, 3)  # each commit removed the previous state file: tombstones of now
    root = Path(queue_path)
    assert len(data_files(queue_path)) > len(DeltaTable(queue_path).file_uris())
    # What a producer killed between staging and committing leaves, long ago and just now.
    orphan, staged = leave_files(queue_path)
    assert table.vacuum(dry_run=True) == [str(orphan.relative_to(root))]
    assert orphan.exists()
    # Below the floor (forced) only removed files go: never what no commit mentions, which
    # may be a running producer's staged file.
    assert table.vacuum(1, False, force=True) == []  # the tombstones are younger than an hour
    assert orphan.exists()
    assert table.vacuum(dry_run=False) == [str(orphan.relative_to(root))]
    assert not orphan.exists() and staged.exists()
    assert table.stats("q")["ready"] == 0


# -- automatic vacuum -------------------------------------------------------------------------


def leave_files(path: str) -> tuple[Path, Path]:
    """What producers killed between staging and committing leave, named as spark-queue
    names its files: a file 30 days old, and one just written (which may still be a running
    producer's)."""
    old, young = Path(path) / new_file(MESSAGE), Path(path) / new_file(MESSAGE)
    old.parent.mkdir(exist_ok=True)
    old.write_bytes(b"never committed")
    young.write_bytes(b"a running producer's staged file")
    month_ago = time.time() - 30 * DAY
    os.utime(old, (month_ago, month_ago))
    return old, young


def set_auto_vacuum(path: str, value: str) -> None:
    set_table_property(path, AUTO_VACUUM_KEY, value)


def commit_and_settle(table: QueueTable) -> None:
    """One commit of this process's group, then its upkeep (the vacuum's first look)."""
    table.publish("q", ["m"])
    group_of(table.store.location).settle()


def test_no_automatic_vacuum_unless_the_table_asks(queue_path):
    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    old, young = leave_files(queue_path)
    commit_and_settle(table)
    assert old.exists() and young.exists()
    assert DeltaTable(queue_path).transaction_version(AUTO_VACUUM_APP_ID) is None


def test_the_automatic_vacuum_runs_once_an_hour_for_the_whole_table(queue_path):
    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    set_auto_vacuum(queue_path, "1")
    old, young = leave_files(queue_path)
    commit_and_settle(table)
    assert not old.exists() and young.exists()  # the floor keeps what may be staged now
    hour = int(time.time() // AUTO_VACUUM_PERIOD_SECONDS)
    claimed = DeltaTable(queue_path).transaction_version(AUTO_VACUUM_APP_ID)
    assert claimed in (hour, hour - 1)  # the hour may have turned since the claim
    # This hour is taken: another process (here, another store) does not vacuum again.
    other = QueueStore(Location.of(queue_path))
    again, _ = leave_files(queue_path)
    assert auto_vacuum(other, now=claimed * AUTO_VACUUM_PERIOD_SECONDS + 1) is None
    assert again.exists()
    # The next hour's claim is another process's, or this one's.
    next_hour = (claimed + 1) * AUTO_VACUUM_PERIOD_SECONDS + 1
    assert auto_vacuum(other, now=next_hour) == [str(again.relative_to(queue_path))]
    assert DeltaTable(queue_path).transaction_version(AUTO_VACUUM_APP_ID) == claimed + 1
    assert table.stats("q")["ready"] == 1  # the claims changed no queue


def test_a_commit_outside_a_commit_group_runs_the_automatic_vacuum_inline(queue_path):
    """An operator's commit (``transaction.run``: declare, alter, purge; a streaming query's
    commits go the same way) looks at the hour's vacuum itself, in the caller's thread."""
    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    set_auto_vacuum(queue_path, "1")
    old, young = leave_files(queue_path)
    table.declare("other")
    assert not old.exists() and young.exists()
    hour = int(time.time() // AUTO_VACUUM_PERIOD_SECONDS)
    assert DeltaTable(queue_path).transaction_version(AUTO_VACUUM_APP_ID) in (hour, hour - 1)


@pytest.mark.spark
def test_a_table_only_streaming_queries_write_is_vacuumed_by_them(spark, queue_path, tmp_path):
    """No process with a commit group: the sink's commit, in the short-lived Python worker
    Spark starts for it, claims the hour and vacuums."""
    QueueTable(queue_path, broker="off").declare("q")
    set_auto_vacuum(queue_path, "1")
    old, young = leave_files(queue_path)
    write_stream(spark, messages(spark, ["a", "b"]), queue_path, tmp_path, queue="q")
    assert not old.exists() and young.exists()
    hour = int(time.time() // AUTO_VACUUM_PERIOD_SECONDS)
    assert DeltaTable(queue_path).transaction_version(AUTO_VACUUM_APP_ID) in (hour, hour - 1)
    assert QueueTable(queue_path, broker="off").stats("q")["ready"] == 2


def test_a_bad_automatic_vacuum_property_is_named_and_deletes_nothing(queue_path, caplog):
    for value in ("soon", "0.5", "inf", "-1", "nan", "1e300", "1e15"):
        with pytest.raises(InvalidOptionError) as error:
            auto_vacuum_hours({AUTO_VACUUM_KEY: value})
        assert f"{AUTO_VACUUM_KEY}={value!r}" in str(error.value)
        assert "a number of hours >= 1" in str(error.value)
    floor = {"delta.deletedFileRetentionDuration": "interval 1 days"}
    with pytest.raises(InvalidOptionError, match=">= 24"):
        auto_vacuum_hours({**floor, AUTO_VACUUM_KEY: "12"})  # never forced below the floor
    assert auto_vacuum_hours({**floor, AUTO_VACUUM_KEY: "24"}) == 24
    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    set_auto_vacuum(queue_path, "soon")
    old, _ = leave_files(queue_path)
    with caplog.at_level(logging.WARNING, logger="spark_queue"):
        commit_and_settle(table)
    assert f"{AUTO_VACUUM_KEY}='soon'" in caplog.text
    assert old.exists()
    assert DeltaTable(queue_path).transaction_version(AUTO_VACUUM_APP_ID) is None
    set_auto_vacuum(queue_path, "1")  # mended: the next look vacuums
    assert auto_vacuum(QueueStore(Location.of(queue_path))) == [str(old.relative_to(queue_path))]


# -- everything at once -----------------------------------------------------------------------


def run_maintenance_under_load(
    spark, queue_path: str, tmp_path: Path, vacuum: Callable[[QueueTable], object], rounds: int
) -> tuple[list[str], set[str]]:
    """A producer stream and a consumer stream (processing-time triggers) on one queue while
    the test thread compacts, vacuums and checkpoints after every producer batch. Returns
    what the consumer delivered and what was produced."""
    table = QueueTable(queue_path)
    table.declare("jobs")  # unbounded: every message must reach the consumer
    source, out = tmp_path / "in", tmp_path / "out"
    source.mkdir()
    schema = "body string"
    producer = (
        spark.readStream.schema(schema)
        .parquet(str(source))
        .writeStream.format("ringqueue")
        .option("queue", "jobs")
        .option("checkpointLocation", str(tmp_path / "produce-checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start(queue_path)
    )
    consumer = (
        spark.readStream.format("ringqueue")
        .option("queue", "jobs")
        .option("consumer", "worker")
        .option("maxMessagesPerTrigger", 70)
        .load(queue_path)
        .select("seq", "body", "delivery_count")
        .writeStream.format("delta")
        .option("checkpointLocation", str(tmp_path / "consume-checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start(str(out))
    )
    produced: set[str] = set()
    try:
        for batch in range(rounds):
            bodies = [f"b{batch}-m{i}" for i in range(40)]
            spark.createDataFrame([(b,) for b in bodies], schema).coalesce(1).write.mode(
                "append"
            ).parquet(str(source))
            producer.processAllAvailable()
            produced.update(bodies)
            table.compact()
            vacuum(table)
            table.checkpoint()
            assert consumer.exception() is None and producer.exception() is None
        producer.stop()
        consumer.processAllAvailable()  # drains the queue: nothing new to lease
        table.compact()
        vacuum(table)
        consumer.processAllAvailable()
        assert consumer.exception() is None
    finally:
        producer.stop()
        consumer.stop()
    delivered = [r.body.decode() for r in spark.read.format("delta").load(str(out)).collect()]
    return delivered, produced


@pytest.mark.spark
def test_maintenance_never_breaks_a_running_producer_or_consumer(spark, queue_path, tmp_path):
    delivered, produced = run_maintenance_under_load(
        spark,
        queue_path,
        tmp_path,
        # the worst allowed
        lambda table: table.vacuum(MIN_RETENTION_HOURS, dry_run=False, force=True),
        rounds=12,
    )
    assert len(delivered) == len(set(delivered))  # nothing twice
    assert set(delivered) == produced  # nothing lost
    stats = QueueTable(queue_path).stats("jobs")
    assert stats["added"] == len(produced) == 480
    assert stats["acked"] + stats["leased"] == len(produced) and stats["ready"] == 0
    assert_identity(queue_path)
    assert checkpoints(queue_path)  # explicit and automatic checkpoints ran


def test_compaction_takes_the_rows_of_files_this_process_wrote_without_reading_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The small message files of this process's publishes are compacted from the rows it
    wrote them from (:func:`~spark_queue.storage.row_cache.held_rows`): none is read back,
    and the compacted file holds every row once, in seq order."""
    table = QueueTable(str(tmp_path / "t"), broker="off")
    group_of(table.store.location)._upkeeping = True  # no compaction behind the test's back
    for call in range(4):
        table.publish("q", [f"m{call}-{n}" for n in range(3)])
    store = table.store

    def unread(*_: object, **__: object) -> None:
        raise AssertionError("a file this process wrote was read back")

    monkeypatch.setattr(store, "read_rows", unread)
    assert compact(store, store.snapshot()) == {"dropped": 0, "rewritten": 4, "written": 1}
    monkeypatch.undo()
    (compacted,) = store.snapshot().message_files("q")["path"].to_pylist()
    rows = store.read_rows(compacted, ["seq", "body"])
    assert rows["seq"].to_pylist() == list(range(12))
    assert rows["body"].to_pylist() == [f"m{c}-{n}".encode() for c in range(4) for n in range(3)]
