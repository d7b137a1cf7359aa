"""A queue state read back from its files alone (no state cache: another process) equals the
state that wrote them, every index record included."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_queue import QueueTable, UnsupportedFormatError
from spark_queue.rules.state import STATE_FORMAT
from spark_queue.storage import table_view
from spark_queue.storage.store import QueueStore


def test_every_index_record_reads_back_from_the_table(tmp_path):
    table = QueueTable(str(tmp_path / "queues"))
    table.declare("jobs", ring_size=10)
    table.publish("jobs", ["a", "b", "c", "d"])
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    table.publish("jobs", [{"body": b"later", "deliver_at": later}])  # scheduled
    held = table.lease("jobs", "w", max_messages=3)["seq"].to_pylist()
    table.cancel("jobs", held[:1], "w")  # redelivered counts, and an extra below the head
    written = table.store.snapshot().states["jobs"]
    read = QueueStore(table.path).snapshot().states["jobs"]  # a fresh store: files only
    assert read.to_json() == written.to_json()
    assert read.leases.seq.tolist() == written.leases.seq.tolist() == held[1:]
    assert read.scheduled.seq.tolist() == written.scheduled.seq.tolist()
    assert read.extras.seq.tolist() == written.extras.seq.tolist() == held[:1]
    assert read.redelivered.seq.tolist() == written.redelivered.seq.tolist() == held[:1]
    assert table.ack("jobs", held[1:], "w") == 2


def test_small_files_read_whole_leave_the_process_free_to_exit(tmp_path):
    """A file read whole from memory (its size known, :data:`WHOLE_READ_BYTES` or less)
    gives what a read of the file gives, for every kind of record (the columns a record
    does not hold as nulls), and the process exits cleanly after it: pyarrow's threaded
    read of an in-memory file aborted most processes that exited right after it. Five
    processes, each reading a state file last."""
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.declare("q", max_length=3, duplicate_window="1 hour", dead_letter_queue="dlq")
    table.publish("q", [{"body": f"m{i}", "message_id": f"id{i}"} for i in range(5)])
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    table.publish("q", [{"body": "later", "deliver_at": later}])
    leased = table.lease("q", consumer="c", max_messages=2).column("seq").to_pylist()
    table.ack("q", leased[:1], consumer="c")
    table.lease("q", consumer="c", max_messages=1)
    files = table.store.snapshot().files
    records = set()
    for relative, size, record in zip(
        files["path"].to_pylist(),
        files["size"].to_pylist(),
        files["record"].to_pylist(),
        strict=True,
    ):
        records.add(record)
        whole = table.store.read_rows(relative, size=size)
        read = table.store.read_rows(relative)
        assert whole.schema == read.schema and whole.equals(read), record
    assert {"message", "queue", "removal", "lease", "scheduled", "seen"} <= records
    # The read is the last thing the process does: the abort came in ~80% of such runs.
    reader = textwrap.dedent(
        f"""
        from spark_queue.storage.store import QueueStore
        store = QueueStore({path!r})
        relative, size, _ = store.snapshot(with_states=False).state_files[0]
        assert store.read_rows(relative, size=size).num_rows
        """
    )
    for _ in range(5):
        run = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("stored", [None, 1, 3], ids=["unversioned", "format-1", "format-3"])
def test_a_state_of_another_format_version_is_refused_by_name(tmp_path, stored):
    """A queue state stored in another format (a development build's, without the
    ``format`` key, or a later one) is refused in one line naming the queue, the version
    found and the one read; nothing is written."""
    path = tmp_path / "queues"
    table = QueueTable(str(path), broker="off")
    table.publish("jobs", ["a"])
    for state_file in path.glob("record=queue/*.parquet"):  # rewritten by hand, in place
        rows = pq.read_table(state_file)
        states = []
        for text in rows["queue_state"].to_pylist():
            data = json.loads(text)
            assert data.pop("format") == STATE_FORMAT
            states.append(json.dumps(data if stored is None else {**data, "format": stored}))
        column = rows.schema.get_field_index("queue_state")
        pq.write_table(rows.set_column(column, "queue_state", pa.array(states)), state_file)
    table_view.forget()  # what this process knows: as another process reads the table
    with pytest.raises(UnsupportedFormatError) as refused:
        QueueStore(str(path)).snapshot()
    message = str(refused.value)
    found = 1 if stored is None else stored
    assert f"queue 'jobs' has a state of format version {found};" in message
    assert f"reads version {STATE_FORMAT} only" in message and str(path) in message
    assert "\n" not in message
    if stored is None:  # a publish from the command line: that line, and nothing written
        version = table.store.open().version()
        published = subprocess.run(
            [sys.executable, "-m", "spark_queue.cli", "--path", str(path), "publish", "jobs"],
            input='{"body": "b"}\n',
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (published.returncode, published.stdout) == (1, "")
        assert published.stderr == f"spark-queue: {message}\n"
        assert QueueStore(str(path)).open().version() == version


def test_the_state_files_of_a_view_moved_on_are_those_of_the_table_read_afresh(tmp_path):
    table = QueueTable(str(tmp_path / "queues"))
    table.publish("jobs", ["a", "b"])
    known = table.store.view(probe=False)
    assert known is not None
    assert known.state_files  # listed: each view moved on lists its own from its commit
    table.publish("jobs", ["c"])
    table.lease("jobs", "w", max_messages=2)  # a lease index joins the queue states
    moved = table.store.view(probe=False)
    assert moved is not None and moved.version == known.version + 2
    assert "state_files" in moved.cache  # moved on, not listed from the files
    table_view.forget()
    fresh = QueueStore(table.path).view(probe=False)
    assert fresh is not None and fresh.version == moved.version
    assert sorted(moved.state_files) == sorted(fresh.state_files)
    assert {record for _, _, record in moved.state_files} == {"queue", "lease"}
