"""What a read task leaves to PySpark's collection after it, without Spark: the source's
``read`` in a fresh interpreter, as a reused Python worker runs it (a frozen collector in
the test process would change every later test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

READ_IN_A_WORKER = """
import gc, json, sys
from pyspark import TaskContext
from pyspark.sql.streaming.datasource import ReadMaxRows
from spark_queue import QueueTable
from spark_queue.spark.options import parse_source_options
from spark_queue.spark.source import RingQueueStreamReader

path = sys.argv[1]
QueueTable(path, broker="off").publish("q", [b"x" * 100] * 50)
options = parse_source_options({"path": path, "queue": "q", "maxmessagespertrigger": "10"})
driver = RingQueueStreamReader(options)
start = driver.initialOffset()
tasks = []
for _ in range(5):
    end = driver.latestOffset(start, ReadMaxRows(10))
    tasks += driver.partitions(start, end)
    start = end
worker = RingQueueStreamReader(options)  # the executor's copy, as Spark makes it
outside = sum(batch.num_rows for batch in worker.read(tasks[0]))  # no task: nothing frozen
print(json.dumps({"rows": outside, "frozen": gc.get_freeze_count()}))
TaskContext._getOrCreate()  # as PySpark's worker sets one up for each task
seen = []
for number, task in enumerate(tasks):
    if number == 3:
        import wave  # a module the worker had not imported: the next task freezes it too
    gc.collect()  # as PySpark's daemon does before each task of a reused worker
    rows = sum(batch.num_rows for batch in worker.read(task))
    seen.append({"rows": rows, "frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())})
print(json.dumps(seen))
"""


def test_a_read_task_freezes_the_workers_long_lived_objects_once_per_import(tmp_path):
    """A read task moves what its worker keeps for its life (modules, classes) out of the
    collections PySpark runs after each task; a later task freezes again only where modules
    were imported since, so a task's own objects are not frozen task after task. A read
    outside a PySpark task (the driver's source runner, a direct call) freezes nothing."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", READ_IN_A_WORKER, str(tmp_path / "queues")],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    *_, outside_a_task, in_tasks = done.stdout.strip().splitlines()
    assert json.loads(outside_a_task) == {"rows": 10, "frozen": 0}  # a driver, a test
    tasks = json.loads(in_tasks)
    assert [task["rows"] for task in tasks] == [10] * 5
    first, *_, before_wave, after_wave, last = tasks
    # Tens of thousands of objects (PySpark, pyarrow, spark-queue) frozen; what a
    # collection still traverses is a small part of them.
    assert first["frozen"] > 20_000
    assert first["tracked"] < first["frozen"] / 4
    assert after_wave["frozen"] > before_wave["frozen"]  # ``wave`` and what it imported
    assert last["frozen"] <= after_wave["frozen"]  # nothing imported since: no freeze
