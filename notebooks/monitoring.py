# Databricks notebook source
# MAGIC %md
# MAGIC # spark-queue monitoring: depth and loss over time
# MAGIC
# MAGIC Every commit to a queue table writes each queue's state (gauges and counters), so the
# MAGIC table's Delta history is a time series of every queue: `QueueTable.history()` reads it
# MAGIC from the Delta log, one row per queue and commit, without Spark. This notebook charts
# MAGIC it: depth (`ready`, `leased`, `scheduled`) and what the queue lost (`replaced`,
# MAGIC `dropped`, `expired`, `killed`, `dead_lettered`, `rejected`).
# MAGIC
# MAGIC Point the `queue_table` widget at a queue table (and optionally `queue` at one queue).
# MAGIC Where no queue table exists at the path (a local run, a first try), the notebook first
# MAGIC writes some demo traffic into one, so that there is something to chart.

# COMMAND ----------

# MAGIC %pip install deltalake==1.6.6

# COMMAND ----------

# MAGIC %pip install --no-deps /Volumes/main/default/libs/spark_queue-0.1.0-py3-none-any.whl

# COMMAND ----------

import os
import tempfile
from datetime import datetime, timedelta, timezone
from typing import Any

from pyspark.sql import Window
from pyspark.sql import functions as F

import spark_queue
from spark_queue import QueueTable

spark = globals().get("spark") or spark_queue.local_session("spark-queue-monitoring")
spark_queue.register(spark)  # idempotent: a local session already has it
dbutils = globals().get("dbutils")

if dbutils is not None:
    dbutils.widgets.text("queue_table", "", "Queue table (cloud URI or /Volumes/...)")
    dbutils.widgets.text("queue", "", "Queue (empty: all)")
    QUEUES = dbutils.widgets.get("queue_table").rstrip("/")
    QUEUE = dbutils.widgets.get("queue") or None
    if not QUEUES:
        raise ValueError("set the queue_table widget to the path of a queue table")
    CHART = None
else:
    BASE = os.environ.get("SPARK_QUEUE_NOTEBOOK_PATH") or tempfile.mkdtemp(
        prefix="spark-queue-monitoring-"
    )
    QUEUES = f"{BASE}/queues"
    QUEUE = os.environ.get("SPARK_QUEUE_NOTEBOOK_QUEUE") or None
    CHART = f"{BASE}/history.png"  # where the local chart goes, if matplotlib is installed


def show(data: Any, rows: int = 50) -> None:
    """Databricks' ``display`` where it exists; a printed table elsewhere."""
    databricks_display = globals().get("display")
    if databricks_display is not None:
        databricks_display(data)
    else:
        data.show(rows, truncate=False)


table = QueueTable(QUEUES)
print(f"queue table: {QUEUES}; queues: {table.queues()}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Demo traffic (only where the path holds no queue table)
# MAGIC
# MAGIC Queue `events` keeps at most 50 ready messages; beyond that the oldest are dropped
# MAGIC (`drop-head`) and dead-lettered to `events.dlq` with reason `maxlen`. Six rounds of: a
# MAGIC producer enqueues 20 messages (one in ten already past its `expires_at`), then a worker
# MAGIC leases 8 and acknowledges them. Expired messages the worker reaches are removed as
# MAGIC `expired` and dead-lettered with reason `expired`.

# COMMAND ----------

DEMO = not table.queues()
if DEMO:
    table.declare("events", max_length=50, dead_letter_queue="events.dlq")
    past = datetime.now(timezone.utc) - timedelta(hours=1)
    for round_ in range(6):
        batch = spark.range(round_ * 20, (round_ + 1) * 20).select(
            F.concat(F.lit("event-"), F.col("id")).cast("string").alias("body"),
            F.when(F.col("id") % 10 == 0, F.lit(past)).alias("expires_at"),
        )
        writer = batch.coalesce(1).write.format("ringqueue").mode("append")
        writer.option("queue", "events").save(QUEUES)  # one commit
        leased = table.lease("events", "worker", max_messages=8)
        table.ack("events", leased["seq"].to_pylist(), consumer="worker")
    print(f"wrote demo traffic: {table.stats('events')}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The history
# MAGIC
# MAGIC One row per queue and commit: `version`, `timestamp`, `operation` (what the commit did),
# MAGIC the gauges as the commit left them, the counters (cumulative since the queue was
# MAGIC declared) and the limits in force. It reaches back as far as the Delta log does: 7 days
# MAGIC on a queue table, and at most 500 versions (`spark_queue.logRetentionVersions`, which a
# MAGIC busy table fills in seconds to minutes; docs/MAINTENANCE.md says how to raise it).
# MAGIC `versions=range(a, b)` reads part of it.

# COMMAND ----------

history = table.history(QUEUE)
history_df = spark.createDataFrame(history)
print(f"{history.num_rows} rows, versions {history['version'][0]}..{history['version'][-1]}")
show(
    history_df.select(
        "version",
        "timestamp",
        "operation",
        "queue",
        "ready",
        "leased",
        "scheduled",
        "added",
        "acked",
        "replaced",
        "dropped",
        "expired",
        "dead_lettered",
        "max_length",
    ).orderBy("version", "queue")
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## What each commit changed
# MAGIC
# MAGIC Counters only grow; their differences from one commit to the next say what happened in
# MAGIC that commit (how many messages a batch added, dropped, dead-lettered), and summed over a
# MAGIC window they are rates. `depth` is every message the queue holds, whatever its state.

# COMMAND ----------

LOSSES = ["replaced", "dropped", "expired", "killed", "rejected", "dead_lettered"]
by_queue = Window.partitionBy("queue").orderBy("version")
changes = history_df.select(
    "version",
    "timestamp",
    "operation",
    "queue",
    (F.col("ready") + F.col("leased") + F.col("scheduled")).alias("depth"),
    *[
        (F.col(c) - F.coalesce(F.lag(c).over(by_queue), F.lit(0))).alias(f"{c}_in_commit")
        for c in ["added", "acked", *LOSSES]
    ],
)
show(changes.orderBy("version", "queue"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Chart
# MAGIC
# MAGIC On Databricks: in the table below, add a visualization (**+** > Visualization), type
# MAGIC *Line*, X `timestamp` (or `version`), Y `ready`, `leased`, `scheduled` and the loss
# MAGIC counters, grouped by `queue`. Locally the cell draws the same chart with matplotlib
# MAGIC when it is installed (saved next to the queue table), else prints the series.

# COMMAND ----------

series = history_df.select(
    "version", "timestamp", "queue", "ready", "leased", "scheduled", *LOSSES
).orderBy("version", "queue")

if globals().get("display") is not None:
    show(series)
else:
    try:
        import matplotlib

        matplotlib.use("Agg")  # no window: a file
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    if plt is None:
        print("matplotlib is not installed: the series as a table")
        show(series)
    else:
        frame = series.toPandas()
        names = sorted(frame["queue"].unique())
        figure, axes = plt.subplots(len(names), 2, figsize=(12, 3 * len(names)), squeeze=False)
        for row, name in enumerate(names):
            mine = frame[frame["queue"] == name]
            mine.plot(x="version", y=["ready", "leased", "scheduled"], ax=axes[row][0])
            axes[row][0].set_title(f"{name}: depth")
            mine.plot(x="version", y=LOSSES, ax=axes[row][1])
            axes[row][1].set_title(f"{name}: lost and dead-lettered (cumulative)")
        figure.tight_layout()
        figure.savefig(CHART)
        print(f"chart: {CHART}")
