"""Many small clients on one queue table: direct (each process's group commit)
and through a queue broker (one group commit for every client), side by side.

- **workers**: W processes, each one ``QueueTable.consumer`` whose handler does nothing,
  drain ``--messages`` messages; the aggregate rate is messages / time to drain (each
  worker's prefetch starts at one message and grows, so this includes the ramp);
- **steady**: the same for ``--seconds`` on a queue that never runs dry;
- **raw**: the baseline, W processes looping ``lease(max_messages=10)`` then
  ``ack`` (two commits per 10 messages), for ``--seconds``;
- **slow**: W processes whose handler takes ``--handler-ms`` a message, for ``--seconds``;
  the aggregate rate against the ideal W x 1000 / handler-ms, with per-worker counts;
- **publishers**: P clients making single-message ``publish`` calls for ``--seconds``: P
  threads of one process (its group commit), P processes, and P threads sending through
  one ``Publisher``; with ``broker`` among ``--via``, also the floor of the processes' row:
  the same calls to an idle broker, a Flight server that answers each publish as a broker
  does without doing anything (what 32 processes' calls cost before any queue work);
- **versus** (only when asked for: ``--only versus``; direct only): P threads of one process
  making single-message ``publish`` calls on a local table, and beside them, in turn,
  ``--repeats`` times, P threads publishing to RabbitMQ (``--rabbitmq``; durable queue,
  persistent messages, publisher confirms: ``benchmarks/rabbitmq.py``), skipped with one
  line where no RabbitMQ answers or ``pika`` is missing; ``publishers`` has the same row;
- **latency**: a consumer process waiting on an idle queue, another process publishing one
  message every 0.2 s: time from the publish call's return (and from the call) to the
  message in the handler.
- **sustained** (only when asked for: ``--only sustained``; direct only): P threads making
  single-message ``publish`` calls for ``--sustained-seconds``, the rate and the log's
  file count reported every ``--window`` seconds; once with the table's log bound by
  ``spark_queue.logRetentionVersions`` (its default), once by time alone (the property set
  to a billion: a week's log, as before the bound), one after the other.
- **tombstones** (only when asked for: ``--only tombstones``; direct only): the same calls
  for ``--seconds`` on tables whose checkpoints carry ``--tombstones`` removals each (the
  removals a busy table keeps for its ``delta.deletedFileRetentionDuration``: made with
  delta-rs, then checkpointed, as hours of commits would leave them), with the time one
  checkpoint and one fresh open of the table take.

Each measure runs once per ``--via``: ``direct`` (``broker="off"``: every process commits
its own requests) and ``broker`` (a ``spark-queue broker`` process on loopback serves the
measure's table, started after the table is filled; every client is given its address).
Every run counts the errors that reached callers (the goal is none) and checks that each
message was acknowledged once. ``--store s3`` runs on a local moto S3 server (as the
suite's ``s3_table``). Results are printed as Markdown rows, one per measure and ``via``.

    .venv/bin/python benchmarks/bench_clients.py [--store local|s3] [--via direct broker]
        [--only workers ...]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import fill, median, percentile
from pyarrow.fs import FileSelector
from rabbitmq import DEFAULT_URL, rabbitmq_row

QUEUE = "q"
WARM_UP = "warm-up"  # each publishing client's first publish, outside the measure
VIAS = ("direct", "broker")


@dataclass(frozen=True)
class Target:
    """Where a measure's clients go: the table, its storage options, and the broker they
    are given (``"off"``: commit directly). Pickled into the client processes."""

    path: str
    options: dict | None
    broker: str

    def table(self):
        from spark_queue import QueueTable

        return QueueTable(self.path, storage_options=self.options, broker=self.broker)


@contextlib.contextmanager
def serving(path: str, options: dict | None, via: str, log_dir: Path) -> Iterator[Target]:
    """The measure's target: direct, or a broker process serving ``path`` for its span."""
    if via == "direct":
        yield Target(path, options, "off")
        return
    from tests.brokers import BrokerProcess

    flags = [f"--storage-option={k}={v}" for k, v in (options or {}).items()]
    log = log_dir / f"broker-{os.path.basename(path.rstrip('/'))}-{time.time_ns()}.log"
    with BrokerProcess(path, *flags, log_path=log) as broker:
        yield Target(path, options, broker.target)
        broker.stop()


class IdleBroker:
    """A Flight server in a process of its own that answers every publish as a broker
    answers one that stored all its messages, having done nothing: the floor of a broker's
    round trip (the client's call, Flight both ways, the answer)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        ports = context.Queue()
        self.process = context.Process(target=_serve_idle, args=(ports,), daemon=True)
        self.process.start()
        self.address = f"127.0.0.1:{ports.get(timeout=60)}"

    def __enter__(self) -> IdleBroker:
        return self

    def __exit__(self, *_: object) -> None:
        self.process.terminate()
        self.process.join()

    @staticmethod
    def cpu_seconds(pid: int) -> float:
        """The user and system CPU time process ``pid`` has used."""
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve_idle(ports) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.flight as flight

    from spark_queue.broker.wire import encode_result
    from spark_queue.model.results import PublishOutcome, PublishResult

    class Server(flight.FlightServerBase):
        def do_put(self, context, descriptor, reader, writer):
            rows = reader.read_all().num_rows
            result = PublishResult(QUEUE, list(range(rows)), 0, 0, 0)
            answer = encode_result("publish", PublishOutcome(result, np.ones(rows, bool)))
            writer.write(pa.py_buffer(answer))

    server = Server("grpc://127.0.0.1:0")
    ports.put(server.port)
    server.serve()


def worker(target: Target, name: str, handler_s: float, seconds: float, go):
    """A worker process: returns (handled, errors, time of its last handled message)."""
    table = target.table()
    table.lease(QUEUE, name, max_messages=0)  # warm: the table opened, its state read
    handled = errors = 0
    last = 0.0
    go.wait()
    stop = time.time() + seconds if seconds else None
    with table.consumer(QUEUE, name) as consumer:
        while stop is None or time.time() < stop:
            try:
                got = consumer.receive(100, wait_time="3s" if stop is None else "500ms")
            except Exception:  # counted: the goal is none
                errors += 1
                continue
            if not got and stop is None and consumer.idle:  # its last lease found nothing
                break
            for message in got:
                if handler_s:
                    time.sleep(handler_s)
                message.ack()
                handled += 1
                last = time.time()
    return handled, errors, last


def run_processes(
    function: Callable, arguments: list[tuple], on_release: Callable[[], Any] | None = None
) -> tuple:
    """A process per tuple of ``arguments`` running ``function(*args, go)``, released
    together by the barrier ``go`` once each has warmed up; returns the time of the
    release, their results, and what ``on_release`` returned just before it."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(len(arguments)) as pool:
        go = manager.Barrier(len(arguments) + 1)
        ready = manager.Barrier(len(arguments) + 1)
        pending = [pool.apply_async(function, (*args, _Released(ready, go))) for args in arguments]
        ready.wait()  # every process warmed up
        released = on_release() if on_release is not None else None
        go.wait()
        start = time.time()
        results = [p.get(timeout=3600) for p in pending]
    return start, results, released


class _Released:
    """What a client process waits on: ``wait()`` says it is ready, then waits for the
    release of all."""

    def __init__(self, ready, go) -> None:
        self.ready, self.go = ready, go

    def wait(self) -> None:
        self.ready.wait()
        self.go.wait()


def run_workers(target: Target, count: int, handler_s: float = 0.0, seconds: float = 0.0):
    start, results, _ = run_processes(
        worker, [(target, f"w{n}", handler_s, seconds) for n in range(count)]
    )
    return start, results


def bench_steady(serve, counts, seconds, messages):
    """W workers for ``seconds`` on a queue deep enough that none runs dry: the rate once
    every worker's prefetch has grown, with per-worker counts."""
    print(f"\n| workers W, steady ({seconds:g} s) | via | msg/s | errors | per worker |")
    print("|---|---|---|---|---|")
    for count in counts:
        for via, target in serve(f"steady-{count}", messages):
            _, results = run_workers(target, count, 0.0, seconds)
            handled = [r[0] for r in results]
            stats = Target(target.path, target.options, "off").table().stats(QUEUE)
            assert stats["acked"] == sum(handled) and stats["leased"] == 0, stats
            assert stats["ready"] > 0, "the queue ran dry: raise --steady-messages"
            print(
                f"| {count} | {via} | {sum(handled) / seconds:,.0f} | "
                f"{sum(r[1] for r in results)} | {min(handled)}-{max(handled)} |"
            )


def bench_workers(serve, counts, messages):
    print("\n| workers W, drain | via | messages | seconds | msg/s | errors |")
    print("|---|---|---|---|---|---|")
    for count in counts:
        for via, target in serve(f"workers-{count}", messages):
            start, results = run_workers(target, count)
            handled = sum(r[0] for r in results)
            errors = sum(r[1] for r in results)
            elapsed = max(r[2] for r in results) - start
            stats = Target(target.path, target.options, "off").table().stats(QUEUE)
            assert handled == messages == stats["acked"], (handled, stats)
            print(
                f"| {count} | {via} | {messages} | {elapsed:.2f} | "
                f"{messages / elapsed:,.0f} | {errors} |"
            )


def raw_loop(target: Target, name: str, seconds: float, go):
    """A worker process of the baseline: ``lease(max_messages=10)`` then ``ack``."""
    table = target.table()
    table.lease(QUEUE, name, max_messages=0)  # warm: the table opened, its state read
    acked = errors = 0
    go.wait()
    stop = time.time() + seconds
    while time.time() < stop:
        try:
            seqs = table.lease(QUEUE, name, max_messages=10)["seq"].to_pylist()
            acked += table.ack(QUEUE, seqs, name)
        except Exception:  # counted: the goal is none
            errors += 1
    return acked, errors


def bench_raw(serve, counts, seconds):
    print(
        f"\n| raw `lease(max_messages=10)` + `ack` loops, W ({seconds:g} s) | via | msg/s "
        "| errors | per worker |"
    )
    print("|---|---|---|---|---|")
    for count in counts:
        for via, target in serve(f"raw-{count}", 40_000):
            arguments = [(target, f"w{n}", seconds) for n in range(count)]
            _, results, _ = run_processes(raw_loop, arguments)
            acked = [r[0] for r in results]
            print(
                f"| {count} | {via} | {sum(acked) / seconds:,.0f} | "
                f"{sum(r[1] for r in results)} | {min(acked)}-{max(acked)} |"
            )


def bench_slow(serve, count, handler_ms, seconds):
    print("\n| slow handler | W | via | msg/s | ideal | ratio | errors | per worker |")
    print("|---|---|---|---|---|---|---|---|")
    for via, target in serve("slow", int(count * seconds * 1000 / handler_ms * 2)):
        _, results = run_workers(target, count, handler_ms / 1000, seconds)
        counts = [r[0] for r in results]
        rate = sum(counts) / seconds
        ideal = count * 1000 / handler_ms
        print(
            f"| {handler_ms} ms | {count} | {via} | {rate:.0f} | {ideal:.0f} | "
            f"{rate / ideal:.2f} | {sum(r[1] for r in results)} | {min(counts)}-{max(counts)} "
            f"(median {statistics.median(counts):.0f}) |"
        )


def publish_loop(target: Target, name: str, seconds: float, go, queue: str = QUEUE):
    table = target.table()
    # Warm: the table opened, and pyarrow's first conversion of Python values done (it
    # imports pandas: ~0.8 s of CPU per process, which 32 processes starting at once on
    # two cores would otherwise spend inside the measured seconds).
    table.publish(WARM_UP, [name])
    sent = errors = 0
    go.wait()
    stop = time.time() + seconds
    while time.time() < stop:
        try:
            table.publish(queue, [f"{name}-{sent}"])
            sent += 1
        except Exception:  # counted: the goal is none
            errors += 1
    return sent, errors


def send_loop(publisher, n: int, seconds: float, go) -> tuple[int, int]:
    """A thread sending one message at a time through ``publisher``, awaiting each."""
    sent = errors = 0
    go.wait()
    stop = time.time() + seconds
    while time.time() < stop:
        try:
            publisher.send(f"s{n}-{sent}").result()
            sent += 1
        except Exception:  # counted: the goal is none
            errors += 1
    return sent, errors


def run_threads(
    count: int, function: Callable, on_release: Callable[[], Any] | None = None
) -> tuple[list, Any]:
    """``count`` threads running ``function(n, go)``, released together by ``go`` once each
    has warmed up (as :func:`run_processes`); their results and what ``on_release``
    returned just before the release."""
    ready, go = threading.Barrier(count + 1), threading.Barrier(count + 1)
    results: list = [None] * count

    def run(n: int) -> None:
        results[n] = function(n, _Released(ready, go))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    ready.wait()
    released = on_release() if on_release is not None else None
    go.wait()
    for thread in threads:
        thread.join()
    return results, released


def publish_row(
    label: str,
    via: str,
    target: Target,
    results: list[tuple[int, int]],
    before: int,
    seconds: float,
    warm_up: int = 0,
) -> str:
    """The Markdown row of one publishing measure: its clients' (sent, errors) and the
    commits since version ``before``, once checked that every message sent was added (and
    ``warm_up`` more to :data:`QUEUE`)."""
    sent, errors = sum(r[0] for r in results), sum(r[1] for r in results)
    table = Target(target.path, target.options, "off").table()
    assert table.stats(QUEUE)["added"] == sent + warm_up
    commits = table.store.open().version() - before
    return f"| {label} | {len(results)} | {via} | {sent / seconds:,.0f} | {errors} | {commits} |"


def idle_broker_row(count: int, seconds: float) -> str:
    """The row of ``count`` processes' one-message publishes to an :class:`IdleBroker`,
    with the CPU time its server spends a call."""
    with IdleBroker() as idle, tempfile.TemporaryDirectory(prefix="bench-clients-idle-") as path:
        target = Target(path, None, idle.address)
        arguments = [(target, f"p{n}", seconds) for n in range(count)]
        _, results, released = run_processes(
            publish_loop, arguments, lambda: IdleBroker.cpu_seconds(idle.process.pid)
        )
        cpu = IdleBroker.cpu_seconds(idle.process.pid) - released
        # A call the idle broker failed would have committed directly, creating a table.
        assert not os.listdir(path), "a call went around the idle broker"
    sent, errors = sum(r[0] for r in results), sum(r[1] for r in results)
    return (
        f"| `publish`, processes, to an idle broker (the floor; its server: "
        f"{cpu / sent * 1e3:.2f} ms of CPU a call) | {count} | idle | "
        f"{sent / seconds:,.0f} | {errors} | 0 |"
    )


def version_of(target: Target) -> int:
    return Target(target.path, target.options, "off").table().store.open().version()


def publish_threads_row(target: Target, via: str, count: int, seconds: float) -> str:
    """``count`` threads of this process making one-message publishes (its group commit)."""
    results, before = run_threads(
        count,
        lambda n, go: publish_loop(target, f"t{n}", seconds, go),
        lambda: version_of(target),
    )
    return publish_row("`publish`, threads", via, target, results, before, seconds)


def bench_publishers(serve, count, seconds, vias, rabbitmq):
    print("\n| single-message publish calls | P | via | msg/s | errors | commits |")
    print("|---|---|---|---|---|---|")
    # Threads of one process: its group commit; beside them, a durable broker's clients.
    for via, target in serve("publish-threads", 0):
        print(publish_threads_row(target, via, count, seconds))
    print(rabbitmq_row(rabbitmq, count, seconds), flush=True)
    # Processes: a group commit each (direct), or the broker's for all.
    for via, target in serve("publish-processes", 0):
        arguments = [(target, f"p{n}", seconds) for n in range(count)]
        _, results, before = run_processes(
            publish_loop, arguments, lambda target=target: version_of(target)
        )
        print(publish_row("`publish`, processes", via, target, results, before, seconds))
    if "broker" in vias:
        print(idle_broker_row(count, seconds))
    # Threads sending through one Publisher (linger 5 ms).
    for via, target in serve("publisher", 0):
        with target.table().publisher(QUEUE) as publisher:
            publisher.send("warm-up").result()  # as publish_loop's warm-up
            results, before = run_threads(
                count,
                lambda n, go: send_loop(publisher, n, seconds, go),
                lambda target=target: version_of(target),
            )
        label = "`Publisher.send(...).result()`, threads"
        print(publish_row(label, via, target, results, before, seconds, warm_up=1))


def bench_versus(path_of, options, count, seconds, repeats, rabbitmq):
    """Threads' one-message publishes on a table of their own (direct), and to RabbitMQ,
    in turn."""
    print("\n| single-message publish calls | P | via | msg/s | errors | commits |")
    print("|---|---|---|---|---|---|")
    for repeat in range(repeats):
        path = path_of(f"versus-{repeat}")
        fill(path, 0, queue=QUEUE, storage_options=options)
        target = Target(path, options, "off")
        print(publish_threads_row(target, "direct", count, seconds), flush=True)
        print(rabbitmq_row(rabbitmq, count, seconds), flush=True)


def latency_consumer(target: Target, count: int, ready, out):
    """Another process: a consumer on the idle queue; puts (seq, time in the handler)."""
    received = []
    with target.table().consumer(QUEUE, "timer") as consumer:
        ready.set()
        for message in consumer:
            received.append((message.seq, time.time()))
            message.ack()
            if len(received) == count:
                break
    out.put(received)


def bench_latency(serve, count):
    print("\n| publish -> handler, idle queue, another process | via | p50 ms | p90 ms |")
    print("|---|---|---|---|")
    for via, target in serve("latency", 0):
        table = target.table()
        context = multiprocessing.get_context("spawn")
        ready, out = context.Event(), context.Queue()
        process = context.Process(target=latency_consumer, args=(target, count, ready, out))
        process.start()
        ready.wait()
        time.sleep(2)  # idle: the consumer is long-polling
        called, returned = {}, {}
        for _ in range(count):
            start = time.time()
            (seq,) = table.publish(QUEUE, ["x"]).seqs
            called[seq], returned[seq] = start, time.time()
            time.sleep(0.2)
        received = dict(out.get(timeout=600))
        process.join()
        from_call = [(received[s] - called[s]) * 1000 for s in called]
        from_return = [(received[s] - returned[s]) * 1000 for s in returned]
        rows = (("from the publish call's return", from_return), ("from the call", from_call))
        for label, ms in rows:
            print(f"| {label} | {via} | {median(ms):.0f} | {percentile(ms, 0.9):.0f} |")


def log_file_count(path: str, options: dict | None) -> int:
    from spark_queue.storage.location import Location

    fs, base = Location.of(path, options).filesystem()
    return len(fs.get_file_info(FileSelector(f"{base.rstrip('/')}/_delta_log")))


def bench_sustained(path_of, options, count: int, seconds: float, window: float) -> None:
    from deltalake import DeltaTable

    from spark_queue.commit.maintenance import LOG_RETENTION_VERSIONS, LOG_RETENTION_VERSIONS_KEY

    print("\n| one-message `publish` calls, threads, log bound | P | after s | msg/s | log files |")
    print("|---|---|---|---|---|")
    bounds = ((f"{LOG_RETENTION_VERSIONS} versions (default)", None), ("time only", "1000000000"))
    for label, value in bounds:
        path = path_of(f"sustained-{'time' if value else 'versions'}")
        fill(path, 0, queue=QUEUE, storage_options=options)
        if value is not None:
            DeltaTable(path, storage_options=options).alter.set_table_properties(
                {LOG_RETENTION_VERSIONS_KEY: value}, raise_if_not_exists=False
            )
        target = Target(path, options, "off")
        sent = [0] * count
        stop = threading.Event()

        def loop(n: int, go, target=target, sent=sent, stop=stop) -> None:
            table = target.table()
            table.publish(WARM_UP, [f"t{n}"])
            go.wait()
            while not stop.is_set():
                table.publish(QUEUE, [f"t{n}-{sent[n]}"])
                sent[n] += 1

        def sample(target=target, sent=sent, stop=stop, label=label) -> None:
            start = time.time()
            last = 0
            for step in range(1, int(seconds / window) + 1):
                time.sleep(start + step * window - time.time())
                total = sum(sent)
                files = log_file_count(target.path, target.options)
                print(
                    f"| {label} | {count} | {step * window:.0f} | {(total - last) / window:,.0f} "
                    f"| {files:,} |",
                    flush=True,
                )
                last = total
            stop.set()

        run_threads(count, loop, lambda sample=sample: threading.Thread(target=sample).start())


def add_tombstones(path: str, options: dict | None, count: int) -> None:
    """``count`` removals of a minute ago in one delta-rs commit, then a checkpoint: what
    a table keeps of its removals (never-added paths: nothing reads their files)."""
    from deltalake import DeltaTable, PostCommitHookProperties
    from deltalake.transaction import RemoveAction

    from spark_queue import QueueTable
    from spark_queue.model.schema import PARTITION, TABLE_SCHEMA

    stamp = int(time.time() * 1000) - 60_000
    DeltaTable(path, storage_options=options).create_write_transaction(
        [
            RemoveAction(
                f"record=message/part-gone-{i:09d}.parquet",
                True,
                stamp,
                5000,
                {PARTITION: "message"},
            )
            for i in range(count)
        ],
        mode="append",
        schema=TABLE_SCHEMA,
        partition_by=[PARTITION],
        post_commithook_properties=PostCommitHookProperties(create_checkpoint=False),
    )
    QueueTable(path, storage_options=options, broker="off").checkpoint()


def bench_tombstones(path_of, options, count: int, seconds: float, sizes: list[int]) -> None:
    from spark_queue import QueueTable

    print(
        "\n| removals in each checkpoint | one checkpoint s | a fresh open ms | calls | P | via "
        "| msg/s | errors | commits |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for index, size in enumerate(sizes):
        path = path_of(f"tombstones-{index}-{size}")
        fill(path, 0, queue=QUEUE, storage_options=options)
        add_tombstones(path, options, size)
        table = QueueTable(path, storage_options=options, broker="off")
        table.publish(WARM_UP, ["one commit since the last checkpoint"])
        start = time.perf_counter()
        table.checkpoint()
        checkpoint_s = time.perf_counter() - start
        start = time.perf_counter()
        QueueTable(path, storage_options=options, broker="off").store.open()
        open_ms = (time.perf_counter() - start) * 1000
        target = Target(path, options, "off")
        results, before = run_threads(
            count,
            lambda n, go, target=target: publish_loop(target, f"t{n}", seconds, go),
            lambda target=target: version_of(target),
        )
        row = publish_row(
            "one-message `publish`, threads", "direct", target, results, before, seconds
        )
        print(f"| {size:,} | {checkpoint_s:.2f} | {open_ms:.0f} {row}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["local", "s3"], default="local")
    parser.add_argument("--via", choices=VIAS, nargs="+", default=list(VIAS))
    parser.add_argument(
        "--only", nargs="+", default=["workers", "steady", "raw", "slow", "publishers", "latency"]
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 8, 32])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--steady-messages", type=int, default=400_000)
    parser.add_argument("--slow-workers", type=int, default=16)
    parser.add_argument("--handler-ms", type=int, default=50)
    parser.add_argument("--publishers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3, help="of the versus measure")
    parser.add_argument("--rabbitmq", default=DEFAULT_URL, help="RabbitMQ's AMQP URL")
    parser.add_argument("--latency-messages", type=int, default=50)
    parser.add_argument("--sustained-seconds", type=float, default=180.0)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument(
        "--tombstones", type=int, nargs="+", default=[0, 100_000, 400_000, 1_500_000, 4_000_000]
    )
    args = parser.parse_args()
    options = None
    server = None
    base = Path(tempfile.mkdtemp(prefix="bench-clients-"))
    if args.store == "s3":
        from tests.object_store import new_bucket, server_options, start_s3_server

        server, endpoint = start_s3_server()
        options = server_options(endpoint)

        def path_of(name: str) -> str:
            return f"s3://{new_bucket(options, name)}/queues"
    else:

        def path_of(name: str) -> str:
            return f"{base}/{name}"

    def serve(name: str, messages: int) -> Iterator[tuple[str, Target]]:
        """For each ``--via``, a fresh table of ``messages`` and its target."""
        for via in args.via:
            path = path_of(f"{name}-{via}")
            fill(path, messages, queue=QUEUE, storage_options=options)
            with serving(path, options, via, base) as target:
                yield via, target

    print(f"store: {args.store}; via: {', '.join(args.via)}; {os.cpu_count()} cores")
    try:
        if "workers" in args.only:
            bench_workers(serve, args.workers, args.messages)
        if "steady" in args.only:
            bench_steady(serve, args.workers, args.seconds, args.steady_messages)
        if "raw" in args.only:
            bench_raw(serve, args.workers, args.seconds)
        if "slow" in args.only:
            bench_slow(serve, args.slow_workers, args.handler_ms, args.seconds)
        if "publishers" in args.only:
            bench_publishers(serve, args.publishers, args.seconds, args.via, args.rabbitmq)
        if "versus" in args.only:
            bench_versus(
                path_of, options, args.publishers, args.seconds, args.repeats, args.rabbitmq
            )
        if "latency" in args.only:
            bench_latency(serve, args.latency_messages)
        if "sustained" in args.only:
            bench_sustained(path_of, options, args.publishers, args.sustained_seconds, args.window)
        if "tombstones" in args.only:
            bench_tombstones(path_of, options, args.publishers, args.seconds, args.tombstones)
    finally:
        if server is not None:
            server.terminate()


if __name__ == "__main__":
    main()
