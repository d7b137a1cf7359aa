"""A queue state read back from its files alone (no state cache: another process) equals the
state that wrote them, every index record included."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from spark_queue import QueueTable
from spark_queue.store import QueueStore


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
