"""A queue table's history: every queue's gauges and counters after each commit, without Spark.

Every commit that changes a queue (a producer's micro-batch, a consumer's lease and ack,
``declare``, ``alter``, ``purge``, ...) writes new state files: one ``record=queue`` file with a
row per queue (its counters and per-priority ready counts, ``queue_state`` JSON) and the
``scheduled`` and ``lease`` indexes of every queue, and removes the previous ones in the same
commit (docs/DESIGN.md). So the state files a commit *adds* are the whole state of the table
as of that commit. :func:`queue_history` reads them commit by commit from the Delta log, one
small JSON file and up to three small Parquet files per version, and returns one row per
queue and version:

``version``, ``timestamp`` (the commit's, UTC), ``operation`` (what the commit did, e.g.
``ENQUEUE batch 3``, ``CONSUME orders billing``, ``ALTER orders``), ``queue``, the gauges
``ready``, ``ready_bytes``, ``leased``, ``scheduled``, the counters of SEMANTICS §4 (``added``,
``acked``, ``replaced``, ``dropped``, ``rejected``, ``expired``, ``killed``,
``dead_lettered``, ``purged``, ``duplicates``) and the limits in force (``max_length``,
``max_length_bytes``; null when unlimited).

What a row means, exactly:

- Gauges are as the commit left them, not caught up with the clock: a scheduled message that
  fell due after the commit is still ``scheduled``, a lease whose period ran out is still
  ``leased``, until the next commit to the queue (``QueueTable.stats`` catches up in memory).
  The identity ``added = acked + replaced + dropped + expired + killed + purged + ready +
  leased + scheduled`` holds on every row.
- Versions that changed no state (the table's creation, compaction, vacuum) have no rows.
- History reaches back as far as the Delta log does: 7 days on a queue table
  (``delta.logRetentionDuration``), and at most 500 versions
  (``spark_queue.logRetentionVersions``: on a busy table, seconds to minutes); log cleanup
  runs after checkpoints (docs/MAINTENANCE.md, "Log cleanup"). A version whose state files
  were since deleted by a vacuum has no rows either: vacuum only deletes files removed
  longer ago than its retention, so the most recent versions are always there.

The same numbers are readable with Spark by time travel, one version at a time
(``spark.read.format("delta").option("versionAsOf", v)``, ``record = 'queue'`` rows); this
module reads every version in one pass and serves ``QueueTable.history``, the notebooks and
anyone charting a queue over time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from spark_queue.errors import InvalidOptionError, TableNotFoundError
from spark_queue.model.schema import UTC_MICROS
from spark_queue.rules import COUNTERS, gauges
from spark_queue.storage.commit_log import LogEntry
from spark_queue.storage.files import QUEUE
from spark_queue.storage.store import QueueStore, require_queue

GAUGES = ("ready", "ready_bytes", "leased", "scheduled")
"""A queue's gauges (SEMANTICS §4), as ``QueueTable.stats`` and the history report them."""
LIMITS = ("max_length", "max_length_bytes")
HISTORY_SCHEMA = pa.schema(
    [
        pa.field("version", pa.int64(), nullable=False),
        pa.field("timestamp", UTC_MICROS),
        pa.field("operation", pa.string()),
        pa.field("queue", pa.string(), nullable=False),
        *(pa.field(name, pa.int64(), nullable=False) for name in (*GAUGES, *COUNTERS)),
        *(pa.field(name, pa.int64()) for name in LIMITS),
    ]
)
_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
_LOG = "_delta_log"


def queue_history(
    store: QueueStore, queue: str | None = None, versions: Iterable[int] | None = None
) -> pa.Table:
    """Gauges and counters of ``queue`` (every queue if None) after each commit.

    ``versions`` picks table versions (e.g. ``range(100, 200)``); None means every version
    the Delta log still holds. Versions the log no longer holds, not reached yet, or that
    changed no queue state are simply absent. Rows come in version order, then queue name,
    as :data:`HISTORY_SCHEMA`. Raises :class:`InvalidOptionError` for a version that is not
    a whole number >= 0, :class:`QueueNotFoundError` for a queue the table does not have.
    """
    wanted = _check_versions(versions)
    table = store.open()
    if table is None:
        raise TableNotFoundError(store.uri)
    if queue is not None:
        snapshot = store.snapshot(table)
        assert snapshot is not None
        require_queue(snapshot.states, queue, store.uri)
    current = table.version()
    retained = [v for v in _log_versions(store) if v <= current]
    if wanted is not None:
        retained = [v for v in retained if v in wanted]
    rows: list[dict[str, Any]] = []
    for version in retained:
        rows.extend(_rows_of(store, _read_entry(store, version), queue))
    return pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA)


def _check_versions(versions: Iterable[int] | None) -> set[int] | None:
    if versions is None:
        return None
    if isinstance(versions, (str, bytes)):
        raise InvalidOptionError(
            f"versions must be whole numbers >= 0 (e.g. range(10, 20)), got {versions!r}"
        )
    wanted = set()
    for version in versions:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise InvalidOptionError(
                f"versions must be whole numbers >= 0 (e.g. range(10, 20)), got {version!r}"
            )
        wanted.add(version)
    return wanted


def _log_versions(store: QueueStore) -> list[int]:
    """The versions whose commit files are still in the Delta log, ascending."""
    selector = pafs.FileSelector(f"{store.base.rstrip('/')}/{_LOG}", allow_not_found=True)
    found = []
    for info in store.fs.get_file_info(selector):
        match = _COMMIT_FILE.match(info.base_name)
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def _read_entry(store: QueueStore, version: int) -> LogEntry:
    """What one commit file says (an empty entry where log cleanup removed it since it
    was listed)."""
    try:
        return store.read_log_entry(version)
    except FileNotFoundError:
        return LogEntry(version)


def _rows_of(store: QueueStore, commit: LogEntry, queue: str | None) -> list[dict[str, Any]]:
    """One row per queue for a commit that wrote state; none for one that did not, or whose
    state files a vacuum has deleted."""
    if QUEUE not in commit.added:
        return []
    try:
        states = store.read_state_files(
            [(path, 0, record) for record, paths in commit.added.items() for path in paths]
        )
    except FileNotFoundError:
        return []
    rows = []
    timestamp = None if commit.timestamp_ms is None else commit.timestamp_ms * 1000
    for name, state in states.items():
        if queue is not None and name != queue:
            continue
        row: dict[str, Any] = {
            "version": commit.version,
            "timestamp": timestamp,
            "operation": commit.operation,
            "queue": name,
            **gauges(state),
            "max_length": state.arguments.max_length,
            "max_length_bytes": state.arguments.max_length_bytes,
        }
        row.update({counter: state.counters[counter] for counter in COUNTERS})
        rows.append(row)
    return sorted(rows, key=lambda r: r["queue"])
