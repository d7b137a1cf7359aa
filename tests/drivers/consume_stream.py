"""A consumer driver for the crash tests: queue -> Delta table, availableNow.

Run as its own process (the tests SIGKILL its session):
    python tests/drivers/consume_stream.py QUEUE_PATH OUTPUT_PATH CHECKPOINT_DIR [PER_BATCH]

With SPARK_QUEUE_TEST_GO_FILE set, the query waits for that file once the session is up.
"""

from __future__ import annotations

import os
import sys
import time

from pyspark.sql import SparkSession

from spark_queue import local_session
from tests.crash import GO_FILE


def main(queue_path: str, output: str, checkpoint: str, per_batch: str = "20") -> None:
    spark = local_session(app_name="consume-stream-driver")
    go = os.environ.get(GO_FILE)
    while go is not None and not os.path.exists(go):
        time.sleep(0.02)
    run(spark, queue_path, output, checkpoint, per_batch)
    spark.stop()


def run(
    spark: SparkSession, queue_path: str, output: str, checkpoint: str, per_batch: str = "20"
) -> None:
    """The query, on ``spark``: a test restarts it in its own session after a crash."""
    query = (
        spark.readStream.format("ringqueue")
        .option("queue", "orders")
        .option("consumer", "pipeline")
        .option("maxMessagesPerTrigger", per_batch)
        .load(queue_path)
        .select("seq", "body", "delivery_count")
        .writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(output)
    )
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:5])
