"""A producer driver for the kill test: stream Parquet files into a queue, one file a batch.

Run as its own process (the test SIGKILLs its process group):
    python tests/drivers/produce_stream.py QUEUE_PATH INPUT_DIR CHECKPOINT_DIR [PARTITIONS]

With PARTITIONS above 1 the queue has that many partitions, and each row's body is its key.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

from spark_queue import local_session


def main(queue_path: str, input_dir: str, checkpoint: str, partitions: str = "1") -> None:
    spark = local_session(app_name="produce-stream-driver")
    run(spark, queue_path, input_dir, checkpoint, partitions)
    spark.stop()


def run(
    spark: SparkSession, queue_path: str, input_dir: str, checkpoint: str, partitions: str = "1"
) -> None:
    """The query, on ``spark``: a test restarts it in its own session after a crash."""
    schema = spark.read.parquet(input_dir).schema
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(input_dir)
    writer = stream.writeStream.format("ringqueue").option("queue", "orders")
    if int(partitions) > 1:
        writer = stream.withColumn("key", stream["body"]).writeStream.format("ringqueue")
        writer = writer.option("queue", "orders").option("partitions", partitions)
    query = (
        writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start(queue_path)
    )
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:5])
