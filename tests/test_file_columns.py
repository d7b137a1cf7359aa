"""A file written in one piece stores only its columns that hold a value in some row; every
reader (this package's, delta-rs, delta-spark) reads one it leaves out as nulls, so the
table reads as if the files held every column."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from spark_queue import QueueTable
from spark_queue.model.schema import FILE_SCHEMA
from spark_queue.storage import row_cache

# The columns of a publish of bodies alone that hold a value.
BODY_COLUMNS = {"queue", "seq", "body", "size", "priority", "enqueued_at", "delivery_count"}


def published(path: str) -> QueueTable:
    """A table whose queue ``q`` holds a publish of bodies alone, then one of messages
    that set ids, keys, headers and a delivery time (in one file each)."""
    table = QueueTable(path, broker="off")
    table.declare("q")
    table.publish("q", ["a", "b", "c"])
    soon = datetime.now(timezone.utc) - timedelta(seconds=1)
    table.publish(
        "q",
        [
            {"body": "d", "message_id": "id-d", "key": "k", "headers": {"h": "1"}},
            {"body": "e", "deliver_at": soon},
        ],
    )
    return table


def message_files(path: str) -> list[str]:
    return sorted(f for f in DeltaTable(path).file_uris() if "record=message" in f)


def test_a_publish_of_bodies_stores_only_the_columns_it_sets(tmp_path):
    path = str(tmp_path / "queues")
    published(path)
    stored = [set(pq.read_schema(f).names) for f in message_files(path)]
    assert sorted(stored, key=len) == [
        BODY_COLUMNS,
        BODY_COLUMNS | {"message_id", "key", "headers", "deliver_at"},
    ]


def test_a_table_of_such_files_reads_as_one_of_every_column(tmp_path):
    path = str(tmp_path / "queues")
    table = published(path)
    rows = DeltaTable(path).to_pyarrow_table(filters=[("record", "=", "message")]).sort_by("seq")
    assert rows.schema.names[1:] == FILE_SCHEMA.names  # the partition column first
    assert rows["body"].to_pylist() == [b"a", b"b", b"c", b"d", b"e"]
    assert rows["message_id"].to_pylist() == [None, None, None, "id-d", None]
    assert rows["headers"].to_pylist() == [None, None, None, [("h", "1")], None]
    assert rows["deliver_at"].null_count == 4
    # This package's readers, from the files (a fresh process: nothing held in memory).
    row_cache.clear()
    fresh = QueueTable(path, broker="off")
    assert fresh.peek("q")["body"].to_pylist() == [b"a", b"b", b"c", b"d", b"e"]
    leased = fresh.lease("q", "w", max_messages=5)
    assert leased["body"].to_pylist() == [b"a", b"b", b"c", b"d", b"e"]
    assert leased["message_id"].to_pylist() == [None, None, None, "id-d", None]
    assert leased["key"].to_pylist() == [None, None, None, "k", None]
    assert fresh.ack("q", leased["seq"], "w") == 5
    # A compaction reads them back whole, and writes what it read.
    table.publish("q", ["f"])
    row_cache.clear()
    assert QueueTable(path, broker="off").compact()
    assert QueueTable(path, broker="off").lease("q", "w")["body"].to_pylist() == [b"f"]


@pytest.mark.spark
def test_delta_spark_and_the_source_read_the_columns_a_file_leaves_out_as_nulls(spark, tmp_path):
    path = str(tmp_path / "queues")
    published(path)
    delta = (
        spark.read.format("delta").load(path).where("record = 'message'").orderBy("seq").collect()
    )
    assert [r.body for r in delta] == [b"a", b"b", b"c", b"d", b"e"]
    assert [r.message_id for r in delta] == [None, None, None, "id-d", None]
    assert [r.headers for r in delta] == [None, None, None, {"h": "1"}, None]
    assert [r.deliver_at is None for r in delta] == [True, True, True, True, False]
    browsed = spark.read.format("ringqueue").load(path).orderBy("seq").collect()
    assert [(r.body, r.message_id, r.key) for r in browsed] == [
        (b"a", None, None),
        (b"b", None, None),
        (b"c", None, None),
        (b"d", "id-d", "k"),
        (b"e", None, None),
    ]
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (
        spark.readStream.format("ringqueue")
        .option("queue", "q")
        .load(path)
        .select("seq", "body", "message_id", "key")
        .writeStream.format("delta")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    query.awaitTermination()
    assert query.exception() is None
    consumed = DeltaTable(str(out)).to_pyarrow_table().sort_by("seq")
    assert consumed["body"].to_pylist() == [b"a", b"b", b"c", b"d", b"e"]
    assert consumed["message_id"].to_pylist() == [None, None, None, "id-d", None]


def test_a_compaction_of_the_files_this_process_wrote_keeps_what_each_one_held(tmp_path):
    """Compaction takes the rows of the files this process wrote as it held them (each
    without its null columns, and not the same ones): the file it writes holds them all."""
    path = str(tmp_path / "queues")
    table = published(path)
    table.publish("q", ["f"])

    def rows() -> list[dict]:
        read = DeltaTable(path).to_pyarrow_table(filters=[("record", "=", "message")])
        return read.sort_by("seq").to_pylist()

    before = rows()
    assert len(message_files(path)) == 3
    assert table.compact()["rewritten"] == 3
    assert len(message_files(path)) == 1
    assert rows() == before
