"""Maintenance, run by spark-queue itself: never a Spark OPTIMIZE or VACUUM on a live queue table.

See ``docs/MAINTENANCE.md`` for the operator's view.

**Compaction.**

Every micro-batch adds small files (messages per task and queue, removal rows, state). Left
alone, every commit and every read would pay for all of them. Compaction, like Delta's
auto-compaction, runs right after any connector commit (a producer's, a consumer's, an
operator's: :func:`after_commit`) once a queue has ``SMALL_FILE_LIMIT`` small files, and on
demand (:meth:`spark_queue.QueueTable.compact`):

- a message file whose rows have all left the queue is removed without being read;
- the other small message files of the queue are rewritten as one file in ``seq`` order,
  keeping only live rows (so evicted bodies leave the table's current version);
- small removal files are merged.

It is a commit of its own with ``max_commit_retries=0``: if a producer commits first, the
compaction is dropped and tried after a later commit, and a producer that loses to it plans
its batch again. No row that is live, and no counter, changes. A commit group plans one
with :func:`plan_compaction` and commits it in its next round instead
(:class:`~spark_queue.commit.requests.CompactRequest`).

**Log checkpoints** (:func:`checkpoint_after`): every connector commit whose version is a
multiple of the table's ``delta.checkpointInterval`` (Delta's default of 100 where the table
sets none) writes a Delta checkpoint with delta-rs, then deletes log files that no retained
version needs: versions are retained for ``delta.logRetentionDuration`` and, at most,
``spark_queue.logRetentionVersions`` versions back (:func:`cleanup_log`). Best effort: the
commit has happened, so a failure is logged and the next interval tries again.

**Vacuum** (:func:`vacuum`): deletes data files no current version references, after a
retention period with a safe floor (:func:`check_retention`), and only the table's own:
files its log once referenced or spark-queue wrote, never anything else in its folder. A
table that sets ``spark_queue.autoVacuumHours`` is vacuumed with that retention once an
hour, by whichever connector process claims the hour first after one of its commits
(:func:`auto_vacuum`): a commit group's upkeep thread, or inline after a streaming query's
commit.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from spark_queue.commit.backoff import backoff
from spark_queue.errors import CommitUnknownError, InvalidOptionError, StorageError
from spark_queue.model.arguments import MAX_DURATION_DAYS, POSITIVE
from spark_queue.model.schema import FILE_SCHEMA, file_columns
from spark_queue.rules import NEVER, QueueState, below_heads, live_mask
from spark_queue.storage.commit_log import CommitOperation, CommitSummary
from spark_queue.storage.files import (
    COMPACTED,
    MESSAGE,
    REMOVAL,
    StagedFile,
    delete_files,
    is_own_file,
    write_file,
)
from spark_queue.storage.location import OBJECT_STORE_SCHEMES, Location
from spark_queue.storage.log_checkpoint import checkpoint_from_copy
from spark_queue.storage.row_cache import held_rows
from spark_queue.storage.store import QueueStore, Snapshot

if TYPE_CHECKING:  # deltalake is imported where a table is opened
    from deltalake import DeltaTable

SMALL_FILE_BYTES = 1024 * 1024  # below this a file is worth rewriting; docs/DESIGN.md "Compaction"
SMALL_FILE_LIMIT = 32  # small files of one queue (or removal files) that trigger compaction
COMPACT_MOVES = 10  # versions a compaction may move on to when other writers commit first
CHECKPOINT_INTERVAL = 100  # versions between checkpoints where delta.checkpointInterval is unset
LOG_RETENTION_HOURS = 30 * 24.0  # Delta's delta.logRetentionDuration default
# The log's own bound by count (docs/MAINTENANCE.md, "Log cleanup"): delta-rs lists the
# whole log folder for every commit and update on a local disk, so a log that keeps a week
# of a busy table's commits slows every commit (halved within 3 minutes at 60 a second).
LOG_RETENTION_VERSIONS_KEY = "spark_queue.logRetentionVersions"
LOG_RETENTION_VERSIONS = 500  # where the table does not set LOG_RETENTION_VERSIONS_KEY
# A commit younger than this, against the newest by the store's clock, is never cleaned up:
# a reader that listed the log a moment before a checkpoint may still be reading the files
# that checkpoint supersedes, and a writer trusts its view for a moment (table_view).
LOG_MIN_AGE_SECONDS = 10.0
DEFAULT_VACUUM_HOURS = 168.0  # Delta's default: a week of time travel
FILE_RETENTION_HOURS = 168.0  # Delta's delta.deletedFileRetentionDuration default
MIN_RETENTION_HOURS = 1.0  # the in-flight window of the connector's own reads; see check_retention
# A vacuum's deletes in flight at once, where it deletes files itself: 4 threads delete
# 20,000 files of a local disk in 0.8 s, one in 1.4 s, 16 in 1.3 s. delta-rs's object store
# (object stores) serves one call at a time whatever the number of threads.
VACUUM_DELETE_THREADS = 4
# The longest listing after which delta-rs's full vacuum may still delete in bulk what that
# listing checked: well inside the hour the listing's retention is shorter by.
BULK_VACUUM_WINDOW_SECONDS = 600.0
# The longest retention, the longest duration of every argument: delta-rs raises
# OverflowError beyond 2**64 hours and panics beyond ~2.5e12 (chrono's TimeDelta).
MAX_RETENTION_HOURS = MAX_DURATION_DAYS * 24
# Automatic vacuum (docs/MAINTENANCE.md, "Automatic vacuum"): the table property that turns it
# on (the retention, in hours), and the application transaction through which a process
# claims an hour's vacuum, so that one process vacuums each hour whatever the count.
AUTO_VACUUM_KEY = "spark_queue.autoVacuumHours"
AUTO_VACUUM_APP_ID = "spark-queue-auto-vacuum"
AUTO_VACUUM_PERIOD_SECONDS = 3600.0
AUTO_VACUUM_CLAIMS = 5  # attempts at the claim's commit, which races every other writer
# A process looks at a table's automatic vacuum this often at most: a look reads the hour's
# claim (~0.7 ms: delta-rs scans the version's application transactions), commits it where
# the hour is unclaimed, and warns of a bad property.
AUTO_VACUUM_LOOK_SECONDS = 60.0

Progress = Callable[[str], None]
log = logging.getLogger("spark_queue")
_UNITS = {
    "microsecond": 1e-6 / 3600,
    "millisecond": 1e-3 / 3600,
    "second": 1 / 3600,
    "minute": 1 / 60,
    "hour": 1.0,
    "day": 24.0,
    "week": 168.0,
}
_next_vacuum_look: dict[str, float] = {}  # table URI -> time.monotonic() of the next look
_next_vacuum_look_lock = threading.Lock()
_INTERVAL = re.compile(r"^\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*([a-z]+?)s?\s*$", re.IGNORECASE)


def no_progress(_: str) -> None:
    """The default progress callback."""


def _live_mask(rows: pa.Table, state: QueueState) -> pa.Array:
    """Rows of ``state``'s queue that are still live (:func:`~spark_queue.rules.live_mask`)."""
    seqs = rows["seq"].to_numpy()
    priorities = rows["priority"].fill_null(0).to_numpy()
    heads = np.full(len(seqs), NEVER, dtype=np.int64)
    for priority, level in state.levels.items():
        heads[priorities == priority] = level.head
    holes = np.asarray(sorted(state.holes), dtype=np.int64)
    return pa.array(live_mask(seqs, heads, holes, below_heads(state)))


def needs_compaction(snapshot: Snapshot, limit: int = SMALL_FILE_LIMIT) -> bool:
    files = snapshot.files
    small = files.filter(pc.less(files["size"], SMALL_FILE_BYTES))
    removal = pc.sum(pc.equal(small["record"], REMOVAL)).as_py() or 0
    if removal >= limit:
        return True
    messages = small.filter(pc.equal(small["record"], MESSAGE))
    if messages.num_rows < limit:
        return False
    counts = pc.value_counts(messages["min_queue"])
    return any(c.as_py() >= limit for c in counts.field("counts"))


@dataclass(frozen=True)
class Compaction:
    """A compaction planned on one version, its files stored: what its commit adds and
    removes, and its counts. Its commit may land on any later version where every file it
    removes is still there (:func:`_commit_moving_on` says why)."""

    adds: list[StagedFile]
    removes: list[tuple[str, int, str]]
    dropped: int
    rewritten: int

    @property
    def details(self) -> dict[str, int]:
        """What its commit's summary records besides the operation."""
        return {"dropped": self.dropped, "rewritten": self.rewritten}

    def counts(self) -> dict[str, int]:
        return {**self.details, "written": len(self.adds)}

    def discard(self, location: Location) -> None:
        """Delete its files (it did not commit)."""
        delete_files(location, [f.path for f in self.adds])


def compact(
    store: QueueStore, snapshot: Snapshot, progress: Progress = no_progress
) -> dict[str, int]:
    """Compact the table at ``snapshot``; returns file counts. Raises on a lost race.

    ``progress`` gets one line per file read (``compacting queue q: 12/40 files``).
    """
    planned = plan_compaction(store, snapshot, progress)
    if planned is None:
        return {"dropped": 0, "rewritten": 0, "written": 0}
    progress(f"committing: {len(planned.removes)} files out, {len(planned.adds)} in")
    summary = CommitSummary.of(CommitOperation.COMPACT.on(), details=planned.details)
    try:
        committed_from = _commit_moving_on(store, snapshot, planned.adds, planned.removes, summary)
    except CommitUnknownError:  # it may have landed: its files stay
        raise
    except BaseException:
        planned.discard(store.location)
        raise
    checkpoint_after(store, committed_from)
    return planned.counts()


def plan_compaction(
    store: QueueStore, snapshot: Snapshot, progress: Progress = no_progress
) -> Compaction | None:
    """The compaction of the table at ``snapshot``, its files written; None where it would
    remove nothing. ``progress`` as :func:`compact`'s."""
    files = snapshot.files
    adds: list[StagedFile] = []
    removes: list[tuple[str, int, str]] = []
    dropped = rewritten = 0
    messages = files.filter(pc.equal(files["record"], MESSAGE))
    for name, state in snapshot.states.items():
        mine = messages.filter(
            pc.and_(pc.equal(messages["min_queue"], name), pc.equal(messages["max_queue"], name))
        )
        low = min([lv.head for lv in state.levels.values()] or [state.next_seq])
        below = below_heads(state)
        if len(below):
            low = min(low, int(below[0]))
        dead = mine.filter(pc.less(mine["max_seq"], low))
        for path, size in zip(dead["path"].to_pylist(), dead["size"].to_pylist(), strict=True):
            removes.append((path, size, MESSAGE))
            dropped += 1
        small = mine.filter(
            pc.and_(pc.greater_equal(mine["max_seq"], low), pc.less(mine["size"], SMALL_FILE_BYTES))
        ).sort_by("min_seq")
        if small.num_rows < 2:
            continue
        paths = small["path"].to_pylist()
        parts = []
        for done, (path, size) in enumerate(zip(paths, small["size"].to_pylist(), strict=True), 1):
            held = held_rows(path)  # a file this process wrote: not decoded again
            parts.append(held if held is not None else store.read_rows(path, size=size))
            progress(f"compacting queue {name}: {done}/{len(paths)} files")
        # The held rows lack the columns their files leave out: filled in once, for all
        # (filling each of 32 small files' costs ~2 ms, the concatenation's ~0.1).
        rows = file_columns(pa.concat_tables(parts, promote_options="default"), FILE_SCHEMA.names)
        rows = rows.filter(_live_mask(rows, state)).sort_by("seq")
        if rows.num_rows:
            adds.append(write_file(store.location, MESSAGE, rows, tag=COMPACTED))
        for path, size in zip(small["path"].to_pylist(), small["size"].to_pylist(), strict=True):
            removes.append((path, size, MESSAGE))
            rewritten += 1
    removal = files.filter(
        pc.and_(pc.equal(files["record"], REMOVAL), pc.less(files["size"], SMALL_FILE_BYTES))
    )
    if removal.num_rows >= 2:
        progress(f"compacting removal records: {removal.num_rows} files")
        rows = pa.concat_tables(
            [
                store.read_rows(path, size=size)
                for path, size in zip(
                    removal["path"].to_pylist(), removal["size"].to_pylist(), strict=True
                )
            ]
        )
        adds.append(
            write_file(
                store.location,
                REMOVAL,
                rows.sort_by([("queue", "ascending"), ("seq", "ascending")]),
            )
        )
        removes += [
            (path, size, REMOVAL)
            for path, size in zip(
                removal["path"].to_pylist(), removal["size"].to_pylist(), strict=True
            )
        ]
    if not removes:  # nor adds: a file is written only in place of others
        return None
    return Compaction(adds, removes, dropped, rewritten)


def _commit_moving_on(
    store: QueueStore,
    snapshot: Snapshot,
    adds: list[StagedFile],
    removes: list[tuple[str, int, str]],
    summary: CommitSummary,
) -> Snapshot:
    """Commit a compaction; when another writer committed first, commit the same files on
    the newer version, as long as every file it removes is still there.

    That is safe because a compaction changes no row that is live: the rows it keeps are
    those live at the version it planned on, and a later commit only adds rows (in files of
    its own) or ends them (a row that left the queue never comes back; a leased row counts
    as live). Only a writer that removed one of its files (another compaction) makes it
    give up. Without this, a compaction that takes longer than the gap between two commits
    never lands on a busy table. Returns the snapshot it committed from.
    """
    from deltalake.exceptions import CommitFailedError

    for attempt in range(COMPACT_MOVES):
        try:
            store.commit(snapshot, adds, removes, summary=summary)
            return snapshot
        except CommitFailedError:
            newer = store.snapshot(with_states=False)  # the commit read what it missed
            if newer is None:  # the table is gone: the commit failed
                raise
            snapshot = newer
            present = set(newer.files["path"].to_pylist())
            if attempt == COMPACT_MOVES - 1 or any(path not in present for path, _, _ in removes):
                raise
    raise AssertionError("unreachable")  # the loop returns or raises


def compact_if_needed(store: QueueStore) -> None:
    """Auto-compaction after a connector commit. The commit has happened, so nothing here
    may fail it: a lost race is left for a later commit, any other error is logged."""
    from deltalake.exceptions import CommitFailedError

    try:
        snapshot = store.snapshot()
        if snapshot is None or not needs_compaction(snapshot):
            return
        with contextlib.suppress(CommitFailedError):
            compact(store, snapshot)
    except Exception as error:  # best effort: the batch is committed either way
        log.warning("auto-compaction of %s failed, left for a later commit: %s", store.uri, error)


# -- log checkpoints -------------------------------------------------------------------------


def interval_hours(key: str, text: str | None, default: float) -> float:
    """A Delta interval property (``interval 7 days``, ``24 hours``) in hours; ``default``
    where unset. Raises :class:`InvalidOptionError` naming ``key`` if it does not parse."""
    if text is None:
        return default
    match = _INTERVAL.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise InvalidOptionError(
            f"table property {key}={text!r} is not an interval such as 'interval 7 days' "
            f"(units: {', '.join(_UNITS)})"
        )
    return float(match.group(1)) * _UNITS[unit]


def log_retention_versions(configuration: dict[str, str]) -> int:
    """``spark_queue.logRetentionVersions`` of the table, else :data:`LOG_RETENTION_VERSIONS`.

    Raises:
        InvalidOptionError: not a whole number >= 1 (named, with what it takes).
    """
    text = configuration.get(LOG_RETENTION_VERSIONS_KEY)
    if text is None:
        return LOG_RETENTION_VERSIONS
    try:
        return POSITIVE.parse(LOG_RETENTION_VERSIONS_KEY, text)
    except InvalidOptionError:
        raise InvalidOptionError(
            f"table property {LOG_RETENTION_VERSIONS_KEY}={text!r} must be a whole number of "
            f"versions >= 1 (default {LOG_RETENTION_VERSIONS})"
        ) from None


def checkpoint_interval(configuration: dict[str, str]) -> int:
    """``delta.checkpointInterval`` of the table, else :data:`CHECKPOINT_INTERVAL`."""
    text = configuration.get("delta.checkpointInterval")
    try:
        value = int(text) if text is not None else CHECKPOINT_INTERVAL
    except ValueError:
        value = CHECKPOINT_INTERVAL
    return value if value > 0 else CHECKPOINT_INTERVAL


def after_commit(store: QueueStore, planned_on: Snapshot) -> None:
    """The work after a connector commit planned on ``planned_on`` (the commit is its next
    version): a log checkpoint at the interval, compaction if the table needs it, and the
    table's automatic vacuum where its hour is unclaimed. Runs inline: a streaming query's
    commit runs in a Python worker that may end with the call (the sink's), so that batch
    ends later by the vacuum's time, once an hour for the whole table. Never raises: the
    commit has happened."""
    checkpoint_after(store, planned_on)
    if needs_compaction(planned_on):
        compact_if_needed(store)
    if auto_vacuum_look_due(store.uri, planned_on):
        auto_vacuum_safely(store)


def checkpoint_after(store: QueueStore, planned_on: Snapshot) -> None:
    """After a commit planned on ``planned_on``: checkpoint when the new version is a
    multiple of the checkpoint interval. Never raises: the commit has happened."""
    version = checkpoint_due(planned_on)
    if version is not None:
        checkpoint_at(store, version)


def checkpoint_due(planned_on: Snapshot) -> int | None:
    """The version to checkpoint after a commit planned on ``planned_on`` (connector
    commits never rebase onto a winner, so the new one is the next), if it is a multiple of
    the checkpoint interval; else None."""
    before = planned_on.version
    interval = checkpoint_interval(dict(planned_on.configuration))
    return before + 1 if (before + 1) // interval > before // interval else None


def checkpoint_at(store: QueueStore, version: int) -> None:
    """:func:`checkpoint` ``version`` from ``store``'s table in this thread, moved on to it
    (:meth:`QueueStore.table_at`); or a later version, where that table has passed it (the
    upkeep thread's, after a compaction): any version may be checkpointed, and opening one
    apart would read the log since the last checkpoint once more. Never raises: the commit
    has happened."""
    try:
        if not checkpointed_from_copy(store.location, version):
            table = store.table_at(version, or_later=True)
            checkpoint(store.location, table.version(), table)
    except InvalidOptionError as error:  # a bad retention property: raised after the write
        log.warning(
            "log cleanup of %s skipped (the checkpoint was written): %s", store.location, error
        )
    except Exception as error:  # best effort, as Delta's own post-commit checkpoints
        log.warning(
            "checkpoint of %s failed, the next interval tries again: %s", store.location, error
        )


def checkpoint_if_crossed(
    location: Location, before: int, after: int, configuration: dict[str, str]
) -> int | None:
    """Checkpoint ``after`` if versions ``before`` (exclusive) to ``after`` passed a
    multiple of the checkpoint interval; returns the version checkpointed, if any."""
    interval = checkpoint_interval(configuration)
    if after // interval <= before // interval:
        return None
    return checkpoint(location, after)


def checkpoint(
    location: Location, version: int | None = None, table: DeltaTable | None = None
) -> int:
    """Write a Delta checkpoint of ``version`` (else the latest) with delta-rs, then clean
    up expired log files (:func:`cleanup_log`, by the table's log retention in time and in
    versions). Returns the version checkpointed.

    ``table``: a DeltaTable of ``location`` already at ``version``, else one is opened.
    delta-rs replays the log afresh for the checkpoint whatever table it is given; one in
    hand spares reading it once more. Without one, a ``version`` on an object store is
    checkpointed from a copy of its log (:func:`checkpoint_from_copy`), each file read
    once."""
    if table is None and version is not None and checkpointed_from_copy(location, version):
        return version
    if table is None:
        table = location.delta_table(version)
    table.create_checkpoint()
    clean_up_by_retention(location, table.metadata().configuration)
    return table.version()


def checkpointed_from_copy(location: Location, version: int) -> bool:
    """:func:`checkpoint_from_copy` of ``version``, then the log cleaned up as after any
    checkpoint; False, with nothing done, where the copy cannot build it."""
    configuration = checkpoint_from_copy(location, version)
    if configuration is None:
        return False
    clean_up_by_retention(location, configuration)
    return True


def clean_up_by_retention(location: Location, configuration: dict[str, str]) -> None:
    """:func:`cleanup_log` by the table's log retention in time and in versions, unless
    ``delta.enableExpiredLogCleanup`` is false."""
    if configuration.get("delta.enableExpiredLogCleanup", "true").lower() != "false":
        cleanup_log(
            location,
            interval_hours(
                "delta.logRetentionDuration",
                configuration.get("delta.logRetentionDuration"),
                LOG_RETENTION_HOURS,
            ),
            max_versions=log_retention_versions(configuration),
        )


def cleanup_log(
    location: Location,
    retention_hours: float,
    now: float | None = None,
    *,
    max_versions: int | None = None,
    min_age_seconds: float = LOG_MIN_AGE_SECONDS,
) -> list[str]:
    """Delete log files that only versions past the log retention need; returns them.

    A commit is past the retention where it is older than ``retention_hours`` (by
    ``now``, this process's clock), or, with ``max_versions``, where it is ``max_versions``
    or more versions behind the newest commit (whichever comes first, as Kafka's retention
    by time and by size); either way only where it is ``min_age_seconds`` older than the
    newest commit by the store's own clock (the times it gave the files). That floor lets a
    writer trust, for a moment, that the version it knows is the latest
    (:mod:`spark_queue.storage.table_view`): no clock of another host enters it.

    Delta's rule (delta PR #4146) then applies: the *cutoff commit* is the newest commit
    past the retention; everything from the newest checkpoint at or before it is kept, so
    every version after the cutoff can still be read (time travel), and the newest
    checkpoint always survives. delta-rs's ``cleanup_metadata`` is not used: it cuts at the
    latest checkpoint by file age alone and can leave a version inside the retention
    without the checkpoint it is built from (delta-rs #3692, delta #606).
    """
    fs, base = location.filesystem()
    log_dir = f"{base.rstrip('/')}/_delta_log"
    now = time.time() if now is None else now
    cutoff = now - retention_hours * 3600
    commits: dict[int, float] = {}
    checkpoints: set[int] = set()
    entries: list[tuple[int, str]] = []
    for info in fs.get_file_info(pafs.FileSelector(log_dir)):
        name = info.base_name
        head = name.split(".", 1)[0]
        if not head.isdigit() or len(head) != 20:
            continue  # _last_checkpoint, temporary files, other tools' files
        version = int(head)
        entries.append((version, info.path))
        if name.endswith(".json") and name.count(".") == 1:
            commits[version] = info.mtime.timestamp() if info.mtime else now
        elif ".checkpoint." in name and name.endswith(".parquet"):
            checkpoints.add(version)
    if not commits:
        return []
    behind = max(commits) - max_versions if max_versions is not None else -1
    floor = max(commits.values()) - min_age_seconds
    old = [v for v, mtime in commits.items() if (mtime < cutoff or v <= behind) and mtime <= floor]
    if not old:
        return []
    keep_from = max((c for c in checkpoints if c <= max(old)), default=None)
    if keep_from is None:
        return []
    # Oldest first, stopping at the first failure: the entries gone are always all those
    # below some version, which is what makes a reader's probe of the log sound
    # (QueueStore.is_latest). Missing files are fine: another cleanup got there first.
    removed = [path for version, path in sorted(entries) if version < keep_from]
    gone = location.delete((path[len(base.rstrip("/")) + 1 :] for path in removed), in_order=True)
    return [path.rsplit("/", 1)[-1] for path in removed[:gone]]


# -- vacuum ----------------------------------------------------------------------------------


def retention_floor(configuration: dict[str, str]) -> float:
    """Hours below which vacuum needs ``force``: the table's
    ``delta.deletedFileRetentionDuration`` (Delta's default of 7 days where unset), but
    never below :data:`MIN_RETENTION_HOURS`."""
    hours = interval_hours(
        "delta.deletedFileRetentionDuration",
        configuration.get("delta.deletedFileRetentionDuration"),
        FILE_RETENTION_HOURS,
    )
    return max(hours, MIN_RETENTION_HOURS)


def check_retention(retention_hours: Any, floor: float, force: bool) -> float:
    """The retention to vacuum with, or :class:`InvalidOptionError` naming the argument.

    - Below ``floor`` (the table's ``delta.deletedFileRetentionDuration``) needs ``force``:
      a reader of an older version (time travel, a Spark batch read of ``format("delta")``,
      a browse read planned before a compaction) may still be reading those files, and
      Delta's own VACUUM refuses the same.
    - Below :data:`MIN_RETENTION_HOURS` is refused even with ``force``: the connector's own
      producers and consumers read files of the version they planned on (a commit reads the
      head rows it evicts, a consumer's tasks read the files its batch was planned on, a
      compaction reads what it rewrites), and a compaction may remove those files from the
      current version in the meantime. An hour bounds that window with a wide margin.
    """
    if isinstance(retention_hours, bool) or not isinstance(retention_hours, int | float):
        raise InvalidOptionError(
            f"retention_hours (--retention-hours) must be a number of hours, "
            f"got {retention_hours!r}"
        )
    hours = float(retention_hours)
    if not hours >= 0 or hours == float("inf"):
        raise InvalidOptionError(
            f"retention_hours (--retention-hours) must be a number >= 0, got {retention_hours!r}"
        )
    if hours > MAX_RETENTION_HOURS:
        raise InvalidOptionError(
            f"retention_hours (--retention-hours) must be at most {MAX_RETENTION_HOURS} hours "
            f"({MAX_DURATION_DAYS} days), got {retention_hours!r}"
        )
    if hours < MIN_RETENTION_HOURS:
        raise InvalidOptionError(
            f"retention_hours (--retention-hours) {hours:g} is below {MIN_RETENTION_HOURS:g} "
            "hour, which even force does not allow: running producers and consumers read "
            "files of the version they planned on, and a compaction may have removed those "
            "from the current version meanwhile"
        )
    if hours < floor and not force:
        raise InvalidOptionError(
            f"retention_hours (--retention-hours) {hours:g} is below the safe floor of "
            f"{floor:g} hours "
            "(the table's delta.deletedFileRetentionDuration): readers of older versions (time "
            "travel, Spark reads in progress) could lose files they still read; pass force=True "
            "(--force) if none can be running"
        )
    return hours


def vacuum(
    location: Location,
    retention_hours: float,
    dry_run: bool,
    force: bool,
    progress: Progress = no_progress,
) -> list[str]:
    """Delete the table's files that no current version references, unreferenced for the
    retention (checked by :func:`check_retention`); returns them (relative paths), sorted.

    Only the table's files: those the log once referenced (added, then removed) and those
    spark-queue wrote (:func:`~spark_queue.storage.files.is_own_file`: staged files no
    commit published, a killed producer's, and removed files whose removal a checkpoint has
    since dropped). Nothing else in the folder (a user's file, another tool's) is ever
    deleted, whatever its age. delta-rs's vacuum takes no filter: its *full* vacuum deletes
    every file of the folder no version references, so it runs only where what it would
    delete has been checked (docs/decisions/vacuum-own-files-only.md):

    - **Below the floor** (forced): delta-rs's *lite* vacuum, which deletes removed files
      only (the log's, so the table's). A file no commit mentions may be a running
      producer's staged file, and only the floor protects those.
    - **At or above the floor**, removed files and files no version references, older than
      the retention (:func:`_full_vacuum`).

    Raises:
        InvalidOptionError: the retention (:func:`check_retention`).
        StorageError: files that could not be deleted (the others are gone), how many and
            the first, for the next vacuum to try again.
    """
    progress(f"vacuum {location}: reading the log")
    table = location.delta_table()
    before = table.version()
    configuration = table.metadata().configuration
    floor = retention_floor(configuration)
    hours = check_retention(retention_hours, floor, force)
    full = hours >= floor
    progress(
        f"vacuum {location}: listing files unreferenced for {hours:g} h "
        f"({'removed and never committed' if full else 'removed only'})"
    )
    whole = int(-(-hours // 1))  # delta-rs takes whole hours: round up, never delete younger
    if full:
        files = _full_vacuum(location, table, whole, dry_run)
    else:
        files = _delta_rs_vacuum(table, whole, dry_run, full=False)
    progress(f"vacuum {location}: {len(files)} files {'to remove' if dry_run else 'removed'}")
    after = location.delta_table().version() if files and not dry_run else before
    if after > before:  # delta-rs logged VACUUM START and END: two versions
        try:
            checkpoint_if_crossed(location, before, after, configuration)
        except Exception as error:  # the files are gone either way
            log.warning(
                "checkpoint of %s failed, the next interval tries again: %s", location, error
            )
    return sorted(files)


def _full_vacuum(location: Location, table: DeltaTable, hours: int, dry_run: bool) -> list[str]:
    """The files of :func:`vacuum` at or above the floor: of delta-rs's full listing, the
    table's (:func:`_the_tables`), deleted here :data:`VACUUM_DELETE_THREADS` at a time.

    On an object store, where that would be a request a file, delta-rs deletes them itself
    in bulk (1,000 a request) where nothing but the table's files can be in its plan: where
    a listing with an hour less than the retention holds only the table's files. What
    delta-rs then deletes at the retention, moments later, was in that listing: an object's
    time is the store's, so no object older than the retention can appear meanwhile, and
    the snapshot is the same (docs/decisions/vacuum-own-files-only.md).
    """
    started = time.monotonic()
    if location.scheme in OBJECT_STORE_SCHEMES:
        listed, theirs = _the_tables(table, hours - 1)
        if len(theirs) == len(listed) and (time.monotonic() - started < BULK_VACUUM_WINDOW_SECONDS):
            return _delta_rs_vacuum(table, hours, dry_run, full=True)
    listed, files = _the_tables(table, hours)
    if not dry_run and files:
        failed = location.delete_each(files, VACUUM_DELETE_THREADS)
        if failed:
            path, error = next(iter(failed.items()))
            raise StorageError(
                f"vacuum of {location} deleted {len(files) - len(failed)} files but could not "
                f"delete {len(failed)}, the next vacuum tries again; {path}: {error}"
            )
    return files


def _the_tables(table: DeltaTable, hours: int) -> tuple[list[str], list[str]]:
    """delta-rs's full listing at ``hours``, and the table's files of it: those named as
    spark-queue names its files, and the others that its lite listing (removed files only)
    names too, a second listing made only where the first found such a file."""
    listed = _delta_rs_vacuum(table, hours, dry_run=True, full=True)
    theirs = [path for path in listed if is_own_file(path)]
    others = [path for path in listed if not is_own_file(path)]
    if others:
        removed = set(_delta_rs_vacuum(table, hours, dry_run=True, full=False))
        theirs += [path for path in others if path in removed]
    return listed, theirs


def _delta_rs_vacuum(table: DeltaTable, hours: int, dry_run: bool, *, full: bool) -> list[str]:
    """delta-rs's vacuum of ``table`` (its snapshot as opened) at ``hours``; the files it
    deleted, or with ``dry_run`` would delete. Its post-commit checkpoint is left to
    :func:`vacuum`, which checkpoints at the table's interval."""
    from deltalake import PostCommitHookProperties

    files: list[str] = table.vacuum(
        retention_hours=hours,
        dry_run=dry_run,
        enforce_retention_duration=False,
        full=full,
        post_commithook_properties=PostCommitHookProperties(
            create_checkpoint=False, cleanup_expired_logs=False
        ),
    )
    return files


# -- automatic vacuum --------------------------------------------------------------------------


def auto_vacuum_hours(configuration: dict[str, str]) -> float | None:
    """The retention of the table's automatic vacuum (``spark_queue.autoVacuumHours``), or
    None where the table does not set it.

    Raises:
        InvalidOptionError: naming the property, where its value is not a number of hours
            at or above the table's floor (:func:`retention_floor`): an automatic vacuum is
            never forced.
    """
    text = configuration.get(AUTO_VACUUM_KEY)
    if text is None:
        return None
    floor = retention_floor(configuration)
    try:
        hours = float(text)
    except ValueError:
        hours = float("nan")
    if not floor <= hours <= MAX_RETENTION_HOURS:
        raise InvalidOptionError(
            f"the table property {AUTO_VACUUM_KEY}={text!r} must be a number of hours >= "
            f"{floor:g} (the table's delta.deletedFileRetentionDuration, never below "
            f"{MIN_RETENTION_HOURS:g}) and at most {MAX_RETENTION_HOURS}; no automatic vacuum "
            "runs until it is"
        )
    return hours


def auto_vacuum_look_due(uri: str, planned_on: Snapshot) -> bool:
    """Whether a commit planned on ``planned_on`` should look at the table's automatic
    vacuum: the table sets ``spark_queue.autoVacuumHours``, this process has not looked in
    the last :data:`AUTO_VACUUM_LOOK_SECONDS`, and that version holds no claim of this
    hour. Free where the table does not ask; else the claim's read (~0.7 ms, delta-rs scans
    the version's application transactions) once a minute per process. Never raises: the
    commit has happened."""
    if AUTO_VACUUM_KEY not in planned_on.configuration:
        return False
    now = time.monotonic()
    with _next_vacuum_look_lock:
        if now < _next_vacuum_look.get(uri, -float("inf")):
            return False
        _next_vacuum_look[uri] = now + AUTO_VACUUM_LOOK_SECONDS
    try:
        claimed = planned_on.transaction_version(AUTO_VACUUM_APP_ID)
    except Exception:  # the next look tries again
        return False
    return claimed is None or claimed < time.time() // AUTO_VACUUM_PERIOD_SECONDS


def auto_vacuum(store: QueueStore, now: float | None = None) -> list[str] | None:
    """Vacuum the table with its ``spark_queue.autoVacuumHours``, where it sets one and no
    process has vacuumed it this hour; returns the files deleted, or None where it did not
    run.

    The hour is claimed with a commit of the application transaction
    :data:`AUTO_VACUUM_APP_ID` at the hour's number (a commit of no files, which Delta keeps
    in every checkpoint): of processes that claim at once, one commit lands and the others
    see the claim when they try again. A claim that keeps losing to other writers is left
    for the next check.

    Raises:
        InvalidOptionError: the property's value (:func:`auto_vacuum_hours`).
    """
    from deltalake.exceptions import CommitFailedError

    hour = int((time.time() if now is None else now) // AUTO_VACUUM_PERIOD_SECONDS)
    for attempt in range(AUTO_VACUUM_CLAIMS):
        snapshot = store.snapshot(with_states=False)
        if snapshot is None:
            return None
        hours = auto_vacuum_hours(dict(snapshot.configuration))
        claimed = snapshot.transaction_version(AUTO_VACUUM_APP_ID)
        if hours is None or (claimed is not None and claimed >= hour):
            return None
        try:
            store.commit(
                snapshot,
                [],
                [],
                app_id=AUTO_VACUUM_APP_ID,
                app_version=hour,
                summary=CommitSummary.of(CommitOperation.VACUUM_CLAIM.on(), queues=[]),
            )
        except CommitFailedError:
            time.sleep(backoff(attempt + 2))
            continue
        return vacuum(store.location, hours, dry_run=False, force=False)
    return None


def auto_vacuum_safely(store: QueueStore) -> None:
    """:func:`auto_vacuum` after a connector commit: never raises (the commit has
    happened); a bad property or a failure is logged."""
    try:
        removed = auto_vacuum(store)
    except Exception as error:  # best effort, as the rest of the upkeep
        log.warning("automatic vacuum of %s did not run: %s", store.location, error)
        return
    if removed is not None:
        log.info("automatic vacuum of %s deleted %d files", store.location, len(removed))
