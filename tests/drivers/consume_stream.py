"""A consumer driver for the kill test: queue -> Delta table, a few messages per batch.

Run as its own process (the test SIGKILLs its process group):
    python tests/drivers/consume_stream.py QUEUE_PATH OUTPUT_PATH CHECKPOINT_DIR
"""

from __future__ import annotations

import sys

from spark_queue import local_session


def main(queue_path: str, output: str, checkpoint: str) -> None:
    spark = local_session(app_name="consume-stream-driver")
    query = (
        spark.readStream.format("ringqueue")
        .option("queue", "orders")
        .option("consumer", "pipeline")
        .option("maxMessagesPerTrigger", 20)
        .load(queue_path)
        .select("seq", "body", "delivery_count")
        .writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(output)
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
