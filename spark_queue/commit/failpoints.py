"""Named crash points for the exactly-once tests.

A crash test must kill a query in one window of the protocol (after the lease commit, before
Spark's offset log, ...), every time, not when a timer happens to land there. The connector
names those windows with :func:`reached`; a process started with

    SPARK_QUEUE_CRASH_AT=<point>:<n>   SPARK_QUEUE_CRASH_DIR=<folder>

SIGKILLs every process of its session (the driver, the JVM, the Python workers) the ``n``-th
time any process of the application reaches ``<point>``. Hits are counted in
``<folder>/<point>`` (one byte appended per hit), so a point reached in the driver-side source
worker and one reached in a per-batch sink commit worker count alike. The test starts the
driver as a session leader (``start_new_session=True``) so the kill takes nothing else.

Without ``SPARK_QUEUE_CRASH_AT`` (always, outside crash tests) :func:`reached` is one dict
lookup. The points and the window each stands for are listed in docs/DESIGN.md
("Exactly-once, window by window").
"""

from __future__ import annotations

import os
import signal

CRASH_AT = "SPARK_QUEUE_CRASH_AT"
CRASH_DIR = "SPARK_QUEUE_CRASH_DIR"

POINTS = frozenset(
    {
        "source.latest-offset",  # latestOffset called: the previous batch is in the commit log
        "source.lease-planned",  # acks and the lease planned, not committed
        "source.lease-committed",  # lease committed to the table, offset not yet logged
        "source.partitions",  # offset logged, the batch not yet read or written
        "sink.staged",  # a task staged its files, nothing committed
        "sink.partition-committed",  # one table's share of a batch committed (of several)
        "sink.committed",  # enqueue committed to the table, Spark's commit log not written
        "commit.files-stored",  # a commit's files stored, its log entry not yet created
    }
)


def reached(point: str) -> None:
    """Crash here if this run's ``SPARK_QUEUE_CRASH_AT`` names ``point`` and its hit count."""
    spec = os.environ.get(CRASH_AT)
    if not spec:
        return
    name, _, count = spec.partition(":")
    if name not in POINTS:
        raise ValueError(f"{CRASH_AT} names {name!r}; failpoints: {sorted(POINTS)}")
    if name != point:
        return
    folder = os.environ[CRASH_DIR]
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, point), "ab") as hits:
        hits.write(b".")
        hits.flush()
        seen = hits.tell()
    if seen == int(count or 1):
        _kill_session()


def _kill_session() -> None:
    """SIGKILL every process of this session (the PySpark daemon and its workers run in a
    process group of their own, so the driver's group alone would leave them)."""
    session = os.getsid(0)
    others = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.getsid(int(entry)) == session:
                    others.append(int(entry))
            except OSError:  # gone meanwhile
                continue
    for pid in others:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    os.kill(os.getpid(), signal.SIGKILL)
