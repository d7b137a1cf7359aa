"""How a Spark write numbers its rows: task after task, in lanes of a recorded width.

A write's tasks run at once and none knows the others' row counts, nor how many tasks there
are; only the driver's commit learns both. So each task numbers its rows in a **lane** of
its own, ``S`` seqs wide: task ``t``'s row ``r`` takes offset ``t * S + r`` from the write's
base (the table's next seq), which keeps the write's arrival order task by task, as Spark
gives a ``df.orderBy(...)``'s rows. The table's next seq after the commit is the highest
seq used, plus one, so a write uses about ``(tasks - 1) * S`` seqs plus its last task's
rows.

The width ``S`` is the table's: every sink commit records it as the version of the
application transaction :data:`WIDTH_APP` (:func:`next_width`: a power of two at least four
times the most rows one task of the write gave the table, never below the width before nor
below :data:`MIN_WIDTH`, never above :data:`FIRST_WIDTH`), and the next write's planning
reads it. A table no Spark write has recorded one in numbers ``FIRST_WIDTH`` (``2**32``)
rows a task apart.

A task given more rows than ``S`` (more than four times the largest task of every write
before) numbers the rest in an **overflow** region above every lane: row ``r >= S`` of task
``t`` takes offset ``MAX_TASKS * S + t * OVERFLOW_ROWS + (r - S)``. Nothing collides; in
that write, that task's rows past ``S`` follow every other task's lane, task by task. Since
the width never shrinks and then grows at least fourfold, a table overflows at most ten
times in its life (``2**12`` to ``2**32``).
"""

from __future__ import annotations

import numpy as np

from spark_queue.errors import QueueError

WIDTH_APP = "spark-queue-sink-lane-width"
"""The application transaction whose version is a table's lane width (:func:`next_width`),
which the next Spark write to it numbers its rows by."""
FIRST_WIDTH = 1 << 32
"""The lane width of a table no Spark write recorded one in: the widest."""
MIN_WIDTH = 1 << 12
"""The narrowest lane width a commit records."""
HEADROOM = 4
"""A recorded width holds this many times the rows of the write's largest task."""
MAX_TASKS = 1 << 20
"""The most tasks a write has: the overflow region begins above their lanes."""
OVERFLOW_ROWS = 1 << 32
"""A task's room in the overflow region: the most rows past its lane it may number."""


def lane_offsets(task: int, width: int, first: int, count: int) -> np.ndarray:
    """The offsets, from the write's base, of task ``task``'s rows ``first`` to
    ``first + count - 1`` in lanes ``width`` wide: ascending, and disjoint from every other
    task's for the same width.

    Raises:
        QueueError: the task's index reaches :data:`MAX_TASKS`, or its rows past its lane
            :data:`OVERFLOW_ROWS` (nothing is committed).
    """
    if task >= MAX_TASKS:
        raise QueueError(
            f"a Spark write to a queue table has at most {MAX_TASKS} tasks, and this is task "
            f"{task}; write with fewer partitions (df.coalesce or df.repartition)"
        )
    if first + count - width > OVERFLOW_ROWS:
        raise QueueError(
            f"a task of a Spark write to a queue table numbers at most {width + OVERFLOW_ROWS} "
            f"rows (its lane's {width} and {OVERFLOW_ROWS} more), and this one has "
            f"{first + count}; write with more partitions (df.repartition)"
        )
    rows = np.arange(first, first + count, dtype=np.int64)
    return np.where(
        rows < width,
        task * width + rows,
        MAX_TASKS * width + task * OVERFLOW_ROWS + (rows - width),
    )


def next_width(recorded: int | None, largest: int) -> int:
    """The lane width a commit records: the least power of two holding :data:`HEADROOM`
    times ``largest`` (the most rows one task of the write gave the table), raised to the
    width ``recorded`` before (None: none, :data:`MIN_WIDTH`) and capped at
    :data:`FIRST_WIDTH`. It never shrinks, so a task overflows its lane only where it holds
    over four times the rows of every task of the table's writes before."""
    wanted = 1 << max(0, HEADROOM * largest - 1).bit_length()
    return min(FIRST_WIDTH, max(MIN_WIDTH, recorded or MIN_WIDTH, wanted))
