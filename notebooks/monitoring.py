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

import pyarrow as pa
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
    dbutils.widgets.text("partitions", "1", "Partitions of the demo queue (docs/PARTITIONS.md)")
    QUEUES = dbutils.widgets.get("queue_table").rstrip("/")
    QUEUE = dbutils.widgets.get("queue") or None
    PARTITIONS = int(dbutils.widgets.get("partitions") or 1)
    if not QUEUES:
        raise ValueError("set the queue_table widget to the path of a queue table")
    CHART = None
else:
    BASE = os.environ.get("SPARK_QUEUE_NOTEBOOK_PATH") or tempfile.mkdtemp(
        prefix="spark-queue-monitoring-"
    )
    QUEUES = f"{BASE}/queues"
    QUEUE = os.environ.get("SPARK_QUEUE_NOTEBOOK_QUEUE") or None
    PARTITIONS = int(os.environ.get("SPARK_QUEUE_NOTEBOOK_PARTITIONS") or 1)
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
# MAGIC `expired` and dead-lettered with reason `expired`. With `partitions` above 1 (the widget,
# MAGIC or `$SPARK_QUEUE_NOTEBOOK_PARTITIONS` locally) `events` has that many partitions, each
# MAGIC message in its key's, each partition holding at most 50, and no dead-letter queue (a
# MAGIC partitioned queue takes none: docs/PARTITIONS.md).

# COMMAND ----------

DEMO = not table.queues()
if DEMO:
    if PARTITIONS == 1:
        table.declare("events", max_length=50, dead_letter_queue="events.dlq")
    else:
        table.declare("events", max_length=50, partitions=PARTITIONS)
    past = datetime.now(timezone.utc) - timedelta(hours=1)
    for round_ in range(6):
        batch = spark.range(round_ * 20, (round_ + 1) * 20).select(
            F.concat(F.lit("event-"), F.col("id")).cast("string").alias("body"),
            F.when(F.col("id") % 10 == 0, F.lit(past)).alias("expires_at"),
        )
        if PARTITIONS > 1:  # keys spread the messages over the partitions
            batch = batch.withColumn("key", F.concat(F.lit("customer-"), F.col("body")))
        writer = batch.coalesce(1).write.format("ringqueue").mode("append")
        writer.option("queue", "events").save(QUEUES)  # one commit (a partition)
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
# MAGIC `versions=range(a, b)` reads part of it. A partitioned queue's partitions are queue
# MAGIC tables of their own, each with its history: `partition` says whose a row is (0: this
# MAGIC table's).

# COMMAND ----------


def with_partition(rows: pa.Table, partition: int) -> pa.Table:
    return rows.append_column("partition", pa.array([partition] * rows.num_rows, pa.int32()))


parts = [with_partition(table.history(QUEUE), 0)]
for name in [QUEUE] if QUEUE else table.queues():
    for k in range(1, table.arguments(name).partitions):
        store = table.partitioned.store_of(name, k)
        parts.append(with_partition(QueueTable(store.uri).history(name), k))
history = pa.concat_tables(parts)
history_df = spark.createDataFrame(history)
print(f"{history.num_rows} rows, versions {history['version'][0]}..{history['version'][-1]}")
show(
    history_df.select(
        "version",
        "timestamp",
        "operation",
        "queue",
        "partition",
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
    ).orderBy("queue", "partition", "version")
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
by_queue = Window.partitionBy("queue", "partition").orderBy("version")
changes = history_df.select(
    "version",
    "timestamp",
    "operation",
    "queue",
    "partition",
    (F.col("ready") + F.col("leased") + F.col("scheduled")).alias("depth"),
    *[
        (F.col(c) - F.coalesce(F.lag(c).over(by_queue), F.lit(0))).alias(f"{c}_in_commit")
        for c in ["added", "acked", *LOSSES]
    ],
)
show(changes.orderBy("queue", "partition", "version"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Chart
# MAGIC
# MAGIC On Databricks: in the table below, add a visualization (**+** > Visualization), type
# MAGIC *Line*, X `timestamp` (or `version`), Y `ready`, `leased`, `scheduled` and the loss
# MAGIC counters, grouped by `queue` (and `partition`). Locally the cell draws the same chart
# MAGIC with matplotlib when it is installed (saved next to the queue table), else prints the
# MAGIC series.

# COMMAND ----------

series = history_df.select(
    "version", "timestamp", "queue", "partition", "ready", "leased", "scheduled", *LOSSES
).orderBy("queue", "partition", "version")

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
        names = sorted(set(zip(frame["queue"], frame["partition"], strict=True)))
        figure, axes = plt.subplots(len(names), 2, figsize=(12, 3 * len(names)), squeeze=False)
        for row, (queue, partition) in enumerate(names):
            mine = frame[(frame["queue"] == queue) & (frame["partition"] == partition)]
            name = f"{queue} partition {partition}" if partition else queue
            mine.plot(x="version", y=["ready", "leased", "scheduled"], ax=axes[row][0])
            axes[row][0].set_title(f"{name}: depth")
            mine.plot(x="version", y=LOSSES, ax=axes[row][1])
            axes[row][1].set_title(f"{name}: lost and dead-lettered (cumulative)")
        figure.tight_layout()
        figure.savefig(CHART)
        print(f"chart: {CHART}")
