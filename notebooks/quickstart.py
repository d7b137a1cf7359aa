# Databricks notebook source
# MAGIC %md
# MAGIC # spark-queue quickstart
# MAGIC
# MAGIC A bounded ("ring") queue stored as a Delta table: declare it, produce into it with
# MAGIC `writeStream.format("ringqueue")`, look at it (stats, peek, browse), consume it with
# MAGIC `readStream.format("ringqueue")` into a Delta table, and read the queue table itself
# MAGIC with `format("delta")`.
# MAGIC
# MAGIC Runs unchanged on Databricks and on a local SparkSession
# MAGIC (`python notebooks/quickstart.py`). On Databricks, set the `base_path` widget and see
# MAGIC `docs/DATABRICKS.md` first (runtime, installation, where a queue table may live).

# COMMAND ----------

# MAGIC %md
# MAGIC ## Install (Databricks only)
# MAGIC
# MAGIC `--no-deps` keeps the runtime's own PySpark, pandas and pyarrow: spark-queue's pins
# MAGIC are for local installs. Locally, `make setup` has installed everything.

# COMMAND ----------

# MAGIC %pip install deltalake==1.6.6

# COMMAND ----------

# MAGIC %pip install --no-deps /Volumes/main/default/libs/spark_queue-0.1.0-py3-none-any.whl

# COMMAND ----------

# MAGIC %md
# MAGIC ## Session and paths
# MAGIC
# MAGIC Databricks defines `spark`, `dbutils` and `display`; the cell registers the `ringqueue`
# MAGIC format on that session. Elsewhere it builds a local session (Delta configured,
# MAGIC `ringqueue` registered) and works under `$SPARK_QUEUE_NOTEBOOK_PATH`, or a new temporary
# MAGIC folder.

# COMMAND ----------

import json
import os
import tempfile
from typing import Any

from pyspark.sql import functions as F

try:  # the Python data source API spark-queue is built on (Apache Spark 4.2), checked first
    from pyspark.sql.datasource import DataSourceStreamArrowWriter  # noqa: F401
    from pyspark.sql.streaming.datasource import ReadMaxRows  # noqa: F401
except ImportError as missing:
    raise RuntimeError(
        "this runtime's PySpark lacks the Python data source API spark-queue needs (streaming "
        "admission control, Apache Spark 4.2); see docs/DATABRICKS.md, 'Requirements'"
    ) from missing

import spark_queue  # after the check: on older runtimes the import itself fails
from spark_queue import QueueTable

spark = globals().get("spark") or spark_queue.local_session("spark-queue-quickstart")
spark_queue.register(spark)  # idempotent: a local session already has it
dbutils = globals().get("dbutils")

if dbutils is not None:
    dbutils.widgets.text("base_path", "", "Base path (cloud URI or /Volumes/...)")
    BASE = dbutils.widgets.get("base_path").rstrip("/")
    if not BASE:
        raise ValueError(
            "set the base_path widget to a folder for this notebook's queue table, landing "
            "files and checkpoints (e.g. s3://bucket/spark-queue/quickstart); see "
            "docs/DATABRICKS.md, 'Where the queue table lives'"
        )
    dbutils.widgets.text("partitions", "1", "Partitions of the queue (docs/PARTITIONS.md)")
    PARTITIONS = int(dbutils.widgets.get("partitions") or 1)
else:
    BASE = os.environ.get("SPARK_QUEUE_NOTEBOOK_PATH") or tempfile.mkdtemp(
        prefix="spark-queue-quickstart-"
    )
    PARTITIONS = int(os.environ.get("SPARK_QUEUE_NOTEBOOK_PARTITIONS") or 1)

QUEUES = f"{BASE}/queues"  # the queue table
LANDING = f"{BASE}/landing"  # files the producer stream reads
BILLING = f"{BASE}/billing"  # the Delta table the consumer stream writes
CHECKPOINTS = f"{BASE}/checkpoints"


def show(data: Any, rows: int = 20) -> None:
    """Databricks' ``display`` where it exists; a printed table elsewhere."""
    databricks_display = globals().get("display")
    if databricks_display is not None:
        databricks_display(data)
    elif hasattr(data, "show"):  # a Spark DataFrame
        data.show(rows, truncate=False)
    else:  # pandas
        print(data.head(rows).to_string())


print(f"queue table: {QUEUES}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Declare a ring queue
# MAGIC
# MAGIC `ring_size=100`: the queue keeps the newest 100 ready messages; each new message beyond
# MAGIC that evicts the oldest one (counted as `replaced`), as an ActiveMQ Artemis ring queue
# MAGIC does. Declaring again with the same arguments is a no-op; with other arguments it fails
# MAGIC and names them (use `alter` to change a queue). With `partitions` above 1 (the
# MAGIC widget, or `$SPARK_QUEUE_NOTEBOOK_PARTITIONS` locally) the queue is that many queue
# MAGIC tables, each message in its key's, and each keeps its newest 100 (docs/PARTITIONS.md).

# COMMAND ----------

table = QueueTable(QUEUES)
table.declare("orders", ring_size=100, partitions=PARTITIONS)
print(table.arguments("orders"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Produce: `writeStream.format("ringqueue")`, availableNow
# MAGIC
# MAGIC 150 orders land as one file; a file stream reads them and enqueues them in one
# MAGIC micro-batch, which is one Delta commit. The input columns are `body` (required),
# MAGIC `message_id`, `key`, `headers` (and `priority`, `deliver_at`, `expires_at`).

# COMMAND ----------

ORDERS = 150
order = F.struct(F.col("id").alias("order_id"), (F.col("id") * 1.5).alias("amount"))
region = F.when(F.col("id") % 2 == 0, "eu").otherwise("us")
(
    spark.range(ORDERS)
    .select(
        F.to_json(order).alias("body"),
        F.concat(F.lit("order-"), F.col("id")).alias("message_id"),
        F.concat(F.lit("customer-"), F.col("id") % 7).alias("key"),
        F.create_map(F.lit("region"), region).alias("headers"),
    )
    .coalesce(1)  # one file: arrival order is id order
    .write.mode("overwrite")
    .parquet(LANDING)
)

producer = (
    spark.readStream.schema(spark.read.parquet(LANDING).schema)
    .parquet(LANDING)
    .writeStream.format("ringqueue")
    .option("queue", "orders")
    .option("checkpointLocation", f"{CHECKPOINTS}/producer")
    .trigger(availableNow=True)
    .start(QUEUES)
)
producer.awaitTermination()
print(f"produced {ORDERS} orders in {len(producer.recentProgress)} micro-batch(es)")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Look: stats, peek, browse
# MAGIC
# MAGIC `stats` has the gauges (`ready`, `leased`, `scheduled`) and the counters; `added =
# MAGIC acked + replaced + dropped + expired + killed + purged + ready + leased + scheduled`.
# MAGIC `peek` returns the next messages (a pyarrow table) and the browse read
# MAGIC `spark.read.format("ringqueue")` every message now in the queue, with its `state`;
# MAGIC neither changes anything.

# COMMAND ----------

stats_after_produce = table.stats("orders")
print(json.dumps(stats_after_produce, indent=1))

peeked = table.peek("orders", 5).select(["seq", "message_id", "key", "body"]).to_pandas()
show(peeked.assign(body=peeked["body"].map(bytes.decode)))

browse = spark.read.format("ringqueue").option("queue", "orders").load(QUEUES)
show(browse.groupBy("state").count())
show(browse.select("seq", "state", "message_id", F.col("body").cast("string").alias("body")), 5)
browsed_ids = [r.message_id for r in browse.select("message_id").collect()]

# COMMAND ----------

# MAGIC %md
# MAGIC ## Consume: `readStream.format("ringqueue")` into a Delta table
# MAGIC
# MAGIC Consumer `billing` leases up to 40 messages per micro-batch; they are acknowledged once
# MAGIC Spark has committed the batch that carried them (at-least-once; with a Delta sink a
# MAGIC replayed batch reads the same messages, so the output is exactly-once). A lease not
# MAGIC acknowledged within `leasePeriod` returns the message with `delivery_count` + 1.

# COMMAND ----------

orders_schema = "order_id BIGINT, amount DOUBLE"
consumer = (
    spark.readStream.format("ringqueue")
    .option("queue", "orders")
    .option("consumer", "billing")
    .option("maxMessagesPerTrigger", 40)
    .option("leasePeriod", "5 minutes")
    .load(QUEUES)
    .select(
        "seq",
        "message_id",
        "delivery_count",
        F.from_json(F.col("body").cast("string"), orders_schema).alias("order"),
    )
    .select("seq", "message_id", "delivery_count", "order.*")
    .writeStream.format("delta")
    .option("checkpointLocation", f"{CHECKPOINTS}/billing")
    .trigger(availableNow=True)
    .start(BILLING)
)
consumer.awaitTermination()

consumed = spark.read.format("delta").load(BILLING)
print(f"consumed {consumed.count()} orders in {len(consumer.recentProgress)} micro-batch(es)")
show(consumed.orderBy("seq"), 5)

stats_after_consume = table.stats("orders")
print(json.dumps(stats_after_consume, indent=1))

# COMMAND ----------

# MAGIC %md
# MAGIC ## The queue table is a Delta table
# MAGIC
# MAGIC Read it with `format("delta")` or SQL, and time travel it. **Only spark-queue writes
# MAGIC it**: no `MERGE`, `DELETE`, `UPDATE`, `OPTIMIZE` or `VACUUM` from Spark (use
# MAGIC `QueueTable.compact()` and spark-queue's own maintenance). The partition column `record`
# MAGIC says what a row is: `message`, `removal` (how a message left: `replaced`, `acked`, ...),
# MAGIC `queue` (each queue's state, counters included, as JSON), `lease`, `scheduled`. A
# MAGIC partitioned queue's partition 0 is in this table, each other partition in a queue table
# MAGIC of its own under `_partitions/`, read the same way.

# COMMAND ----------

raw = spark.read.format("delta").load(QUEUES)
show(raw.groupBy("record").count().orderBy("record"))
show(raw.where("record = 'removal'").groupBy("queue", "outcome").count())

# Time travel: the counters as they were right after the produce commit.
produce_version = next(
    row["version"]
    for row in table.history("orders").to_pylist()
    if (row["operation"] or "").startswith("ENQUEUE")
)
counters_then = (
    spark.read.format("delta")
    .option("versionAsOf", produce_version)
    .load(QUEUES)
    .where("record = 'queue' AND queue = 'orders'")
    .select(
        F.get_json_object("queue_state", "$.counters.added").cast("long").alias("added"),
        F.get_json_object("queue_state", "$.counters.replaced").cast("long").alias("replaced"),
        F.get_json_object("queue_state", "$.counters.acked").cast("long").alias("acked"),
    )
)
show(counters_then)
