"""A batch producer for the concurrent-producer tests: several ``df.write`` batches.

Run as its own process:
    python tests/drivers/produce_batches.py QUEUE_PATH NAME BATCHES PER_BATCH GO_FILE RING

It starts Spark, touches ``GO_FILE.NAME`` to say it is ready, waits for ``GO_FILE`` (so that
every producer writes at the same time), then writes ``BATCHES`` batches of ``PER_BATCH``
messages ``NAME-b<batch>-m<message>``, each batch to queue ``orders`` (unbounded) and to
queue ``ring`` (a ring of ``RING``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from spark_queue import local_session


def main(queue_path: str, name: str, batches: str, per_batch: str, go: str, ring: str) -> None:
    spark = local_session(app_name=f"produce-batches-{name}")
    Path(f"{go}.{name}").touch()
    deadline = time.monotonic() + 300
    while not Path(go).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    for batch in range(int(batches)):
        rows = [(f"{name}-b{batch}-m{i}",) for i in range(int(per_batch))]
        df = spark.createDataFrame(rows, "body string").coalesce(1)
        df.write.format("ringqueue").mode("append").option("queue", "orders").save(queue_path)
        writer = df.write.format("ringqueue").mode("append").option("queue", "ring")
        writer.option("ringSize", ring).save(queue_path)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
