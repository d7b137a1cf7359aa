"""What each commit of a queue table did, as its Delta log entry records it, written and read
one way.

Every commit the connector makes carries a summary in its ``commitInfo``, under the key
``spark_queue``: a JSON object with ``operation`` (what it did: its operations, joined by
``; `` where a group commit holds several, e.g. ``PUBLISH orders; LEASE orders billing``),
and as the commit has them ``queues`` (those whose state it changed), ``attempt`` (above 1:
other writers won the earlier ones), ``removed`` (messages it removed, per queue and
outcome) and details of its own (a compaction's ``dropped`` and ``rewritten``). Delta's
``DESCRIBE HISTORY`` and ``DeltaTable.history()`` show it as it is written.

:class:`CommitOperation` names the operations; :class:`Operation` is one as recorded, with
its queue and consumer; :class:`CommitSummary` encodes a summary when committing
(:meth:`~spark_queue.storage.store.QueueStore.commit`) and decodes it from a log entry
(:func:`parse_log_entry`), for ``history``, a consumer's long poll and the store.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from spark_queue.model.schema import PARTITION
from spark_queue.storage.files import STATE_RECORDS

SUMMARY_KEY = "spark_queue"  # the summary's key in a commitInfo
SEPARATOR = "; "  # between the operations of one commit


class CommitOperation(str, Enum):
    """What a commit of the connector does, as its log entry names it."""

    PUBLISH = "PUBLISH"  # QueueTable.publish: PUBLISH <queue>
    LEASE = "LEASE"  # QueueTable.lease: LEASE <queue> <consumer>
    ACK = "ACK"  # QueueTable.ack, cancel, expire and release: <name> <queue>
    CANCEL = "CANCEL"
    EXPIRE = "EXPIRE"
    RELEASE = "RELEASE"
    EXTEND = "EXTEND"  # QueueTable.extend: EXTEND <queue> <consumer>
    CONSUME = "CONSUME"  # a streaming source's micro-batch: CONSUME <queue> <consumer>
    ENQUEUE = "ENQUEUE"  # a Spark write: ENQUEUE, or ENQUEUE batch <id> for a micro-batch
    DECLARE = "DECLARE"  # QueueTable.declare, alter and purge: <name> <queue>
    ALTER = "ALTER"
    PURGE = "PURGE"
    COMPACT = "COMPACT"  # compaction
    VACUUM_CLAIM = "VACUUM CLAIM"  # the hour's automatic vacuum, claimed by one writer

    @property
    def feeds(self) -> bool:
        """Whether a commit of it may make messages ready that were not: every operation
        but a lease, ack, extension or expiry, a streaming source's batch and a compaction
        (a lease that returned expired leases is caught by a consumer's idle lease)."""
        return self not in _NOT_FEEDING

    def on(
        self, queue: str | None = None, consumer: str | None = None, *, batch: int | None = None
    ) -> Operation:
        """This operation on ``queue`` (of ``consumer``; ``batch``: a micro-batch's id)."""
        words = [self.value, *(w for w in (queue, consumer) if w is not None)]
        if batch is not None:
            words += ["batch", str(batch)]
        return Operation(" ".join(words))


_NOT_FEEDING = frozenset(
    {
        CommitOperation.LEASE,
        CommitOperation.ACK,
        CommitOperation.EXTEND,
        CommitOperation.EXPIRE,
        CommitOperation.COMPACT,
        CommitOperation.CONSUME,
    }
)
_WITH_CONSUMER = frozenset({CommitOperation.LEASE, CommitOperation.EXTEND, CommitOperation.CONSUME})
_WITHOUT_QUEUE = frozenset(
    {CommitOperation.ENQUEUE, CommitOperation.COMPACT, CommitOperation.VACUUM_CLAIM}
)
# Longest name first, so that no name is taken for the start of a longer one.
_BY_LENGTH = sorted(CommitOperation, key=lambda kind: -len(kind.value))


class Operation(str):
    """One operation of a commit as its log entry records it (``LEASE orders billing``),
    with what it names: :attr:`kind` (None: a name this version does not know, which may
    have done anything), :attr:`queue`, :attr:`consumer` and a micro-batch's :attr:`batch`.
    Made by :meth:`CommitOperation.on`, or from the recorded text."""

    kind: CommitOperation | None
    queue: str | None
    consumer: str | None
    batch: int | None

    def __new__(cls, text: str) -> Operation:
        if type(text) is cls:
            return text
        operation = super().__new__(cls, text)
        operation.kind = _kind_of(text)
        operation.queue = operation.consumer = operation.batch = None
        if operation.kind is None:
            return operation
        rest = text[len(operation.kind.value) + 1 :]
        if operation.kind is CommitOperation.ENQUEUE:
            number = rest.removeprefix("batch ")
            operation.batch = int(number) if number != rest and number.isdigit() else None
        elif operation.kind in _WITH_CONSUMER:
            queue, _, consumer = rest.partition(" ")
            operation.queue, operation.consumer = queue or None, consumer or None
        elif operation.kind not in _WITHOUT_QUEUE:
            operation.queue = rest or None
        return operation

    @property
    def feeds(self) -> bool:
        """Whether it may have made messages ready (:attr:`CommitOperation.feeds`); one of
        an unknown kind may have."""
        return self.kind is None or self.kind.feeds


def _kind_of(text: str) -> CommitOperation | None:
    for kind in _BY_LENGTH:
        if text == kind.value or text.startswith(kind.value + " "):
            return kind
    return None


def parse_operations(text: str) -> tuple[Operation, ...]:
    """The operations of a commit from its recorded text (joined by ``; ``). A consumer
    name may hold ``; `` itself: a part that names no operation continues the one before."""
    parts: list[str] = []
    for part in text.split(SEPARATOR):
        if parts and _kind_of(part) is None and _kind_of(parts[-1]) in _WITH_CONSUMER:
            parts[-1] += SEPARATOR + part
        else:
            parts.append(part)
    return tuple(Operation(part) for part in parts)


@dataclass(frozen=True)
class CommitSummary:
    """The ``spark_queue`` summary of one commit (the module's doc says what each field
    holds); None where the commit does not record it."""

    operation: str | None  # its operations as recorded, joined by "; "
    queues: list[str] | None = None
    attempt: int | None = None
    removed: dict[str, dict[str, int]] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, operations: Operation | Sequence[Operation], **fields: Any) -> CommitSummary:
        """The summary of a commit of ``operations`` (one, or a group commit's)."""
        joined = operations if isinstance(operations, str) else SEPARATOR.join(operations)
        return cls(joined, **fields)

    @property
    def operations(self) -> tuple[Operation, ...]:
        return parse_operations(self.operation or "")

    def encode(self) -> str:
        """As a commit records it: JSON, keys sorted."""
        record: dict[str, Any] = {"operation": self.operation, **self.details}
        for name in ("queues", "attempt", "removed"):
            if getattr(self, name) is not None:
                record[name] = getattr(self, name)
        return json.dumps(record, sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> CommitSummary:
        record = dict(json.loads(text))
        operation = record.pop("operation", None)
        return cls(
            None if operation is None else str(operation),
            queues=record.pop("queues", None),
            attempt=record.pop("attempt", None),
            removed=record.pop("removed", None),
            details=record,
        )


EMPTY_SUMMARY = "{}"  # what a commit without a summary records under SUMMARY_KEY


@dataclass
class LogEntry:
    """What one Delta log entry (commit file) says: when, what (:attr:`summary`; None where
    the commit is not the connector's: a vacuum, another writer), Delta's own name for the
    operation, and the state files it added, by record."""

    version: int
    timestamp_ms: int | None = None
    summary: CommitSummary | None = None
    delta_operation: str | None = None
    added: dict[str, list[str]] = field(default_factory=dict)

    @property
    def operation(self) -> str | None:
        """What the commit did, as history shows it: the connector's summary, else what
        Delta calls the commit."""
        return self.summary.operation if self.summary is not None else self.delta_operation


def parse_log_entry(version: int, text: str, *, files: bool = True) -> LogEntry:
    """A log entry from its text (newline-delimited JSON actions, Delta protocol); the
    state files it added only with ``files`` (else it stops at the commit's info)."""
    entry = LogEntry(version)
    for line in text.splitlines():
        # Only the actions wanted are parsed: a long poll reads every entry others commit.
        if '"commitInfo"' not in line and not (files and '"add"' in line):
            continue
        action = json.loads(line)
        if "commitInfo" in action:
            info = action["commitInfo"]
            entry.timestamp_ms = info.get("timestamp")
            entry.delta_operation = info.get("operation")
            summary = info.get(SUMMARY_KEY)
            entry.summary = CommitSummary.decode(summary) if summary else None
            if not files:
                break
        elif "add" in action:
            add = action["add"]
            record = (add.get("partitionValues") or {}).get(PARTITION)
            if record in STATE_RECORDS:
                entry.added.setdefault(record, []).append(add["path"])
    return entry
