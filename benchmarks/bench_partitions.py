"""Partitioned queues: one queue of 1, 2, 4 and 8 partitions, on a local disk and on the
suite's S3 server (moto) behind a latency proxy that holds each request ``--delay`` ms,
each measure's rates side by side in one run, with the CPU each process spent.

- **publish**: ``--threads`` threads of one process making one-message ``publish`` calls
  (keyless: sticky, the process's turn shared by its threads) for ``--seconds``, committing
  directly; msg/s, commits (over every partition table) and the mean ms a call (threads x
  seconds / calls, Little's law);
- **publishers**: ``--publish-processes`` processes, each making one-message ``publish``
  calls from one thread, committing directly (processes scale out where threads of one
  process wait on the same rounds);
- **workers**: ``--workers`` processes looping ``lease(max_messages=10)`` + ``ack`` for
  ``--seconds`` on a queue that never runs dry (``bench_clients.py``'s raw loop);
- **consumer**: ``--workers`` processes, each one ``QueueTable.consumer`` whose handler acks
  and does nothing else, for ``--seconds`` (``bench_clients.py``'s steady workers);
- **source** (takes a SparkSession: run it under ``flock /tmp/spark-tests.lock``):
  ``readStream.format("ringqueue")`` with ``Trigger.AvailableNow`` into a ``noop`` sink
  drains ``--source-messages`` messages, ``maxMessagesPerTrigger`` ``--per-trigger``: one
  partition is one queue table holding the same data; a small drain of a local queue of 2
  partitions runs first, unmeasured, so that no measured query starts Spark's Python
  workers;
- **sink** (Spark): a batch write of ``--sink-rows`` rows into the queue, each with one of
  1,000 keys (so the rows of every task reach every partition);
- **brokers** (``--broker-store``, local by default): ``--clients`` processes making
  one-message ``publish`` calls through one, then two ``spark-queue broker`` processes on a
  queue of ``--broker-partitions`` partitions (its name chosen so that the partitions split
  evenly between the two brokers' ids): msg/s, commits (over every partition table) and
  messages a commit, each broker's calls and CPU.

Every measure checks what it counted against the queue's ``stats`` (every message sent
added; every message handled acked). CPU is each process's user and system time over the
measure, in cores (seconds of CPU a second): this process (its threads), the client
processes, moto and the proxy, the brokers; ``machine`` is every core's busy share from
``/proc/stat`` (other work on the machine included). Results go to
``benchmarks/out/partitions.json`` (``partitions-PARTS.json`` for some parts) with the
figures ``benchmarks/plots.py`` draws (``figures``: copy them into
``docs/benchmarks/figures.json``, key ``partitions``).

    .venv/bin/python benchmarks/bench_partitions.py [--parts publish publishers workers ...]
        [--stores local s3] [--partitions 1,2,4,8] [--seconds 4] [--delay 20]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_clients import (
    QUEUE,
    IdleBroker,
    Target,
    publish_loop,
    raw_loop,
    run_processes,
    run_threads,
)
from bench_clients import worker as consumer_loop
from bench_round_trips import phases, storage, through
from common import environment, int_list, median, progress, write_results

from tests.latency_proxy import LatencyProxy
from tests.object_store import new_bucket, server_options, start_s3_server

PARTS = ("publish", "publishers", "workers", "consumer", "source", "sink", "brokers")
STORES = ("local", "s3")
SPARK_PARTS = ("source", "sink")
CONSUMER = "bench"
BODY = b"x" * 200
FILL_BATCH = 10_000


# -- CPU ----------------------------------------------------------------------------------------


def machine_ticks() -> tuple[int, int]:
    """Every core's busy and total ticks since boot (``/proc/stat``)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


class CpuMeter:
    """The cores each named process used from :meth:`start` to :meth:`stop`, this process's
    own (all its threads) as ``here``, and the machine's busy share."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    def start(self) -> None:
        self._began = time.monotonic()
        self._here = time.process_time()
        self._cpu = {name: IdleBroker.cpu_seconds(pid) for name, pid in self.pids.items()}
        self._ticks = machine_ticks()

    def stop(self, clients: float = 0.0) -> dict[str, float]:
        """The cores used; ``clients``: the CPU seconds the client processes reported."""
        elapsed = time.monotonic() - self._began
        busy, total = (a - b for a, b in zip(machine_ticks(), self._ticks, strict=True))
        used = {
            name: IdleBroker.cpu_seconds(pid) - self._cpu[name] for name, pid in self.pids.items()
        }
        used["here"] = time.process_time() - self._here
        if clients:
            used["clients"] = clients
        cores = {name: round(seconds / elapsed, 2) for name, seconds in used.items()}
        cores["machine"] = round(busy / total * (os.cpu_count() or 1), 2) if total else 0.0
        cores["load"] = round(os.getloadavg()[0], 1)
        return cores


class _Clocked:
    """A client's release (``bench_clients``' ``go``) that notes the process's CPU time once
    released: what the measured part of its loop spent."""

    def __init__(self, go: Any) -> None:
        self.go = go
        self.cpu = 0.0

    def wait(self) -> None:
        self.go.wait()
        self.cpu = time.process_time()


def warm(target: Target, partitions: int, queue: str = QUEUE) -> None:
    """Open every partition table of ``queue`` in this process (its commit groups, which
    every ``QueueTable`` of the process shares), as a client's warm-up opens a table: a
    lease of none in each partition."""
    from spark_queue.model.partition_calls import one_partition

    table = target.table()
    for partition in range(partitions):
        with one_partition(partition):
            table.lease(queue, "warm-up", max_messages=0)


def clocked(
    function: Callable, arguments: tuple, keywords: dict, partitions: int, go: Any
) -> tuple[Any, float]:
    """A client process: every partition table opened (:func:`warm`), then
    ``function(*arguments, go, **keywords)``; what it returned and the CPU seconds it spent
    after its release."""
    warm(arguments[0], partitions, keywords.get("queue", QUEUE))
    clock = _Clocked(go)
    result = function(*arguments, clock, **keywords)
    return result, time.process_time() - clock.cpu


def run_clocked(
    function: Callable,
    arguments: list[tuple],
    partitions: int,
    meter: CpuMeter,
    keywords: dict | None = None,
    on_start: Callable[[], Any] | None = None,
) -> tuple[list, dict[str, float]]:
    """``bench_clients.run_processes`` of ``function`` over ``arguments`` (each a target
    first) on a queue of ``partitions``, metered: the clients' results and the cores each
    process used (``on_start`` runs as the clients are let go, before the meter starts)."""
    calls = [(function, args, keywords or {}, partitions) for args in arguments]

    def start() -> None:
        if on_start is not None:
            on_start()
        meter.start()

    _, results, _ = run_processes(clocked, calls, start)
    cores = meter.stop(clients=sum(cpu for _, cpu in results))
    return [result for result, _ in results], cores


# -- where the queues are -----------------------------------------------------------------------


@dataclass
class Store:
    """Where a measure's tables go: ``options`` reach them as the clients do (through the
    proxy on S3), ``direct`` without the proxy (filling and checking); ``pids`` are the
    store's processes (moto, the proxy)."""

    name: str
    new_path: Callable[[str], str]
    options: dict[str, str] | None
    direct: dict[str, str] | None
    pids: dict[str, int]
    label: str

    def table(self, path: str, *, through_proxy: bool = False) -> Any:
        from spark_queue import QueueTable

        options = self.options if through_proxy else self.direct
        return QueueTable(path, storage_options=options, broker="off")


@contextlib.contextmanager
def store_of(name: str, delay_ms: int, scratch: Path) -> Iterator[Store]:
    if name == "local":
        yield Store(name, lambda label: str(scratch / f"{label}-{time.time_ns()}"), None, None, {},
                    "local disk")  # fmt: skip
        return
    server, endpoint = start_s3_server()
    try:
        direct = server_options(endpoint)
        with LatencyProxy(endpoint, delay_ms) as proxy:
            pids = {"moto": server.pid, "proxy": proxy._process.pid}
            yield Store(
                name,
                lambda label: f"s3://{new_bucket(direct, label)}/queues",
                through(proxy, direct),
                direct,
                pids,
                f"S3 (moto), {delay_ms} ms a request",
            )
    finally:
        server.terminate()
        server.wait()


def declared(store: Store, label: str, partitions: int, messages: int = 0, queue: str = QUEUE):
    """A new table with ``queue`` of ``partitions`` holding ``messages`` 200-byte messages,
    the same share in each partition; its path."""
    from spark_queue.model.partition_calls import one_partition

    path = store.new_path(label)
    table = store.table(path)
    table.declare(queue, partitions=partitions)
    for partition in range(partitions):
        share = messages // partitions + (partition < messages % partitions)
        for start in range(0, share, FILL_BATCH):
            with one_partition(partition):
                table.publish(queue, [BODY] * min(FILL_BATCH, share - start))
    return path


def commits(store: Store, path: str, partitions: int, queue: str = QUEUE) -> int:
    """The versions of the queue's partition tables, added up."""
    layout = store.table(path).partitioned
    return sum(layout.store_of(queue, k).open().version() for k in range(partitions))


# -- the parts ----------------------------------------------------------------------------------


def measure_publish(store: Store, partitions: int, args: argparse.Namespace) -> dict:
    path = declared(store, "publish", partitions)
    target = Target(path, store.options, "off")
    meter = CpuMeter(store.pids)

    def release() -> int:
        warm(target, partitions)
        before = commits(store, path, partitions)
        meter.start()
        return before

    results, before = run_threads(
        args.threads, lambda n, go: publish_loop(target, f"t{n}", args.seconds, go), release
    )
    cores = meter.stop()
    sent, errors = sum(r[0] for r in results), sum(r[1] for r in results)
    assert store.table(path).stats(QUEUE)["added"] == sent, "a publish was not added"
    made = commits(store, path, partitions) - before
    return {
        "msg_per_s": round(sent / args.seconds, 1),
        "commits_per_s": round(made / args.seconds, 2),
        "mean_ms_a_call": round(args.threads * args.seconds / sent * 1000, 1) if sent else None,
        "errors": errors,
        "cores": cores,
    }


def measure_publishers(store: Store, partitions: int, args: argparse.Namespace) -> dict:
    """``--publish-processes`` processes of one-message publishes, one thread each."""
    path = declared(store, "publishers", partitions)
    target = Target(path, store.options, "off")
    arguments = [(target, f"p{n}", args.seconds) for n in range(args.publish_processes)]
    results, cores = run_clocked(publish_loop, arguments, partitions, CpuMeter(store.pids))
    sent, errors = sum(r[0] for r in results), sum(r[1] for r in results)
    assert store.table(path).stats(QUEUE)["added"] == sent, "a publish was not added"
    return {
        "msg_per_s": round(sent / args.seconds, 1),
        "per_process": [min(r[0] for r in results), max(r[0] for r in results)],
        "errors": errors,
        "cores": cores,
    }


def measure_processes(
    store: Store, partitions: int, args: argparse.Namespace, consumer: bool
) -> dict:
    """``--workers`` processes on a queue deep enough for ``--seconds``: lease/ack loops
    (``bench_clients``' raw loop), or consumer clients (its steady workers) where
    ``consumer``."""
    backlog = args.consumer_backlog if consumer else args.backlog
    path = declared(store, "consumer" if consumer else "workers", partitions, backlog)
    target = Target(path, store.options, "off")
    if consumer:
        function, arguments = (
            consumer_loop,
            [(target, f"c{n}", 0.0, args.seconds) for n in range(args.workers)],
        )
    else:
        function, arguments = (
            raw_loop,
            [(target, f"w{n}", args.seconds) for n in range(args.workers)],
        )
    results, cores = run_clocked(function, arguments, partitions, CpuMeter(store.pids))
    done = [r[0] for r in results]
    stats = store.table(path).stats(QUEUE)
    assert stats["acked"] == sum(done) and stats["leased"] == 0, (stats, sum(done))
    assert stats["ready"] > 0, "the queue ran dry: raise --backlog or --consumer-backlog"
    return {
        "msg_per_s": round(sum(done) / args.seconds, 1),
        "per_worker": [min(done), max(done)],
        "errors": sum(r[1] for r in results),
        "cores": cores,
    }


def measure_source(spark: Any, store: Store, partitions: int, args: argparse.Namespace) -> dict:
    path = declared(store, "source", partitions, args.source_messages)
    checkpoint = tempfile.mkdtemp(prefix="bench-partitions-source-")
    meter = CpuMeter(store.pids)
    reader = (
        spark.readStream.format("ringqueue")
        .option("queue", QUEUE)
        .option("consumer", CONSUMER)
        .option("maxMessagesPerTrigger", args.per_trigger)
        .options(**storage(store.options or {}))
        .load(path)
    )
    meter.start()
    began = time.perf_counter()
    query = (
        reader.writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - began
    cores = meter.stop()
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    rows = sum(p["numInputRows"] for p in batches)
    assert rows == args.source_messages, (rows, args.source_messages)
    # Each batch's rate over its trigger (the lease, planning and reading; Spark's own).
    rates = [p["numInputRows"] / p["durationMs"]["triggerExecution"] * 1000 for p in batches]
    return {
        "msg_per_s": round(rows / elapsed, 1),
        "batch_msg_per_s_p50": round(median(rates), 1),
        "batches": len(batches),
        "phases_p50_ms": phases(batches),
        "seconds": round(elapsed, 2),
        "cores": cores,
    }


def measure_sink(spark: Any, store: Store, partitions: int, args: argparse.Namespace) -> dict:
    from pyspark.sql import functions as F

    path = declared(store, "sink", partitions)
    rows = spark.range(args.sink_rows).select(
        F.expr("repeat('x', 200)").cast("binary").alias("body"),
        F.concat(F.lit("k"), (F.col("id") % 1000).cast("string")).alias("key"),
    )
    meter = CpuMeter(store.pids)
    meter.start()
    began = time.perf_counter()
    rows.write.format("ringqueue").option("queue", QUEUE).options(
        **storage(store.options or {})
    ).mode("append").save(path)
    elapsed = time.perf_counter() - began
    cores = meter.stop()
    assert store.table(path).stats(QUEUE)["added"] == args.sink_rows
    return {"msg_per_s": round(args.sink_rows / elapsed, 1), "seconds": round(elapsed, 2),
            "cores": cores}  # fmt: skip


def even_queue(ids: list[str], partitions: int) -> str:
    """The first queue name ``q-<n>`` whose partitions split evenly among the brokers
    ``ids`` (broker ids are random: the name is chosen, not the ids)."""
    from collections import Counter

    from spark_queue.model.assignment import partition_owner

    for n in range(10_000):
        queue = f"q-{n}"
        owners = Counter(partition_owner(queue, k, ids) for k in range(partitions))
        if len(owners) == len(ids) and max(owners.values()) - min(owners.values()) <= 1:
            return queue
    raise AssertionError("no queue name splits the partitions evenly")


def measure_brokers(store: Store, count: int, args: argparse.Namespace, logs: Path) -> dict:
    from tests.brokers import BrokerProcess

    path = store.new_path(f"brokers-{count}")
    store.table(path).declare("warm-up")  # the table exists before the brokers start
    flags = [f"--storage-option={k}={v}" for k, v in (store.options or {}).items()]
    brokers = [
        BrokerProcess(path, *flags, log_path=logs / f"broker-{count}-{n}-{time.time_ns()}.log")
        for n in range(count)
    ]
    try:
        queue = even_queue([b.id for b in brokers], args.broker_partitions)
        store.table(path).declare(queue, partitions=args.broker_partitions)
        target = Target(path, store.options, "auto")
        pids = {**store.pids, **{f"broker {n}": b.process.pid for n, b in enumerate(brokers)}}
        arguments = [(target, f"p{n}", args.seconds) for n in range(args.clients)]
        before: list[int] = []
        results, cores = run_clocked(
            publish_loop,
            arguments,
            args.broker_partitions,
            CpuMeter(pids),
            {"queue": queue},
            lambda: before.append(commits(store, path, args.broker_partitions, queue)),
        )
        served = [b.status()["served"] for b in brokers]
    finally:
        for broker in brokers:
            broker.stop()
    sent, errors = sum(r[0] for r in results), sum(r[1] for r in results)
    assert store.table(path).stats(queue)["added"] == sent, "a publish was not added"
    made = commits(store, path, args.broker_partitions, queue) - before[0]
    return {
        "msg_per_s": round(sent / args.seconds, 1),
        "commits_per_s": round(made / args.seconds, 2),
        "msg_per_commit": round(sent / made, 1) if made else None,
        "served_by_each": served,
        "errors": errors,
        "cores": cores,
    }


# -- the run ------------------------------------------------------------------------------------

MEASURES: dict[str, Callable[[Store, int, argparse.Namespace], dict]] = {
    "publish": measure_publish,
    "publishers": measure_publishers,
    "workers": functools.partial(measure_processes, consumer=False),
    "consumer": functools.partial(measure_processes, consumer=True),
}
SPARK_MEASURES: dict[str, Callable[[Any, Store, int, argparse.Namespace], dict]] = {
    "source": measure_source,
    "sink": measure_sink,
}
LABELS = {
    "publish": "one-message `publish`, {threads} threads",
    "publishers": "one-message `publish`, {publish_processes} processes",
    "workers": "`lease(10)` + `ack`, {workers} processes",
    "consumer": "consumer client, {workers} processes",
    "source": "Spark source, {source_messages} messages",
    "sink": "Spark sink, a write of {sink_rows} rows",
}


def markdown(results: dict, partitions: list[int]) -> str:
    lines = [
        "| measure | store | "
        + " | ".join(f"{n} partitions" for n in partitions)
        + f" | {partitions[-1]} / 1 |",
        "|---|---|" + "---|" * (len(partitions) + 1),
    ]
    for part, stores in results.get("rates", {}).items():
        for store, rows in stores.items():
            rates = [rows[str(n)]["msg_per_s"] for n in partitions]
            ratio = f"{rates[-1] / rates[0]:.2f}" if rates[0] else "-"
            cells = " | ".join(f"{rate:,.0f}" for rate in rates)
            lines.append(f"| {part} | {store} | {cells} | {ratio} |")
    for store, rows in results.get("brokers", {}).items():
        one, two = rows["1"]["msg_per_s"], rows["2"]["msg_per_s"]
        lines.append(f"\n| brokers, {store} | 1 | 2 | 2 / 1 |\n|---|---|---|---|")
        lines.append(f"| msg/s | {one:,.0f} | {two:,.0f} | {two / one:.2f} |")
    return "\n".join(lines)


def figures(results: dict, partitions: list[int]) -> dict:
    """The plot's figures (docs/benchmarks/figures.json, key ``partitions``): each measure's
    msg/s by partitions (the Spark source's per batch too), and the brokers'."""
    figure: dict[str, Any] = {
        "source": "bench_partitions.py: msg/s of each measure against the queue's partitions",
        "partitions": partitions,
        "msg_per_s": {},
    }
    for part, stores in results.get("rates", {}).items():
        for store, rows in stores.items():
            figure["msg_per_s"][f"{part}, {store}"] = [
                rows[str(n)]["msg_per_s"] for n in partitions
            ]
            if "batch_msg_per_s_p50" in rows[str(partitions[0])]:
                figure.setdefault("batch_msg_per_s", {})[f"{part}, {store}"] = [
                    rows[str(n)]["batch_msg_per_s_p50"] for n in partitions
                ]
    if "brokers" in results:
        figure["brokers"] = {
            store: [rows["1"]["msg_per_s"], rows["2"]["msg_per_s"]]
            for store, rows in results["brokers"].items()
        }
    return figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--stores", nargs="+", choices=STORES, default=list(STORES))
    parser.add_argument("--partitions", type=int_list, default=[1, 2, 4, 8])
    parser.add_argument("--delay", type=int, default=20, help="ms the proxy adds a request")
    parser.add_argument("--seconds", type=float, default=4.0, help="of each timed measure")
    parser.add_argument("--threads", type=int, default=32, help="publishing threads")
    parser.add_argument(
        "--publish-processes", type=int, default=16, help="publishing processes (publishers)"
    )
    parser.add_argument("--workers", type=int, default=8, help="lease/ack and consumer processes")
    parser.add_argument("--backlog", type=int, default=40_000, help="messages under the workers")
    parser.add_argument("--consumer-backlog", type=int, default=200_000)
    parser.add_argument("--source-messages", type=int, default=100_000)
    parser.add_argument("--per-trigger", type=int, default=25_000, help="maxMessagesPerTrigger")
    parser.add_argument("--sink-rows", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=16, help="processes on the brokers")
    parser.add_argument("--broker-partitions", type=int, default=8)
    parser.add_argument("--broker-store", choices=STORES, default="local")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-partitions-"))
    results: dict[str, Any] = {"environment": environment(), "args": vars(args)}
    spark = None
    if set(args.parts) & set(SPARK_PARTS):
        from spark_queue import local_session

        spark = local_session("bench-partitions")
    try:
        if "source" in args.parts:
            warm_up_source(spark, args, scratch)
        for name in args.stores:
            with store_of(name, args.delay, scratch) as store:
                run_store(spark, store, args, results, scratch)
        results["figures"] = figures(results, args.partitions)
        print("\n" + markdown(results, args.partitions), flush=True)
        name = (
            "partitions" if set(args.parts) == set(PARTS) else "partitions-" + "-".join(args.parts)
        )
        print(f"\nwrote {write_results(f'{name}.json', results, show=False)}")
    finally:
        if spark is not None:
            spark.stop()


def warm_up_source(spark: Any, args: argparse.Namespace, scratch: Path) -> None:
    """A small drain of a local queue of 2 partitions, unmeasured: Spark starts its Python
    workers (one a core) and imports the source in them, so the first measured drain pays
    for neither."""
    small = argparse.Namespace(**{**vars(args), "source_messages": 2_000, "per_trigger": 1_000})
    with store_of("local", args.delay, scratch) as store:
        measure_source(spark, store, 2, small)


def run_store(spark: Any, store: Store, args: argparse.Namespace, results: dict, scratch: Path):
    """Every part asked for on ``store``."""
    for part in args.parts:
        if part == "brokers":
            if store.name == args.broker_store:
                rows = results.setdefault("brokers", {}).setdefault(store.label, {})
                for count in (1, 2):
                    rows[str(count)] = measure_brokers(store, count, args, scratch)
                    progress(f"brokers, {store.label}, {count}: {rows[str(count)]}")
            continue
        label = LABELS[part].format(**vars(args))
        rows = results.setdefault("rates", {}).setdefault(label, {}).setdefault(store.label, {})
        for n in args.partitions:
            if part in SPARK_PARTS:
                rows[str(n)] = SPARK_MEASURES[part](spark, store, n, args)
            else:
                rows[str(n)] = MEASURES[part](store, n, args)
            progress(f"{part}, {store.label}, {n} partitions: {rows[str(n)]}")


if __name__ == "__main__":
    main()
