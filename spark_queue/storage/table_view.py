"""One version of a queue table as this process knows it, kept in memory between commits.

A :class:`TableView` is loaded once through delta-rs (the newest checkpoint and the log
entries since) and then moved on by spark-queue itself: by the actions of its own commits,
which it never reads back, and by the log entries of other writers' commits, read one by
one when a commit of its own is refused or a read checks for them
(:mod:`spark_queue.storage.delta_log`). Every :class:`~spark_queue.storage.store.QueueStore`
of a table in a process shares one :class:`KnownTable`: what one client committed or read,
the others know.

**How long a view is known to be the latest.** ``current_at`` is a ``time.monotonic()``
reading before which no log entry after the view's version was written. A request that
completes less than :data:`TRUSTED_SECONDS` after it and finds the next entry missing
(a read, or the conditional create of a commit) shows the view is the latest, in one
request: an entry written after ``current_at`` is younger than log cleanup's floor of
``LOG_MIN_AGE_SECONDS`` (10 s) measured on the store's own clock, against the newest entry
(:func:`spark_queue.commit.maintenance.cleanup_log`), so it cannot have been deleted yet.
Later, a missing next entry may be one cleanup deleted, and the view's own entry is
checked as well (cleanup deletes oldest first).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.model.schema import PARTITION
from spark_queue.storage.files import STATE_RECORDS, StagedFile
from spark_queue.storage.location import Location

if TYPE_CHECKING:  # deltalake is imported where a table is opened
    from deltalake import DeltaTable

    from spark_queue.rules import QueueState
    from spark_queue.storage.delta_log import EntryActions

# Seconds after ``current_at`` within which a missing next entry proves a view the latest:
# well below log cleanup's floor of 10 s, the rest a margin for a slow request and the
# store's clock.
TRUSTED_SECONDS = 2.0

# The columns of a view's file list: each one's column in delta-rs's flattened add actions,
# and its type.
_FILE_FIELDS = {
    "path": ("path", pa.string()),
    "size": ("size_bytes", pa.int64()),
    "modified": ("modification_time", pa.int64()),  # milliseconds
    "rows": ("num_records", pa.int64()),
    "record": (f"partition.{PARTITION}", pa.string()),
    "min_queue": ("min.queue", pa.string()),
    "max_queue": ("max.queue", pa.string()),
    "min_seq": ("min.seq", pa.int64()),
    "max_seq": ("max.seq", pa.int64()),
    "min_priority": ("min.priority", pa.int32()),
    "max_priority": ("max.priority", pa.int32()),
}
FILE_COLUMNS = pa.schema([(name, kind) for name, (_, kind) in _FILE_FIELDS.items()])


def flatten_files(table: DeltaTable) -> pa.Table:
    """The files of ``table``'s version as :data:`FILE_COLUMNS`."""
    raw = pa.table(table.get_add_actions(flatten=True))
    names = raw.column_names
    return pa.table(
        {
            name: raw.column(source).cast(kind) if source in names else pa.nulls(raw.num_rows, kind)
            for name, (source, kind) in _FILE_FIELDS.items()
        },
        schema=FILE_COLUMNS,
    ).combine_chunks()  # one chunk a column, as moved() keeps it


def staged_file_rows(staged: list[StagedFile], modified: list[int] | None = None) -> pa.Table:
    """Rows as :func:`flatten_files` makes them for files of a commit, their statistics
    from the JSON they are committed with; ``modified``: each one's time (milliseconds),
    else now."""
    stats = [json.loads(f.stats) for f in staged]
    now = int(time.time() * 1000)

    def bound(kind: str, column: str) -> list[Any]:
        return [s.get(kind, {}).get(column) for s in stats]

    return pa.table(
        {
            "path": [f.path for f in staged],
            "size": [f.size for f in staged],
            "modified": modified if modified is not None else [now] * len(staged),
            "rows": [f.rows for f in staged],
            "record": [f.record for f in staged],
            "min_queue": bound("minValues", "queue"),
            "max_queue": bound("maxValues", "queue"),
            "min_seq": bound("minValues", "seq"),
            "max_seq": bound("maxValues", "seq"),
            "min_priority": bound("minValues", "priority"),
            "max_priority": bound("maxValues", "priority"),
        },
        schema=FILE_COLUMNS,
    )


@dataclass(frozen=True)
class TableView:
    """One version of the table: its files, application transactions and configuration.
    Immutable: moving on makes a new view. ``base`` is the delta-rs table it was loaded
    from (never moved on), which answers for application transactions no later entry
    set."""

    version: int
    files: pa.Table  # FILE_COLUMNS
    base: DeltaTable
    configuration: Mapping[str, str]
    current_at: float  # see the module
    transactions: Mapping[str, int] = field(default_factory=dict)  # set after base's version
    cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, table: DeltaTable, current_at: float) -> TableView:
        return cls(
            table.version(),
            flatten_files(table),
            table,
            dict(table.metadata().configuration),
            current_at,
        )

    def transaction_version(self, app_id: str) -> int | None:
        """The last version of application transaction ``app_id``, or None."""
        if app_id in self.transactions:
            return self.transactions[app_id]
        found: int | None = self.base.transaction_version(app_id)
        return found

    @property
    def state_files(self) -> list[tuple[str, int, str]]:
        """The files of the queue states: path, size, record."""
        listed = self.cache.get("state_files")
        if listed is None:
            state = self.files.filter(pc.is_in(self.files["record"], pa.array(STATE_RECORDS)))
            listed = self.cache["state_files"] = list(
                zip(
                    state["path"].to_pylist(),
                    state["size"].to_pylist(),
                    state["record"].to_pylist(),
                    strict=True,
                )
            )
        return list(listed)

    def precedes(self, adds: list[StagedFile], removes: set[str]) -> bool:
        """Whether a log entry adding ``adds`` and removing ``removes`` can follow this
        version. A commit that writes queue states removes every state file of the version
        it was planned on: one that leaves some of this view's in place was planned on
        another, and this view is off the log's line (a commit of this process landed in
        the log's past, where a cleanup ran faster than its floor). Moved on by it, the view
        would join two commits' queue states."""
        if not any(f.record in STATE_RECORDS for f in adds):
            return True
        return all(path in removes for path, _, _ in self.state_files)

    def trusted(self, now: float) -> bool:
        """Whether a missing next entry, found by a request completed at ``now``, proves
        this view the latest (see the module)."""
        return now - self.current_at < TRUSTED_SECONDS

    def moved(
        self,
        adds: list[StagedFile],
        removes: Iterable[str],
        transactions: Mapping[str, int],
        *,
        modified: list[int] | None = None,
        current_at: float | None = None,
    ) -> TableView:
        """The next version: this one with a commit's files and transactions."""
        removed = set(removes)
        files = self.files
        if removed:
            files = files.filter(pc.invert(pc.is_in(files["path"], pa.array(list(removed)))))
        if adds:
            # One chunk a column: every commit adds one, and a filter over a table of many
            # chunks costs ~20 us a chunk (~1 ms a commit after 40 commits), over one ~40 us.
            files = pa.concat_tables([files, staged_file_rows(adds, modified)]).combine_chunks()
        cache: dict[str, Any] = {}
        listed = self.cache.get("state_files")
        if listed is not None:  # moved on as the files are, not filtered from them again
            cache["state_files"] = [entry for entry in listed if entry[0] not in removed] + [
                (f.path, f.size, f.record) for f in adds if f.record in STATE_RECORDS
            ]
        return replace(
            self,
            version=self.version + 1,
            files=files,
            transactions={**self.transactions, **transactions},
            current_at=self.current_at if current_at is None else current_at,
            cache=cache,
        )

    def moved_by(self, actions: EntryActions) -> TableView:
        """The next version: this one with the ``actions`` of its log entry."""
        return self.moved(
            actions.adds, actions.removes, actions.transactions, modified=actions.modified
        )

    def current_from(self, current_at: float) -> TableView:
        """The same version, known to be the latest from ``current_at`` on."""
        if current_at <= self.current_at:
            return self
        return replace(self, current_at=current_at)


class KnownTable:
    """What this process knows of one table: its newest view and the queue states of the
    state files it last wrote or read. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._view: TableView | None = None
        # The queue states of a set of state files. State files are new in every commit
        # that changes a state, so the same paths mean the same states.
        self._states: tuple[frozenset[str], dict[str, QueueState]] | None = None

    @property
    def view(self) -> TableView | None:
        with self._lock:
            return self._view

    def offer(self, view: TableView) -> TableView:
        """Keep ``view`` where it is newer than the one kept, or the same version known
        current later; returns the one kept."""
        with self._lock:
            kept = self._view
            if (
                kept is None
                or view.version > kept.version
                or (view.version == kept.version and view.current_at > kept.current_at)
            ):
                self._view = kept = view
            return kept

    def forget(self) -> None:
        """Forget the view (the next read loads the table afresh)."""
        with self._lock:
            self._view = None

    def states(self, paths: frozenset[str]) -> dict[str, QueueState] | None:
        with self._lock:
            known = self._states
        if known is None or known[0] != paths:
            return None
        return known[1]

    def remember_states(self, paths: frozenset[str], states: dict[str, QueueState]) -> None:
        with self._lock:
            self._states = (paths, states)


_known: dict[tuple[int, str, tuple[tuple[str, str], ...]], KnownTable] = {}
_known_lock = threading.Lock()


def forget() -> None:
    """Forget every table this process knows: its next read loads each afresh, as another
    process would (tests)."""
    with _known_lock:
        _known.clear()


def known_table(location: Location) -> KnownTable:
    """This process's :class:`KnownTable` of the table at ``location`` (by URI and
    options; a forked child starts with none)."""
    key = (os.getpid(), location.uri, tuple(sorted(location.options.items())))
    with _known_lock:
        found = _known.get(key)
        if found is None:
            found = _known[key] = KnownTable()
        return found


@dataclass(frozen=True)
class PreparedCommit:
    """A commit ready to publish (:meth:`~spark_queue.storage.store.QueueStore.prepare`):
    what it does, its log entry (None where delta-rs commits), and the table as it will be
    once it lands."""

    view: TableView  # planned on
    adds: list[StagedFile]
    removes: list[tuple[str, int, str]]
    transactions: dict[str, int]
    summary: str
    entry: bytes | None

    @functools.cached_property
    def landed(self) -> TableView:
        """The table once the commit lands: made when first asked for, so that a group
        commit makes it while the entry's request is on its way, not before sending it."""
        return self.view.moved(self.adds, [path for path, _, _ in self.removes], self.transactions)
