"""``QueueTable.publish``: enqueueing from plain Python, alone and beside other producers."""

from __future__ import annotations

import multiprocessing
import threading
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_queue import (
    ArgumentMismatchError,
    InvalidInputError,
    InvalidOptionError,
    QueueTable,
)
from spark_queue.commit.enqueue import Reservation, commit_enqueue, reserve
from spark_queue.model.messages import Bodies, normalise
from spark_queue.rules import identity_holds
from spark_queue.storage.commit_log import CommitOperation
from spark_queue.storage.files import MESSAGE, MessageFileWriter, StagedQueueFile, write_file
from spark_queue.storage.store import now_micros

WRITERS, BATCHES, PER_BATCH, RING = 4, 3, 4, 5  # Artemis testMultipleConcurrentProducers


@pytest.fixture
def table(tmp_path) -> QueueTable:
    return QueueTable(str(tmp_path / "queues"))


def bodies(table: QueueTable, queue: str) -> list[str]:
    return [bytes(b).decode() for b in table.peek(queue, 1000)["body"].to_pylist()]


@pytest.mark.parametrize(
    "rows",
    [
        pa.table({"body": ["a", "b"]}),
        pa.RecordBatch.from_pydict({"body": [b"a", b"b"]}),
        pd.DataFrame({"body": ["a", "b"]}),
        [{"body": "a"}, {"body": b"b"}],
        [b"a", b"b"],
        ["a", "b"],
    ],
    ids=["arrow-table", "record-batch", "pandas", "dicts", "bytes", "str"],
)
def test_every_kind_of_rows_is_enqueued_in_order(table, rows):
    result = table.publish("orders", rows)
    assert (result.seqs, result.rejected, result.duplicate) == ([0, 1], 0, False)
    assert bodies(table, "orders") == ["a", "b"]
    assert table.stats("orders")["added"] == 2


def test_bodies_given_as_lists_and_as_arrow_are_shaped_together_in_order():
    """A round's publishes of lists of bodies (kept as bytes, no Arrow array per call)
    and of Arrow bodies are shaped together: each body in order, with its own publish's
    time."""
    parts = [
        Bodies.of_values([b"a", b"b"], 1),
        Bodies.of(pa.table({"body": ["c"]}), 2),
        Bodies.of_values(("d", "\u00e9"), 3),
        Bodies.of_values([b"f"], 4),
    ]
    assert all(part is not None for part in parts)
    rows = Bodies.concat(parts).normalised("q")
    assert rows["body"].to_pylist() == [b"a", b"b", b"c", b"d", "\u00e9".encode(), b"f"]
    assert rows["enqueued_at"].cast(pa.int64()).to_pylist() == [1, 1, 2, 3, 3, 4]
    assert rows["seq"].to_pylist() == list(range(6))
    assert rows["size"].to_pylist() == [1, 1, 1, 1, 2, 1]


@pytest.mark.parametrize(
    "values",
    [[], ["a", b"b"], ["\ud800"], [bytearray(b"x")], [{"body": "a"}], pa.table({"body": ["a"]})],
    ids=["empty", "mixed", "lone-surrogate", "bytearray", "dicts", "arrow"],
)
def test_only_lists_of_bytes_or_of_utf8_str_are_kept_as_values(values):
    assert Bodies.of_values(values, 1) is None  # publish reads them as before


def test_the_sinks_columns_are_stored(table):
    due = datetime(2020, 1, 1, tzinfo=timezone.utc)
    table.publish(
        "orders",
        [
            {"body": "low", "message_id": "m1", "key": "k", "headers": {"h": "v"}},
            {"body": "high", "priority": 9, "expires_at": datetime(2999, 1, 1)},
            {"body": "due", "deliver_at": due},
        ],
    )
    rows = table.peek("orders", 10).to_pylist()
    assert [bytes(r["body"]).decode() for r in rows] == ["high", "low", "due"]  # priority first
    low = rows[1]
    assert (low["message_id"], low["key"], dict(low["headers"])) == ("m1", "k", {"h": "v"})
    assert rows[0]["expires_at"] == datetime(2999, 1, 1, tzinfo=timezone.utc)  # naive: UTC


def test_the_result_counts_what_the_commit_did(table):
    table.declare("dlq")
    table.publish("ring", ["a", "b", "c"], ring_size=2)
    evicting = table.publish("ring", ["d"], ring_size=2)
    assert (evicting.seqs, evicting.evicted, evicting.dead_lettered) == ([3], 1, 0)
    table.publish("capped", ["a"], max_length=1, dead_letter_queue="dlq")
    dropping = table.publish("capped", ["b"], max_length=1, dead_letter_queue="dlq")
    assert (dropping.evicted, dropping.dead_lettered) == (1, 1)
    table.publish("full", ["a"], max_length=1, overflow="reject-publish")
    refused = table.publish("full", ["b", "c"], max_length=1, overflow="reject-publish")
    assert (refused.seqs, refused.rejected) == ([], 2)
    for name in table.queues():
        assert identity_holds(table.stats(name))


def test_the_same_producer_and_sequence_twice_enqueues_once(table):
    first = table.publish("orders", ["a"], producer="billing", sequence=7)
    again = table.publish("orders", ["a"], producer="billing", sequence=7)
    assert (first.duplicate, again.duplicate, again.seqs) == (False, True, [])
    assert table.publish("orders", ["b"], producer="billing", sequence=8).seqs == [1]
    assert table.publish("orders", ["a"], producer="other", sequence=7).seqs == [2]
    assert bodies(table, "orders") == ["a", "b", "a"]


BAD_INPUT = {  # publish arguments besides the queue "orders"; the error; what it must name
    "no-body": ({"rows": [{"key": "k"}]}, InvalidInputError, "'body'"),
    "null-body": ({"rows": [{"body": None}]}, InvalidInputError, "'body'"),
    "unknown-column": ({"rows": [{"body": "x", "colour": 1}]}, InvalidInputError, "'colour'"),
    "wrong-type": ({"rows": [{"body": "x", "priority": "hi"}]}, InvalidInputError, "'priority'"),
    "wrong-body-type": ({"rows": pa.table({"body": [1]})}, InvalidInputError, "'body'"),
    "a-row-without-body": (
        {"rows": [{"body": "x"}, {"key": "k"}]},
        InvalidInputError,
        "^row 1 has no 'body'",
    ),
    "a-row-with-a-number-body": (
        {"rows": [{"body": "x"}, {"body": 5}]},
        InvalidInputError,
        r"^column 'body' takes bytes or UTF-8 strings; row 1 has 5 \(int\)$",
    ),
    "a-lone-surrogate-body": (
        {"rows": ["x", "\ud800"]},
        InvalidInputError,
        r"^column 'body' takes bytes or UTF-8 strings; row 1 has '\\ud800' \(str\)$",
    ),
    "a-lone-surrogate-key": (
        {"rows": [{"body": "x", "key": "\udc80"}]},
        InvalidInputError,
        "column 'key' takes UTF-8 strings",
    ),
    "queue-column": (
        {"rows": pa.table({"body": ["x"], "queue": ["q"]})},
        InvalidInputError,
        "'queue'",
    ),
    "not-rows": ({"rows": 42}, InvalidInputError, "rows"),
    "queue-name": ({"queue": "no such queue"}, InvalidOptionError, "queue"),
    "queue-name-with-a-newline": ({"queue": "orders\n"}, InvalidOptionError, "queue"),
    "queue-name-of-dots": ({"queue": ".."}, InvalidOptionError, "queue"),
    "sequence-missing": ({"producer": "p"}, InvalidOptionError, "sequence"),
    "negative-sequence": ({"producer": "p", "sequence": -1}, InvalidOptionError, "sequence"),
    "on-reject": ({"on_reject": "retry"}, InvalidOptionError, "on_reject"),
    "argument": ({"max_length": -5}, InvalidOptionError, "max_length"),
    "lower-sequence": ({"producer": "p", "sequence": 2}, InvalidInputError, "sequence 2"),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_refused_naming_it_and_nothing_is_committed(table, case):
    given, error, named = BAD_INPUT[case]
    table.publish("orders", ["first"], producer="p", sequence=3)
    version = table.store.open().version()
    with pytest.raises(error, match=named):
        table.publish(**{"queue": "orders", "rows": ["x"], **given})
    assert table.store.open().version() == version
    assert bodies(table, "orders") == ["first"]
    committed = table.store.snapshot().files["path"].to_pylist()
    on_disk = (Path(table.store.base) / "record=message").glob("*.parquet")
    assert {f"record=message/{p.name}" for p in on_disk} <= set(committed)  # no file left


@pytest.mark.parametrize("path", ["", "   ", None, 7])
def test_a_blank_path_is_refused_and_the_current_directory_untouched(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidOptionError, match="path must be the queue table's location"):
        QueueTable(path).publish("orders", ["x"])
    assert list(tmp_path.iterdir()) == []


def test_a_pathlib_path_names_the_same_table_as_its_string(tmp_path):
    QueueTable(tmp_path / "queues").publish("orders", ["x"])
    assert bodies(QueueTable(str(tmp_path / "queues")), "orders") == ["x"]


def test_a_message_file_that_cannot_be_stored_fails_the_publish_and_commits_nothing(table):
    # The message file is stored in the background while the round is planned: the commit
    # must wait for it and fail with it, never name a file that is not there.
    table.declare("orders")
    version = table.store.open().version()
    blocker = Path(table.store.base) / "record=message"
    blocker.write_text("a file where the message files' folder goes")
    with pytest.raises(OSError):
        table.publish("orders", ["lost"])
    assert table.store.open().version() == version
    assert table.stats("orders")["added"] == 0
    blocker.unlink()
    assert table.publish("orders", ["kept"]).seqs == [0]
    assert bodies(table, "orders") == ["kept"]
    assert [p.name for p in blocker.iterdir()] == [
        f.rsplit("/", 1)[1]
        for f in table.store.snapshot().files["path"].to_pylist()
        if f.startswith("record=message/")
    ]


def test_threads_publish_to_one_ring_queue_and_none_fails(table):
    table.declare("orders", ring_size=RING)
    errors: list[BaseException] = []
    go = threading.Barrier(WRITERS)

    def writer(w: int) -> None:
        try:
            go.wait()
            for b in range(BATCHES):
                table.publish("orders", [f"w{w}-b{b}-m{i}" for i in range(PER_BATCH)])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = table.stats("orders")
    assert (stats["ready"], stats["added"]) == (RING, WRITERS * BATCHES * PER_BATCH)
    assert identity_holds(stats)


def publish_from_process(path: str, name: str, go) -> list[list[int]]:
    table = QueueTable(path)
    go.wait()
    return [
        table.publish("orders", [f"{name}-b{b}-m{i}" for i in range(PER_BATCH)]).seqs
        for b in range(BATCHES)
    ]


def test_processes_publish_to_one_queue_in_commit_order(table):
    table.declare("orders")
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(3) as pool:
        go = manager.Barrier(3)
        pending = [
            pool.apply_async(publish_from_process, (table.path, f"p{n}", go)) for n in range(3)
        ]
        seqs = {f"p{n}": p.get(timeout=120) for n, p in enumerate(pending)}
    stored = table.peek("orders", 1000)
    by_seq = dict(zip(stored["seq"].to_pylist(), stored["body"].to_pylist(), strict=True))
    assert len(by_seq) == 3 * BATCHES * PER_BATCH
    for name, batches in seqs.items():
        flat = [s for batch in batches for s in batch]
        assert flat == sorted(flat)  # each producer's messages keep their order
        expected = [f"{name}-b{b}-m{i}" for b in range(BATCHES) for i in range(PER_BATCH)]
        assert [bytes(by_seq[s]).decode() for s in flat] == expected
    stats = table.stats("orders")
    assert stats["added"] == 3 * BATCHES * PER_BATCH and identity_holds(stats)


def test_a_batch_another_producer_overtook_is_renumbered_after_it(table):
    table.publish("orders", ["first"])
    store = table.store
    snapshot = store.snapshot()
    base = max(s.next_seq for s in snapshot.states.values())
    rows = normalise(pa.table({"body": ["late-1", "late-2"]}), base, now_micros(), "orders")
    late = Reservation(base, [StagedQueueFile("orders", write_file(store.location, MESSAGE, rows))])
    winner = table.publish("orders", ["winner"])  # commits first, from the same base
    assert winner.seqs == [base]
    outcome = commit_enqueue(
        store, late, arguments={}, policies=None, on_reject="drop", operation="TEST"
    )
    assert outcome.accepted["orders"].to_pylist() == [base + 1, base + 2]  # commit order
    assert late.shifted == 1
    assert bodies(table, "orders") == ["first", "winner", "late-1", "late-2"]
    assert identity_holds(table.stats("orders"))


def parquet_settings(path: Path) -> list[tuple]:
    """Per column of a Parquet file: its compression, encodings and whether it has
    statistics."""
    meta = pq.ParquetFile(path).metadata
    group = meta.row_group(0)
    return [
        (column.path_in_schema, column.compression, column.encodings, column.is_stats_set)
        for column in (group.column(i) for i in range(group.num_columns))
    ]


def test_files_a_task_stages_are_written_as_every_message_file(table):
    """A Spark task's staging writer (a file per queue, a row group at a time) and
    write_file share one set of Parquet settings, and the staged files enqueue. The task's
    writer stores every column (it opens a file before it has seen its rows); write_file
    leaves out those null in every row."""
    table.declare("orders")
    store = table.store
    base = reserve(store, None, {}, None)
    first = normalise(pa.table({"body": ["o1", "o2"]}), base, now_micros(), "orders")
    both = normalise(
        pa.table({"body": ["o3", "p1"], "queue": ["orders", "parcels"]}),
        base + 2,
        now_micros(),
        None,
    )
    writer = MessageFileWriter(store.location)
    writer.add(first)
    writer.add(both)
    staged = writer.close()
    assert sorted((f.queue, f.file.rows) for f in staged) == [("orders", 3), ("parcels", 1)]
    orders = next(f.file for f in staged if f.queue == "orders")
    alone = write_file(store.location, MESSAGE, pa.concat_tables([first, both.slice(0, 1)]))
    root = Path(store.uri)
    written = parquet_settings(root / alone.path)
    stored = {setting[0] for setting in written}
    assert stored == {"queue", "seq", "body", "size", "priority", "enqueued_at", "delivery_count"}
    staging = [setting for setting in parquet_settings(root / orders.path) if setting[0] in stored]
    assert staging == written
    assert orders.stats == alone.stats
    store.location.delete([alone.path])
    outcome = commit_enqueue(
        store, Reservation(base, staged), arguments={}, policies=None, on_reject="drop",
        operation=CommitOperation.ENQUEUE.on(),
    )  # fmt: skip
    assert outcome.accepted["orders"].to_pylist() == [0, 1, 2]
    assert bodies(table, "orders") == ["o1", "o2", "o3"]
    assert bodies(table, "parcels") == ["p1"]


def test_a_reservation_checks_the_declare_its_commit_makes_and_commits_nothing(tmp_path):
    table = QueueTable(str(tmp_path / "queues"))
    assert reserve(table.store, "orders", {"max_length": 5}, None) == 0  # the table is made
    version = table.store.open().version()
    table.declare("orders", max_length=5)
    table.publish("orders", ["a", "b"])
    assert reserve(table.store, "orders", {"max_length": 5}, None) == 2
    assert reserve(table.store, "other", {"max_length": 3}, None) == 2  # a new queue: fine
    version = table.store.open().version()
    with pytest.raises(ArgumentMismatchError, match="maxLength: queue has 5, given 6"):
        reserve(table.store, "orders", {"max_length": 6}, None)
    assert table.store.open().version() == version
    assert table.queues() == ["orders"]
