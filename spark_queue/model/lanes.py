"""How a Spark write numbers its rows: each task in a lane of its own, interleaved.

A write's tasks run at once and none knows the others' row counts, nor how many tasks there
are; only the driver's commit learns both. So the tasks number their rows in **lanes**: a
task's rows are an arithmetic progression of seqs, ``base + first + step * row``
(:func:`lane`), disjoint from every other task's for any number of tasks, and the table's
next seq after the commit is the highest seq used, plus one. How many seqs a write uses
therefore grows with its rows, not with a stride reserved per task.

The lanes are laid out by a **width** ``W``, the write's guess of its task count: the
number of tasks of the last Spark write to the table, which each sink commit records as
the version of the application transaction :data:`TASKS_APP`. Tasks ``0 .. W-1`` take the
even offsets, ``W`` lanes side by side (``2 * (row * W + task)``): a write of ``W`` tasks of
``R`` rows each uses about ``2 * W * R`` seqs, twice its rows. Tasks beyond the guess take
the odd offsets, level by level: level ``j`` holds ``2**j * W`` tasks, at the offsets whose
lowest ``j`` bits are ones and bit ``j`` is zero, so any number of tasks fits and a guess
too low costs seqs (a task at level ``j`` steps ``2**(2j+1) * W``), never a collision.
"""

from __future__ import annotations

TASKS_APP = "spark-queue-sink-tasks"
"""The application transaction whose version is the task count of the last Spark write to
a table: the next write's lane width (:func:`lane`)."""


def lane(task: int, width: int) -> tuple[int, int]:
    """Task ``task``'s lane in a write laid out ``width`` lanes wide: ``(first, step)``, its
    ``row``-th row taking offset ``first + step * row`` from the write's base.

    Level ``j`` holds tasks ``(2**j - 1) * width`` to ``(2**(j+1) - 1) * width - 1``, in
    ``2**j * width`` lanes at the offsets ending in ``j`` one bits, then a zero bit: the
    level's lane ``q``, row ``r``, is offset ``2**j - 1 + 2**(j+1) * (r * 2**j * width + q)``.
    """
    width = max(1, width)
    level = (task // width + 1).bit_length() - 1
    lanes = width << level
    within = task - ((1 << level) - 1) * width
    spacing = 1 << (level + 1)
    return (1 << level) - 1 + spacing * within, spacing * lanes
