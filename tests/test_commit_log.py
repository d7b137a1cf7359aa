"""What each commit records of itself (spark_queue/storage/commit_log.py): the operations'
names, the summary's JSON as Delta's history shows it, and its decoding for ``history`` and
a consumer's long poll."""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable

from spark_queue import QueueTable
from spark_queue.clients.polling import may_feed
from spark_queue.storage.commit_log import (
    CommitOperation,
    CommitSummary,
    Operation,
    parse_operations,
)


def summaries(path: str) -> list[str]:
    """The ``spark_queue`` entry of every commit's info, oldest first."""
    history = sorted(DeltaTable(path).history(), key=lambda c: c["version"])
    return [c["spark_queue"] for c in history if "spark_queue" in c]


def test_every_operation_is_recorded_as_it_reads(tmp_path):
    path = str(tmp_path / "queues")
    table = QueueTable(path)
    table.declare("q")
    table.publish("q", ["a", "b", "c", "d"])
    seqs = table.lease("q", "w", max_messages=4)["seq"].to_pylist()
    table.extend("q", seqs[:1], consumer="w", period="1m")
    table.ack("q", seqs[:1], consumer="w")
    table.cancel("q", seqs[1:2], consumer="w")
    table.expire("q", seqs[2:3], consumer="w")
    table.release("q", consumer="w")
    table.alter("q", max_length=10)
    table.purge("q")
    table.compact()
    recorded = summaries(path)
    assert [json.loads(s)["operation"] for s in recorded] == [
        "DECLARE q",
        "PUBLISH q",
        "LEASE q w",
        "EXTEND q w",
        "ACK q",
        "CANCEL q",
        "EXPIRE q",
        "RELEASE q",
        "ALTER q",
        "PURGE q",
        "COMPACT",
    ]
    assert recorded[0] == '{"attempt": 1, "operation": "DECLARE q", "queues": ["q"], "removed": {}}'
    assert recorded[4] == (
        '{"attempt": 1, "operation": "ACK q", "queues": ["q"], "removed": {"q": {"acked": 1}}}'
    )
    compacted = CommitSummary.decode(recorded[-1])
    assert compacted.operations == (CommitOperation.COMPACT.on(),)
    assert set(compacted.details) == {"dropped", "rewritten"}
    assert compacted.encode() == recorded[-1]
    assert [CommitSummary.decode(s).encode() for s in recorded] == recorded
    entry = table.store.read_log_entry(5)
    assert (entry.operation, entry.summary.queues, entry.summary.attempt) == ("ACK q", ["q"], 1)
    assert entry.summary.removed == {"q": {"acked": 1}}


@pytest.mark.parametrize(
    ("operation", "fields"),
    [
        (CommitOperation.PUBLISH.on("q"), ("PUBLISH q", CommitOperation.PUBLISH, "q", None, None)),
        (
            CommitOperation.LEASE.on("q", "my worker"),
            ("LEASE q my worker", CommitOperation.LEASE, "q", "my worker", None),
        ),
        (
            CommitOperation.CONSUME.on("q", "billing"),
            ("CONSUME q billing", CommitOperation.CONSUME, "q", "billing", None),
        ),
        (CommitOperation.ENQUEUE.on(), ("ENQUEUE", CommitOperation.ENQUEUE, None, None, None)),
        (
            CommitOperation.ENQUEUE.on(batch=3),
            ("ENQUEUE batch 3", CommitOperation.ENQUEUE, None, None, 3),
        ),
        (
            CommitOperation.VACUUM_CLAIM.on(),
            ("VACUUM CLAIM", CommitOperation.VACUUM_CLAIM, None, None, None),
        ),
        (Operation("OPTIMIZE q"), ("OPTIMIZE q", None, None, None, None)),
    ],
)
def test_an_operation_reads_back_what_it_names(operation, fields):
    for read in (operation, Operation(str(operation))):
        assert (str(read), read.kind, read.queue, read.consumer, read.batch) == fields


def test_a_group_commit_decodes_into_its_operations_even_with_a_consumer_named_with_a_separator():
    summary = CommitSummary.decode(
        json.dumps({"operation": "PUBLISH q; LEASE q a; b; ACK p", "queues": ["p", "q"]})
    )
    assert summary.operations == ("PUBLISH q", "LEASE q a; b", "ACK p")
    assert [op.consumer for op in summary.operations] == [None, "a; b", None]
    assert "; ".join(parse_operations(summary.operation)) == summary.operation
    assert may_feed("q", summary.operations, summary.queues)  # the publish
    leases = CommitSummary.decode(json.dumps({"operation": "LEASE q a; b", "queues": ["q"]}))
    assert not may_feed("q", leases.operations, leases.queues)  # one lease, not feeding
    assert may_feed("q", parse_operations("OPTIMIZE"), None)  # unknown: may be anything
