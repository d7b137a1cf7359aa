"""What a group commit's catch-up costs, and whether checkpoints more often make it cheaper
(docs/decisions/checkpoint-interval.md).

A round's leader reads its own commit back with delta-rs's ``update_incremental`` (the
binding keeps no snapshot of the commit it wrote). This measures, side by side in one run:

1. ``update_incremental`` reading one new commit, on plain Delta tables of 20 and 200
   files, at 1 to 100 commits since the last checkpoint (the median of 15 reads each);
2. 32 threads of one process making one-message ``QueueTable.publish`` calls for
   ``--seconds``, on queue tables whose ``delta.checkpointInterval`` is 10 and 50 (the
   connector's), alternately, ``--turns`` times each: msg/s and commits.

    .venv/bin/python benchmarks/bench_catch_up.py [--seconds 6] [--turns 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
from common import write_results
from deltalake import DeltaTable, write_deltalake

from spark_queue import QueueTable

DISTANCES = (1, 10, 25, 50, 100)
THREADS = 32
ROW = pa.table({"a": [1]})


def catch_up_ms(folder: Path, files: int) -> dict[int, float]:
    """Median ms of ``update_incremental`` reading one commit, by commits since the last
    checkpoint, on a table of ``files`` files: a table opened one version back is brought
    to the latest, 15 times at each distance."""
    path = str(folder / f"plain-{files}")
    write_deltalake(path, ROW, configuration={"delta.checkpointInterval": "1000000"})
    writer = DeltaTable(path)
    for _ in range(files - 1):
        write_deltalake(writer, ROW, mode="append")
    writer.create_checkpoint()
    checkpointed = writer.version()
    medians = {}
    for distance in DISTANCES:
        while writer.version() - checkpointed < distance:
            write_deltalake(writer, ROW, mode="append")
        times = []
        for _ in range(15):
            reader = DeltaTable(path, version=writer.version() - 1)
            started = time.perf_counter()
            reader.update_incremental()
            times.append(time.perf_counter() - started)
        medians[distance] = round(statistics.median(times) * 1000, 2)
    return medians


def publish_rate(folder: Path, interval: int, seconds: float, turn: int) -> dict[str, float]:
    """32 threads' one-message publishes on a new queue table checkpointed every
    ``interval`` commits."""
    path = str(folder / f"queue-{interval}-{turn}")
    table = QueueTable(path)
    table.declare("q")
    table.declare("warm-up")
    if interval != 50:
        DeltaTable(path).alter.set_table_properties({"delta.checkpointInterval": str(interval)})
    ready, go = threading.Barrier(THREADS + 1), threading.Barrier(THREADS + 1)
    sent = [0] * THREADS

    def publish(n: int) -> None:
        client = QueueTable(path)
        client.publish("warm-up", [f"w{n}"])  # the table opened, pyarrow's conversion warm
        ready.wait()
        go.wait()
        stop, count = time.time() + seconds, 0
        while time.time() < stop:
            client.publish("q", [f"{n}-{count}"])
            count += 1
        sent[n] = count

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    ready.wait()
    before = DeltaTable(path).version()
    go.wait()
    for thread in threads:
        thread.join()
    commits = DeltaTable(path).version() - before
    return {"msg_per_s": round(sum(sent) / seconds), "commits": commits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--turns", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="bench-catch-up-") as scratch:
        folder = Path(scratch)
        results["update_incremental_ms"] = {
            f"{files} files": catch_up_ms(folder, files) for files in (20, 200)
        }
        rates = []
        for turn in range(args.turns):
            for interval in (50, 10):
                rate = publish_rate(folder, interval, args.seconds, turn)
                rates.append({"interval": interval, "turn": turn + 1, **rate})
                print(rates[-1], flush=True)
        results["publish_32_threads"] = rates
    write_results("catch_up.json", results)


if __name__ == "__main__":
    main()
