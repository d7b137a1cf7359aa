"""A read task's Python worker: its long-lived objects left out of PySpark's collections.

PySpark's daemon runs ``gc.collect()`` in a reused Python worker after every task, a full
collection over every object the worker tracks: about 83,000 once a read task has run
(PySpark, pyarrow, the pandas that pyarrow imports, spark-queue). On two busy cores that
collection took 50-240 ms after each task, while the next task waited for the worker, and
a batch of a queue of 8 partitions has 8 read tasks where one table's has one
(docs/decisions/read-tasks-freeze-imports.md). Those objects are the modules, classes and
caches the worker keeps for its life, so :func:`freeze_long_lived` moves them to the
permanent generation (:func:`gc.freeze`): later collections traverse only what the tasks
made since.
"""

from __future__ import annotations

import gc
import sys

from pyspark import TaskContext

_modules_frozen = 0  # how many modules this process had imported at its last freeze


def freeze_long_lived() -> None:
    """At the start of a read task, in a PySpark task's worker only: where modules were
    imported since the last freeze (the worker's first task, or one that imported more),
    collect what is garbage now, then freeze every object that remains. A task's own
    objects are frozen with them only then, a few times in a worker's life; everything
    frozen is still freed when nothing refers to it, and only a cycle among frozen objects
    would outlive its use."""
    global _modules_frozen
    if TaskContext.get() is None:  # not a task: the driver's source runner, a direct call
        return
    if len(sys.modules) == _modules_frozen:
        return
    gc.collect()
    gc.freeze()
    _modules_frozen = len(sys.modules)
