"""Compaction, run by spark-queue itself: never a Spark OPTIMIZE on a live queue table.

Every micro-batch adds small files (messages per task and queue, removal rows, state). Left
alone, every commit and every read would pay for all of them. Compaction, like Delta's
auto-compaction, runs right after a connector commit once a queue has ``SMALL_FILE_LIMIT``
small files, and on demand (:meth:`spark_queue.QueueTable.compact`):

- a message file whose rows have all left the queue is removed without being read;
- the other small message files of the queue are rewritten as one file in ``seq`` order,
  keeping only live rows (so evicted bodies leave the table's current version);
- small removal files are merged.

It is a commit of its own with ``max_commit_retries=0``: if a producer commits first, the
compaction is dropped and tried after a later commit, and a producer that loses to it plans
its batch again. No row that is live, and no counter, changes.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.core import QueueState, below_heads
from spark_queue.store import (
    MESSAGE,
    REMOVAL,
    QueueStore,
    Snapshot,
    StagedFile,
    delete_files,
    write_file,
)

SMALL_FILE_BYTES = 32 * 1024 * 1024
SMALL_FILE_LIMIT = 32  # small files of one queue (or removal files) that trigger compaction


def _live_mask(rows: pa.Table, state: QueueState) -> pa.Array:
    """Rows of ``state``'s queue that are still live (SEMANTICS: ready or scheduled)."""
    seqs = rows["seq"]
    priorities = rows["priority"].fill_null(0)
    heads = {p: level.head for p, level in state.levels.items()}
    head_of_row = pa.array(
        [heads.get(p, np.iinfo(np.int64).max) for p in priorities.to_pylist()], pa.int64()
    )
    live = pc.greater_equal(seqs, head_of_row)
    if state.holes:
        live = pc.and_(live, pc.invert(pc.is_in(seqs, pa.array(sorted(state.holes), pa.int64()))))
    below = below_heads(state)
    if len(below):
        live = pc.or_(live, pc.is_in(seqs, pa.array(below, pa.int64())))
    return live


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


def compact(store: QueueStore, snapshot: Snapshot) -> dict[str, int]:
    """Compact the table at ``snapshot``; returns file counts. Raises on a lost race."""
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
        parts = [store.read_file(p) for p in small["path"].to_pylist()]
        rows = pa.concat_tables(parts)
        rows = rows.filter(_live_mask(rows, state)).sort_by("seq")
        if rows.num_rows:
            adds.append(write_file(store.uri, MESSAGE, rows, tag="compacted-"))
        for path, size in zip(small["path"].to_pylist(), small["size"].to_pylist(), strict=True):
            removes.append((path, size, MESSAGE))
            rewritten += 1
    removal = files.filter(
        pc.and_(pc.equal(files["record"], REMOVAL), pc.less(files["size"], SMALL_FILE_BYTES))
    )
    if removal.num_rows >= 2:
        rows = pa.concat_tables([store.read_file(p) for p in removal["path"].to_pylist()])
        adds.append(
            write_file(
                store.uri, REMOVAL, rows.sort_by([("queue", "ascending"), ("seq", "ascending")])
            )
        )
        removes += [
            (path, size, REMOVAL)
            for path, size in zip(
                removal["path"].to_pylist(), removal["size"].to_pylist(), strict=True
            )
        ]
    if not removes:
        return {"dropped": 0, "rewritten": 0, "written": 0}
    try:
        store.commit(
            snapshot.table,
            adds,
            removes,
            operation={"operation": "COMPACT", "dropped": dropped, "rewritten": rewritten},
        )
    except BaseException:
        delete_files(store.uri, [f.path for f in adds])
        raise
    return {"dropped": dropped, "rewritten": rewritten, "written": len(adds)}


def compact_if_needed(store: QueueStore) -> None:
    """Auto-compaction after a connector commit; a lost race is left for a later commit."""
    from deltalake.exceptions import CommitFailedError

    snapshot = store.snapshot()
    if snapshot is None or not needs_compaction(snapshot):
        return
    with contextlib.suppress(CommitFailedError):
        compact(store, snapshot)
