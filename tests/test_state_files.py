"""A queue state read back from its files alone (no state cache: another process) equals the
state that wrote them, every index record included."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone

from spark_queue import QueueTable
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
