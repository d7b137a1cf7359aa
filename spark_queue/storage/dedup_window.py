"""The de-duplication window of a queue as stored in its table (SEMANTICS §2
"De-duplication"): ``seen`` files hold the ids each enqueue commit recorded (``queue``,
``seq`` of the message, ``body``: the id's 128-bit digest, 16 bytes, and ``event_at``).
Digests rather than the ids: a million of them are written and read back with no work per
id, where the ids themselves cost a producer a third of its publish. They are appended,
never rewritten, and a commit removes the files of a queue that fell wholly out of its
window, so what is stored is bounded by the window.

A process keeps each queue's window in memory as hashes (:class:`spark_queue.rules.SeenIds`),
keyed by the files it has read: a commit reads only the ``seen`` files it has not met (other
writers'), and a process's own commit hands its hashes over instead of reading them back.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.model.schema import UTC_MICROS
from spark_queue.rules import SeenIds, SeenRun
from spark_queue.storage.files import SEEN, record_rows
from spark_queue.storage.state_rows import repeated
from spark_queue.storage.store import QueueStore, Snapshot


@dataclass
class _Window:
    ids: SeenIds = field(default_factory=SeenIds)
    files: set[str] = field(default_factory=set)  # seen files whose ids are in ``ids``


_windows: dict[tuple[str, str], _Window] = {}
_lock = threading.Lock()


def window(store: QueueStore, snapshot: Snapshot, queue: str, since: int) -> SeenIds:
    """``queue``'s recorded ids as of ``snapshot`` (and any this process committed since),
    reading the ``seen`` files this process has not read yet."""
    files = snapshot.seen_files(queue)
    paths = files["path"].to_pylist()
    sizes = dict(zip(paths, files["size"].to_pylist(), strict=True))
    with _lock:
        known = _windows.get((store.uri, queue), _Window())
    unread = [path for path in paths if path not in known.files]
    ids = known.ids
    for path in unread:
        rows = store.read_rows(path, ["body", "event_at"], size=sizes[path])
        seen_at = rows["event_at"].cast(pa.int64()).fill_null(0).to_numpy()
        ids = ids.with_run(SeenRun.of_digests(rows["body"], seen_at), since)
    current = known.files.intersection(paths) | set(unread)
    with _lock:
        _windows[(store.uri, queue)] = _Window(ids, current)
    return ids


def remember(store: QueueStore, queue: str, path: str, run: SeenRun, since: int) -> None:
    """A committed ``seen`` file of this process: its hashes join the window unread."""
    with _lock:
        known = _windows.get((store.uri, queue), _Window())
        _windows[(store.uri, queue)] = _Window(known.ids.with_run(run, since), known.files | {path})


def expired_files(snapshot: Snapshot, queue: str, since: int) -> list[tuple[str, int, str]]:
    """``queue``'s ``seen`` files written before ``since`` (microseconds): every id in them
    was recorded earlier, so they hold nothing of the window. As (path, size, record)."""
    files = snapshot.seen_files(queue)
    old = files.filter(pc.less(files["modified"], since // 1000))
    return [
        (path, size, SEEN)
        for path, size in zip(old["path"].to_pylist(), old["size"].to_pylist(), strict=True)
    ]


def seen_rows(queue: str, run: SeenRun, seqs: np.ndarray, now: int) -> pa.Table:
    """The rows of a ``seen`` file: the ids one commit recorded for ``queue`` (``run``, and
    the seqs of their messages in the same order)."""
    count = len(run)
    return record_rows(
        {
            "queue": repeated(queue, count, pa.string()),
            "seq": pa.array(seqs, pa.int64()),
            "body": run.digests(),
            "event_at": repeated(now, count, pa.int64()).cast(UTC_MICROS),
        }
    )


def forget() -> None:
    """Drop every window this process holds in memory (the next commit reads them back from
    the table): frees the memory of queues a long-lived process no longer writes."""
    with _lock:
        _windows.clear()
