"""The table's present for a process that plans on commits other processes make: the sink's
reservation (its commit runs in another Python worker) and the streaming source's lease (a
producer adds what it leases). Such a process finds, as a rule, one commit it did not make,
and every read that takes it to the present is sent as soon as what it depends on is known.

**The log entries.** Where the view is known current within
:data:`~spark_queue.storage.table_view.TRUSTED_SECONDS`, the next entry is read alone: where
it is missing (an idle table) that one request is all. Where it is there, the entry after it
is read together with the queue state files and the message files it names. Known current
longer ago, a missing next entry may be one log cleanup deleted, so the entry the view moved
to must be looked at after it was found missing (:meth:`QueueStore._reach_present` says
why): the next two entries are read at once, then that look goes with the state and message
files. Either way one commit since costs two requests in a row.

**The message files.** Those the entries added that may hold the queue's rows, by their
statistics (a message file of another queue is not read), are read with the state, into
this process's row cache (:mod:`~spark_queue.storage.row_cache`): a small one whole, a large
one's footer. A lease then reads the head it planned from them without a request. Reads of
files this process already holds send nothing.
"""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from spark_queue.rules import QueueState
from spark_queue.storage.delta_log import parse_actions
from spark_queue.storage.files import MESSAGE, StagedFile
from spark_queue.storage.store import QueueStore, Snapshot
from spark_queue.storage.table_view import TableView

# Log entries, looks at an entry and message files, sent together with a state's reads
# (which go through the store's own pool).
_AHEAD = ThreadPoolExecutor(max_workers=8, thread_name_prefix="spark-queue-ahead")
READ_AHEAD_FILES = 4  # message files read with the state, at most (the lowest seqs first)


@dataclass
class StateReads:
    """The reads of one view's queue states and of the message files that may hold a
    queue's rows, sent together (:func:`start_reads`); :meth:`states` waits for them."""

    view: TableView
    found: dict[str, QueueState] | None = None
    error: Exception | None = None
    files: list[Future[None]] = field(default_factory=list)

    def states(self) -> dict[str, QueueState]:
        """The queue states, once the message files are read too (a lease reads them next:
        one still on its way would be read twice); raises what reading the states raised."""
        for read in self.files:
            read.result()
        if self.error is not None:
            raise self.error
        assert self.found is not None
        return self.found


def following(store: QueueStore, queue: str | None = None) -> Snapshot | None:
    """The table's latest version and its queue states (:meth:`QueueStore.snapshot`), read
    as the module says; ``queue``: the message files the entries read added that may hold
    its rows are read too. None where there is no table."""
    known = store.known.view
    if known is None:
        return store.snapshot()
    with store.storage_errors():
        reached = _reach(store, known, queue)
    # An entry only delta-rs reads, or one off the view's line, or log cleanup passed it.
    if reached is None:
        store.known.forget()
        return store.snapshot()
    view, asked, states = reached
    store.known.offer(view.current_from(asked))
    return Snapshot(view, view.files, states, view.state_files)


def _reach(
    store: QueueStore, known: TableView, queue: str | None
) -> tuple[TableView, float, dict[str, QueueState]] | None:
    """``known`` moved on to the present, when the missing entry was asked for, and its
    queue states; None where the table must be loaded afresh."""
    view = known
    added: list[StagedFile] = []  # message files of the entries read
    ahead = 1 if known.trusted(time.monotonic()) else 2
    reads: StateReads | None = None
    while True:
        asked = time.monotonic()
        entries = [_AHEAD.submit(store.entries.read, view.version + k) for k in range(1, ahead + 1)]
        # Past the view known: its states go with the next entries (used where none is there).
        reads = start_reads(store, view, added, queue) if view is not known else None
        moved = view
        for entry in entries:
            data = entry.result()
            if data is None:
                break
            actions = parse_actions(data.decode("utf-8"))
            if actions.rebuilds or not moved.precedes(actions.adds, actions.removes):
                return None
            moved = moved.moved_by(actions)
            added += [f for f in actions.adds if f.record == MESSAGE]
        else:
            view = moved
            continue
        view = moved
        break
    look = (
        None
        if view.trusted(time.monotonic())
        else _AHEAD.submit(store.entries.exists, view.version)
    )
    if reads is None or reads.view is not view:
        reads = start_reads(store, view, added, queue)
    try:
        states = reads.states()
    except Exception:
        if look is None or look.result():
            raise
    if look is not None and not look.result():
        return None
    return view, asked, states


def start_reads(
    store: QueueStore, view: TableView, added: list[StagedFile], queue: str | None
) -> StateReads:
    """Send the reads of ``view``'s queue states and of the message files in ``added`` that
    may hold ``queue``'s rows; the states are read in this thread, the files meanwhile."""
    reads = StateReads(view)
    if queue is not None:
        wanted = sorted((_min_seq(f), f.path, f.size) for f in added if _may_hold(f, queue))
        reads.files = [
            _AHEAD.submit(read_ahead, store, path, size)
            for _, path, size in wanted[:READ_AHEAD_FILES]
        ]
    try:
        reads.found = store.read_states(view.state_files)
    except Exception as error:  # raised where these states are the ones wanted
        reads.error = error
    return reads


def read_ahead(store: QueueStore, path: str, size: int) -> None:
    """The message file at ``path`` into this process's row cache (whole where it is small,
    else its footer). A read that fails is left to the reader that needs the file, which
    reads it again and raises."""
    with contextlib.suppress(Exception):
        _ = store.data_file(path, size).metadata


def _stats(file: StagedFile) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(file.stats or "{}")
    return found


def _may_hold(file: StagedFile, queue: str) -> bool:
    """Whether ``file``'s statistics allow rows of ``queue`` (none: anything)."""
    stats = _stats(file)
    low = stats.get("minValues", {}).get("queue")
    high = stats.get("maxValues", {}).get("queue")
    return (low is None or low <= queue) and (high is None or queue <= high)


def _min_seq(file: StagedFile) -> int:
    found: int = _stats(file).get("minValues", {}).get("seq", 0)
    return found
