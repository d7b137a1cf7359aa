"""Benchmark the consumer side of ``format("ringqueue")`` in one run, on one machine.

1. Throughput: ``readStream.format("ringqueue")`` (a consumer, at-least-once, availableNow,
   ~5 micro-batches) against ``readStream.format("delta")`` over the same bodies, both into
   the ``noop`` sink. Goal: ratio >= 0.8. In the same turns, for reference: a Delta table of
   the bodies alone, an empty Python source (what starting one costs), and two Python sources
   that do no queue work, handing the same rows over from memory and reading them from
   Parquet (the best a Python source reaches here, and the best one reading Parquet does).
2. Ack cost against depth: ``QueueTable.ack`` of 10,000 leased messages at depth 10 thousand
   and 10 million. Goal: within 1.2x.
3. Write amplification: bytes written to the table directory over a message's life (enqueue,
   lease, ack) divided by the bytes its enqueue wrote. Goal: <= 1.5.
4. Memory: drain >= 2 GB of bodies with ``maxBytesPerTrigger=64m`` in a process (and JVM)
   of its own, so the fill is not counted; peak resident memory of every process (driver
   Python, driver JVM, Python workers). Goal: each <= 1.5 GB.
5. Returns: release a batch of a million leases, then the next commit and the ack of the
   same messages leased again (no goal: it must cost what an ack does, not more).

    .venv/bin/python benchmarks/bench_consumer.py            # full size
    .venv/bin/python benchmarks/bench_consumer.py --small    # a quick smoke run

Results go to ``--out`` (JSON) and a summary to stdout; exit 1 if a correctness check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_sink import write_bodies  # noqa: E402
from common import (  # noqa: E402
    OUT,
    environment,
    fill_with_spark,
    int_list,
    median,
    progress,
    write_results,
)
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (  # noqa: E402
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from spark_queue import QueueTable, local_session  # noqa: E402
from spark_queue.model.schema import BROWSE_ARROW_SCHEMA, BROWSE_COLUMNS  # noqa: E402
from spark_queue.spark.datasource import BROWSE_SCHEMA  # noqa: E402
from spark_queue.spark.source import ARROW_BATCH_BYTES  # noqa: E402
from spark_queue.storage.store import QueueStore  # noqa: E402

GIB = 1024**3


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(OUT / "consumer.json"))
    parser.add_argument(
        "--messages",
        type=int_list,
        default=[1_000_000, 5_000_000],
        help="throughput, 200 B: comma-separated sizes, each drained in 5 micro-batches",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--depth-small", type=int, default=10_000)
    parser.add_argument("--depth-large", type=int, default=10_000_000)
    parser.add_argument("--ack-batch", type=int, default=10_000)
    parser.add_argument("--amplification-messages", type=int, default=200_000)
    parser.add_argument("--return-batch", type=int, default=1_000_000)
    parser.add_argument("--memory-messages", type=int, default=210_000, help="of 10 KB")
    parser.add_argument("--small", action="store_true", help="smoke sizes")
    parser.add_argument(
        "--sections",
        default="throughput,ack_depth,amplification,memory,returns",
        help="a comma-separated subset to run",
    )
    parser.add_argument(
        "--driver-memory",
        default=None,
        help="spark.driver.memory (local mode: the whole JVM); default 2g",
    )
    parser.add_argument("--drain", help=argparse.SUPPRESS)  # the memory section's consumer
    args = parser.parse_args(argv)
    if args.small:
        args.messages, args.depth_large, args.amplification_messages = [50_000], 200_000, 20_000
        args.memory_messages, args.repeats, args.return_batch = 20_000, 1, 20_000
    return args


class EmptyStream(DataSource):
    """A Python streaming source without data. Timing it from ``load`` to the end of an
    availableNow query measures what starting any Python streaming source costs: PySpark
    launches a Python process to run the reader, which imports PySpark first."""

    @classmethod
    def name(cls) -> str:
        return "bench_empty_stream"

    def schema(self) -> str:
        return "value binary"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return EmptyStreamReader()


class EmptyStreamReader(DataSourceStreamReader):
    def initialOffset(self) -> dict:
        return {"position": 0}

    def latestOffset(self) -> dict:
        return {"position": 0}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return []

    def read(self, partition: InputPartition) -> Any:
        return iter(())


class ArrowRowsStream(DataSource):
    """A Python streaming source that yields the consumer's rows from memory: ``batches``
    micro-batches, each the rows of the Arrow IPC file ``rows`` (memory-mapped), read by two
    tasks as the queue reads a large batch, in Arrow batches of the queue's size. It does no
    queue work and reads no Parquet, so it is the fastest any Python streaming source can
    deliver these rows through PySpark: ``delta`` over it is the best ratio reachable."""

    @classmethod
    def name(cls) -> str:
        return "bench_arrow_rows"

    def schema(self) -> Any:
        return BROWSE_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return ArrowRowsReader(self.options["rows"], int(self.options["batches"]))


@dataclass
class RowsShare(InputPartition):
    path: str
    task: int
    tasks: int


class ArrowRowsReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, path: str, batches: int) -> None:
        self.path, self.batches = path, batches

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def getDefaultReadLimit(self) -> Any:
        return ReadMaxRows(1)  # admission control: one batch per trigger

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        assert start is not None
        return {"batch": min(start["batch"] + 1, self.batches)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        count = end["batch"] - start["batch"]
        return [RowsShare(self.path, task, 2) for _ in range(count) for task in range(2)]

    def read(self, partition: InputPartition) -> Any:
        import pyarrow as pa

        assert isinstance(partition, RowsShare)
        rows = pa.ipc.open_file(pa.memory_map(partition.path)).read_all()
        share = -(-rows.num_rows // partition.tasks)
        rows = rows.slice(partition.task * share, share)
        row_bytes = max(1, rows.nbytes // max(1, rows.num_rows))
        yield from rows.to_batches(max_chunksize=max(1, ARROW_BATCH_BYTES // row_bytes))


class ParquetRowsStream(ArrowRowsStream):
    """A Python streaming source that reads the consumer's rows from Parquet files as the
    queue's read tasks do (two tasks, each streaming a file of half a batch 8 MiB at a
    time) and does no queue work: no lease, no ack, no commit. ``delta`` over it is the best
    ratio any Python source whose messages are in Parquet reaches here: what decoding in a
    Python worker adds to :class:`ArrowRowsStream`."""

    @classmethod
    def name(cls) -> str:
        return "bench_parquet_rows"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        files = self.options["files"].split(",")
        return ParquetRowsReader(files, int(self.options["batches"]))


class ParquetRowsReader(ArrowRowsReader):
    def __init__(self, files: list[str], batches: int) -> None:
        super().__init__(files[0], batches)
        self.files = files

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        count = end["batch"] - start["batch"]
        tasks = len(self.files)
        return [
            RowsShare(path, task, tasks)
            for _ in range(count)
            for task, path in enumerate(self.files)
        ]

    def read(self, partition: InputPartition) -> Any:
        assert isinstance(partition, RowsShare)
        path = Path(partition.path)  # the queue's own streamed read of a file
        for rows in QueueStore(str(path.parent)).stream_rows(
            path.name, BROWSE_COLUMNS, ARROW_BATCH_BYTES
        ):
            yield from rows.to_batches()


def write_rows_parquet(rows: Path, targets: list[Path]) -> None:
    """The rows of the Arrow IPC file ``rows`` as Parquet files of equal shares, written as
    the queue writes its message files (snappy, row groups of 64 Ki rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.ipc.open_file(pa.memory_map(str(rows))).read_all()
    share = -(-table.num_rows // len(targets))
    for index, target in enumerate(targets):
        pq.write_table(
            table.slice(index * share, share),
            str(target),
            compression="snappy",
            use_dictionary=["queue"],
            row_group_size=64 * 1024,
        )


def write_rows_sample(delta: Path, rows: int, target: Path) -> None:
    """The first ``rows`` rows of the Delta table ``delta`` as an Arrow IPC file, in the
    exact Arrow schema the consumer hands Spark."""
    import pyarrow as pa
    from deltalake import DeltaTable

    sample = DeltaTable(str(delta)).to_pyarrow_dataset().head(rows)
    sample = sample.select(BROWSE_COLUMNS).cast(BROWSE_ARROW_SCHEMA)
    with pa.ipc.new_file(str(target), sample.schema) as writer:
        writer.write_table(sample)


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def consume(
    spark: SparkSession, source: str, path: Path, checkpoint: Path, options: dict[str, Any]
) -> tuple[float, float]:
    """Drain ``path`` with an availableNow query into ``noop``: (wall seconds from ``load``
    to the end, seconds spent inside micro-batches, as Spark's progress reports them)."""
    reader = spark.readStream.format(source)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    started = time.perf_counter()
    query = (
        reader.load(str(path))
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    in_batches = sum(p["durationMs"]["triggerExecution"] for p in query.recentProgress) / 1000
    return seconds, in_batches


def drained(queue: Path, messages: int) -> bool:
    stats = QueueTable(str(queue)).stats("bench")
    return stats["acked"] == messages and stats["ready"] == 0 and stats["leased"] == 0


def bench_throughput(spark: SparkSession, args: argparse.Namespace, work: Path) -> dict:
    """Throughput at each size of ``--messages``: a short run, where starting the query
    weighs, and a longer one, closer to a consumer that keeps running."""
    spark.dataSource.register(EmptyStream)
    spark.dataSource.register(ArrowRowsStream)
    spark.dataSource.register(ParquetRowsStream)
    sampler = ProcessSampler(os.getpid(), period=0.1)
    sampler.start()
    try:
        sizes = {
            str(messages): throughput_at(spark, args, work, messages, sampler)
            for messages in args.messages
        }
    finally:
        sampler.running = False
        sampler.join()
    return {"sizes": sizes, "checks_ok": all(s["checks_ok"] for s in sizes.values())}


def throughput_at(
    spark: SparkSession,
    args: argparse.Namespace,
    work: Path,
    messages: int,
    sampler: ProcessSampler,
) -> dict[str, Any]:
    """The same ``messages`` four ways, in turns: consumed from a queue; streamed from a
    Delta table holding the queue's own message columns (the browse read of the filled queue:
    the same rows and columns the consumer emits); for reference, from a Delta table of the
    bodies alone; and the empty Python streaming source (:class:`EmptyStream`)."""
    work = work / f"throughput-{messages}"
    bodies = work / "bodies-200"
    write_bodies(bodies, messages, 200, 10, seed=1)
    delta, delta_bodies = work / "delta-200", work / "delta-bodies-200"
    spark.read.parquet(str(bodies)).repartition(10).write.format("delta").save(str(delta_bodies))
    sample = work / "queue-sample"
    fill_with_spark(spark, bodies, sample)
    spark.read.format("ringqueue").option("queue", "bench").load(str(sample)).repartition(
        10
    ).write.format("delta").save(str(delta))
    shutil.rmtree(sample)
    rows_sample = work / "rows.arrow"
    write_rows_sample(delta, messages // 5, rows_sample)
    rows_files = [work / f"rows-{task}.parquet" for task in range(2)]
    write_rows_parquet(rows_sample, rows_files)
    references: dict[str, tuple[str, dict[str, Any]]] = {  # Python sources doing no queue work
        "python-floor": (EmptyStream.name(), {}),
        "arrow-rows": (ArrowRowsStream.name(), {"rows": rows_sample, "batches": 5}),
        "parquet-rows": (
            ParquetRowsStream.name(),
            {"files": ",".join(map(str, rows_files)), "batches": 5},
        ),
    }
    sources = ["ringqueue", "delta", "delta-bodies", *references]
    runs: dict[str, list[float]] = {source: [] for source in sources}
    batches: dict[str, list[float]] = {source: [] for source in sources}
    cpu: dict[str, list[dict[str, float]]] = {source: [] for source in sources}
    checks = True
    for repeat in range(args.repeats):
        for source in sources if repeat % 2 == 0 else sources[::-1]:
            checkpoint = work / f"chk-{source}-{repeat}"
            queue = work / f"queue-{repeat}"
            if source == "ringqueue":
                fill_with_spark(spark, bodies, queue)
            before = sampler.cpu_seconds()
            if source == "ringqueue":
                seconds, in_batches = consume(
                    spark,
                    "ringqueue",
                    queue,
                    checkpoint,
                    {"queue": "bench", "maxMessagesPerTrigger": messages // 5},
                )
            elif source in references:
                name, options = references[source]
                seconds, in_batches = consume(spark, name, work, checkpoint, options)
            else:
                table = delta if source == "delta" else delta_bodies
                seconds, in_batches = consume(
                    spark, "delta", table, checkpoint, {"maxFilesPerTrigger": 2}
                )
            cpu[source].append(cpu_by_kind(before, sampler.cpu_seconds()))
            if source == "ringqueue":
                checks &= drained(queue, messages)
                shutil.rmtree(queue)
            runs[source].append(seconds)
            batches[source].append(in_batches)
            progress(
                f"throughput {source} run {repeat + 1}: {seconds:.2f}s "
                f"({in_batches:.2f}s in batches), {messages / seconds:,.0f} msg/s"
            )
    best = {source: min(times) for source, times in runs.items()}
    best_batches = {source: min(times) for source, times in batches.items()}
    shutil.rmtree(work)
    return {
        "messages": messages,
        "runs": runs,
        "batch_seconds": batches,
        "best": best,
        "best_batch_seconds": best_batches,
        "ratio": best["delta"] / best["ringqueue"],
        "ratio_in_batches": best_batches["delta"] / best_batches["ringqueue"],
        "ratio_bodies_only": best["delta-bodies"] / best["ringqueue"],
        # Both sides without what starting a Python streaming source costs.
        "ratio_beyond_floor": best["delta"] / (best["ringqueue"] - best["python-floor"]),
        # The best ratio any Python streaming source reaches delivering these rows here.
        "ratio_arrow_rows": best["delta"] / best["arrow-rows"],
        "ratio_to_arrow_rows": best["arrow-rows"] / best["ringqueue"],
        # The best ratio a Python source reading these rows from Parquet reaches here.
        "ratio_parquet_rows": best["delta"] / best["parquet-rows"],
        # CPU seconds by process kind, of each source's fastest run: on two cores the
        # queue's total is what bounds it.
        "cpu_of_best": {s: cpu[s][runs[s].index(best[s])] for s in sources},
        "cpu": cpu,
        "checks_ok": checks,
    }


def bench_ack_depth(spark: SparkSession, args: argparse.Namespace, work: Path) -> dict:
    """Lease then ack ``--ack-batch`` messages at the head, 5 times per depth. The shallow
    queue is refilled before each round (a round drains it); the deep one hardly moves."""
    chunk = min(1_000_000, args.depth_large)
    deep_bodies, shallow_bodies = work / "bodies-deep", work / "bodies-shallow"
    write_bodies(deep_bodies, chunk, 200, 2, seed=2)
    write_bodies(shallow_bodies, args.depth_small, 200, 1, seed=3)
    result: dict[str, Any] = {}
    for depth in (args.depth_small, args.depth_large):
        queue = work / f"depth-{depth}"
        deep = depth == args.depth_large
        if deep:
            for _ in range(depth // chunk):
                fill_with_spark(spark, deep_bodies, queue)
        table = QueueTable(str(queue))
        leases, acks = [], []
        for _ in range(5):
            if not deep:
                fill_with_spark(spark, shallow_bodies, queue)
            started = time.perf_counter()
            seqs = table.lease("bench", "c", max_messages=args.ack_batch)["seq"].to_pylist()
            leases.append(time.perf_counter() - started)
            started = time.perf_counter()
            acked = table.ack("bench", seqs, "c")
            acks.append(time.perf_counter() - started)
            assert acked == len(seqs) == args.ack_batch, (acked, len(seqs))
        result[str(depth)] = {
            "lease_s": leases,
            "ack_s": acks,
            "ack_median": median(acks),
            "lease_median": median(leases),
        }
        progress(
            f"depth {depth:,}: ack median {median(acks) * 1000:.0f} ms, "
            f"lease median {median(leases) * 1000:.0f} ms"
        )
        shutil.rmtree(queue)
    small, large = result[str(args.depth_small)], result[str(args.depth_large)]
    result["ratio"] = large["ack_median"] / small["ack_median"]
    return result


def bench_returns(spark: SparkSession, args: argparse.Namespace, work: Path) -> dict:
    """Return a whole batch of ``--return-batch`` leases (``release``, what a restarted
    consumer or a lease period running out does), then time the queue's next commit (a small
    lease) and the ack of the returned messages leased again, against the ack of the same
    batch. Returns have no target figure; they must not be a cliff."""
    count = args.return_batch
    bodies = work / "bodies-returns"
    write_bodies(bodies, count, 200, 2, seed=5)
    queue = work / "returns"
    fill_with_spark(spark, bodies, queue)
    table = QueueTable(str(queue))

    def timed(work: Any) -> tuple[float, Any]:
        started = time.perf_counter()
        result = work()
        return time.perf_counter() - started, result

    lease_s, first = timed(lambda: table.lease("bench", "a", max_messages=count))
    release_s, released = timed(lambda: table.release("bench", consumer="a"))
    next_s, small = timed(lambda: table.lease("bench", "b", max_messages=100))
    table.ack("bench", small["seq"].to_pylist(), "b")
    again_s, again = timed(lambda: table.lease("bench", "c", max_messages=count))
    ack_s, acked = timed(lambda: table.ack("bench", again["seq"].to_pylist(), "c"))
    counts = set(again["delivery_count"].to_pylist())
    checks = released == count and acked == count - 100 and counts == {2}
    checks &= first.num_rows == count
    progress(
        f"returns of {count:,}: release {release_s:.2f} s, next commit {next_s:.2f} s, "
        f"ack {ack_s:.2f} s"
    )
    shutil.rmtree(queue)
    return {
        "messages": count,
        "lease_s": lease_s,
        "release_s": release_s,
        "next_commit_s": next_s,
        "lease_again_s": again_s,
        "ack_s": ack_s,
        "release_over_ack": release_s / ack_s,
        "checks_ok": checks,
    }


def bench_amplification(spark: SparkSession, args: argparse.Namespace, work: Path) -> dict:
    bodies = work / "bodies-1k"
    write_bodies(bodies, args.amplification_messages, 1024, 4, seed=4)
    queue = work / "amplification"
    fill_with_spark(spark, bodies, queue)
    enqueued = tree_bytes(queue)
    consume(
        spark,
        "ringqueue",
        queue,
        work / "chk-amplification",
        {"queue": "bench", "maxMessagesPerTrigger": args.amplification_messages // 5},
    )
    total = tree_bytes(queue)
    return {
        "enqueue_bytes": enqueued,
        "consume_bytes": total - enqueued,
        "ratio": total / enqueued,
        "checks_ok": drained(queue, args.amplification_messages),
    }


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class ProcessSampler(threading.Thread):
    """Samples process ``root`` and all its descendants via /proc: the peak resident memory
    and the CPU seconds (user + system) each has used. A process that exits between two
    samples loses at most one ``period`` of CPU time from the count."""

    def __init__(self, root: int, period: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.root, self.period = root, period
        self.peaks: dict[int, tuple[str, int]] = {}
        self.cpu: dict[int, tuple[str, float]] = {}
        self.running = True
        self.lock = threading.Lock()

    @staticmethod
    def stats() -> dict[int, list[str]]:
        found = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    found[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
        return found

    def kind(self, pid: int, command: bytes) -> str:
        if pid == self.root:
            return "driver python"
        if b"java" in command.split(b" ")[0]:
            return "jvm"
        # Read tasks' workers and a Python source's driver-side process alike: PySpark may
        # fork either from its daemon, so the command line cannot tell them apart.
        return "python worker"

    def sample(self) -> None:
        stats = self.stats()
        family, frontier = {self.root}, [self.root]
        while frontier:
            pid = frontier.pop()
            for child, fields in stats.items():
                if int(fields[1]) == pid and child not in family:
                    family.add(child)
                    frontier.append(child)
        for pid in family:
            try:
                status = (Path("/proc") / str(pid) / "status").read_text()
                command = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            rss = next(
                (
                    int(line.split()[1]) * 1024
                    for line in status.splitlines()
                    if line.startswith("VmRSS:")
                ),
                0,
            )
            kind = self.kind(pid, command)
            seconds = (int(stats[pid][11]) + int(stats[pid][12])) / CLOCK_TICKS
            with self.lock:
                self.cpu[pid] = (kind, seconds)
                if rss > self.peaks.get(pid, ("", 0))[1]:
                    self.peaks[pid] = (kind, rss)

    def cpu_seconds(self) -> dict[int, tuple[str, float]]:
        self.sample()
        with self.lock:
            return dict(self.cpu)

    def run(self) -> None:
        while self.running:
            self.sample()
            time.sleep(self.period)


def cpu_by_kind(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict:
    """CPU seconds used between two :meth:`ProcessSampler.cpu_seconds`, by process kind."""
    used: dict[str, float] = {}
    for pid, (kind, seconds) in after.items():
        spent = seconds - before.get(pid, (kind, 0.0))[1]
        if spent > 0:
            used[kind] = round(used.get(kind, 0.0) + spent, 2)
    return used


def drain(args: argparse.Namespace) -> int:
    """``--drain PATH``: the consumer of the memory section, alone in a fresh process and
    JVM, so that what filling the queue left in the benchmark's own JVM is not counted."""
    conf = {"spark.driver.memory": args.driver_memory} if args.driver_memory else None
    spark = local_session(app_name="bench-consumer-drain", conf=conf)
    try:
        queue = Path(args.drain)
        seconds, _ = consume(
            spark,
            "ringqueue",
            queue,
            queue.parent / "chk-memory",
            {"queue": "bench", "maxBytesPerTrigger": 64 * 1024 * 1024},
        )
    finally:
        spark.stop()
    print(json.dumps({"seconds": seconds}))
    return 0


def bench_memory(spark: SparkSession, args: argparse.Namespace, work: Path) -> dict:
    bodies = work / "bodies-10k"
    write_bodies(bodies, args.memory_messages, 10240, 20, seed=5)
    queue = work / "memory"
    fill_with_spark(spark, bodies, queue)
    gigabytes = args.memory_messages * 10240 / GIB
    command = [sys.executable, str(Path(__file__).resolve()), "--drain", str(queue)]
    if args.driver_memory:
        command += ["--driver-memory", args.driver_memory]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    monitor = ProcessSampler(child.pid)
    monitor.start()
    output, _ = child.communicate()
    monitor.running = False
    monitor.join()
    if child.returncode != 0:
        raise RuntimeError(f"the drain process failed with exit code {child.returncode}")
    seconds = json.loads(output.strip().splitlines()[-1])["seconds"]
    by_kind: dict[str, int] = {}
    for kind, rss in monitor.peaks.values():
        by_kind[kind] = max(by_kind.get(kind, 0), rss)
    return {
        "body_gib": gigabytes,
        "seconds": seconds,
        "peak_rss_by_kind": by_kind,
        "peak_rss_by_pid": {str(p): v for p, v in monitor.peaks.items()},
        "max_rss": max(by_kind.values()),
        "checks_ok": drained(queue, args.memory_messages),
    }


def summary(results: dict[str, Any]) -> str:
    lines = ["ringqueue consumer benchmark"]
    for t in results.get("throughput", {}).get("sizes", {}).values():
        best, inside = t["best"], t["best_batch_seconds"]
        lines.append(
            f"1. throughput, {t['messages']:,} x 200 B: ringqueue {best['ringqueue']:.2f} s "
            f"({t['messages'] / best['ringqueue']:,.0f} msg/s), delta with the same columns "
            f"{best['delta']:.2f} s ({t['messages'] / best['delta']:,.0f} msg/s); ratio "
            f"{t['ratio']:.2f} (goal >= 0.8). Inside micro-batches: {inside['ringqueue']:.2f} s "
            f"vs {inside['delta']:.2f} s, ratio {t['ratio_in_batches']:.2f}. Against a Delta "
            f"table of bodies only ({best['delta-bodies']:.2f} s): {t['ratio_bodies_only']:.2f}. "
            f"An empty Python streaming source takes {best['python-floor']:.2f} s from load to "
            f"end; beyond that the ratio is {t['ratio_beyond_floor']:.2f}. A Python source "
            f"yielding the same rows from memory: {best['arrow-rows']:.2f} s, ratio "
            f"{t['ratio_arrow_rows']:.2f} to Delta (the best a Python source reaches here); "
            f"ringqueue runs at {t['ratio_to_arrow_rows']:.2f} of its speed. The same rows "
            f"read from Parquet by a Python source doing no queue work: "
            f"{best['parquet-rows']:.2f} s, ratio {t['ratio_parquet_rows']:.2f}. CPU seconds of "
            "the fastest runs: "
            + "; ".join(
                f"{source} "
                + ", ".join(f"{kind} {sec:.2f}" for kind, sec in sorted(used.items()))
                + f" (all {sum(used.values()):.2f})"
                for source, used in t["cpu_of_best"].items()
            )
        )
    if "ack_depth" in results:
        d = results["ack_depth"]
        lines.append(
            "2. ack of a lease batch: "
            + ", ".join(
                f"depth {k}: {v['ack_median'] * 1000:.0f} ms" for k, v in d.items() if k != "ratio"
            )
            + f"; ratio {d['ratio']:.2f} (goal <= 1.2)"
        )
    if "amplification" in results:
        a = results["amplification"]
        lines.append(
            f"3. write amplification (1 KB bodies): {a['ratio']:.3f} (goal <= 1.5); enqueue "
            f"{a['enqueue_bytes']:,} B, lease+ack {a['consume_bytes']:,} B"
        )
    if "memory" in results:
        m = results["memory"]
        lines.append(
            f"4. memory draining {m['body_gib']:.2f} GiB in {m['seconds']:.1f} s: peak RSS "
            + ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in sorted(m["peak_rss_by_kind"].items()))
            + " (goal: each <= 1.5 GiB)"
        )
    if "returns" in results:
        r = results["returns"]
        lines.append(
            f"5. returns of {r['messages']:,} leases: release {r['release_s']:.2f} s (the ack "
            f"of as many leased again: {r['ack_s']:.2f} s), the next commit "
            f"{r['next_commit_s']:.2f} s"
        )
    return "\n".join(lines)


SECTIONS = {
    "throughput": bench_throughput,
    "ack_depth": bench_ack_depth,
    "amplification": bench_amplification,
    "memory": bench_memory,
    "returns": bench_returns,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.drain:
        return drain(args)
    work = Path(tempfile.mkdtemp(prefix="bench-consumer-"))
    conf = {"spark.driver.memory": args.driver_memory} if args.driver_memory else None
    spark = local_session(app_name="bench-consumer", conf=conf)
    started = time.perf_counter()
    try:
        results: dict[str, Any] = {"environment": environment(), "config": vars(args)}
        for name in args.sections.split(","):
            results[name] = SECTIONS[name](spark, args, work)
        results["seconds"] = time.perf_counter() - started
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    write_results(Path(args.out), results, show=False)
    print(summary(results))
    checks = all(results[k].get("checks_ok", True) for k in SECTIONS if k in results)
    return 0 if checks else 1


if __name__ == "__main__":
    sys.exit(main())
