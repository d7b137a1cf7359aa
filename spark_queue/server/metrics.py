"""Prometheus metrics of a queue table and of the broker that serves it (docs/BROKER.md,
"Metrics"), with ``prometheus-client``.

Queue metrics (:class:`QueueCollector`) are what ``QueueTable.stats`` says of every queue,
read from one table version, plus the age of each queue's oldest ready message. A scrape
reads them from a cached reading no older than :data:`REFRESH_SECONDS`: however often and
however many at once Prometheus scrapes, the table is read once a second at most. Without a
broker, ``spark-queue stats --format prometheus`` prints the same (:func:`queue_exposition`).

Broker metrics (:class:`BrokerMetrics`) are counted as requests end: per protocol
(``flight``, ``sqs``) and operation, requests, errors by kind and latency; per commit of the
group commit, its requests and its latency.
"""

from __future__ import annotations

import hmac
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import numpy as np
import pyarrow as pa
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import make_wsgi_app
from prometheus_client.registry import Collector

from spark_queue.broker.discovery import refuse_unguarded
from spark_queue.broker.wire import ROUTED_METHODS
from spark_queue.commit.group import group_of
from spark_queue.errors import TableNotFoundError
from spark_queue.rules import COUNTERS, QueueState, counters_and_gauges
from spark_queue.rules.change import HeadReader, LevelCursor
from spark_queue.storage.browse import settled_states
from spark_queue.storage.location import scrubbed
from spark_queue.storage.store import QueueStore, Snapshot, now_micros, require_queue
from spark_queue.table import QueueTable

log = logging.getLogger("spark_queue.server.metrics")

PREFIX = "spark_queue"
REFRESH_SECONDS = 1.0  # a scrape's queue metrics are at most this old
TOKEN_ENV_VAR = "SPARK_QUEUE_METRICS_TOKEN"
PATH = "/metrics"
# The queue gauges, as stats names them, and what each says.
GAUGES = {
    "ready": "ready messages",
    "ready_bytes": "the ready messages' body bytes",
    "leased": "messages leased to a consumer, not yet settled",
    "scheduled": "messages not due yet (deliver_at, a redelivery delay)",
}
# What each of stats' counters counts (SEMANTICS §4); a counter missing here is still
# exported, named by stats.
COUNTER_HELP = {
    "added": "messages enqueued (dead-lettered copies included)",
    "acked": "messages acknowledged",
    "replaced": "messages a ring queue replaced with newer ones",
    "dropped": "messages dropped at a limit",
    "rejected": "messages a reject policy refused (never added)",
    "expired": "messages that expired",
    "killed": "messages past their delivery or cancel limit",
    "dead_lettered": "copies of messages sent to the dead-letter queue",
    "purged": "messages purged",
    "duplicates": "messages refused as duplicates (never added)",
}
# The operations each protocol's metrics name; any other a client sends is "unknown", so a
# client cannot make a label value of its own.
FLIGHT_OPERATIONS = ROUTED_METHODS
UNKNOWN = "unknown"
# Requests per commit: powers of two up to the group commit's largest round.
ROUND_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25)


@dataclass(frozen=True)
class QueueReading:
    """Every queue's stats and oldest ready age, as of one table version."""

    version: int
    stats: Mapping[str, Mapping[str, int]]  # queue -> counters and gauges, as stats has them
    oldest_ready_age: Mapping[str, float]  # queue -> seconds (0: no ready message)


def read_queues(table: QueueTable, queue: str | None = None) -> QueueReading | None:
    """Every queue of ``table`` (or ``queue`` only) from one snapshot, as ``stats`` reads
    each (due scheduled messages and run-out leases counted as the next commit would);
    None: no table yet. A partitioned queue's are its partitions' added up (each from its
    table's latest version), its oldest ready message the oldest of theirs.

    Raises:
        QueueNotFoundError: no queue ``queue``.
    """
    store = table.store
    snapshot = store.snapshot()
    if snapshot is None:
        return None
    if queue is not None:
        require_queue(snapshot.states, queue, table.path)
    now = now_micros()
    states = settled_states(store, snapshot, now, None if queue is None else [queue])
    stats: dict[str, dict[str, int]] = {}
    ages: dict[str, float] = {}
    for name, state in sorted(states.items()):
        stats[name] = counters_and_gauges(state)
        enqueued_at = oldest_ready_enqueued_at(store, snapshot, state, now)
        for partition in range(1, state.arguments.partitions):  # a partitioned queue: summed
            part, oldest = _partition_reading(table, name, partition, now)
            stats[name] = {k: stats[name][k] + part[k] for k in stats[name]}
            enqueued_at = min((t for t in (enqueued_at, oldest) if t is not None), default=None)
        ages[name] = 0.0 if enqueued_at is None else max(0, now - enqueued_at) / 1e6
    return QueueReading(snapshot.version, stats, ages)


def _partition_reading(
    table: QueueTable, queue: str, partition: int, now: int
) -> tuple[dict[str, int], int | None]:
    """The counters and gauges of ``queue``'s partition table ``partition``, and the
    ``enqueued_at`` of its oldest ready message (None: none)."""
    store = table.partitioned.store_of(queue, partition)
    snapshot = store.snapshot()
    if snapshot is None:
        raise TableNotFoundError(store.uri)
    state = settled_states(store, snapshot, now, [queue])[queue]
    return counters_and_gauges(state), oldest_ready_enqueued_at(store, snapshot, state, now)


def oldest_ready_enqueued_at(
    store: QueueStore, snapshot: Snapshot, state: QueueState, now: int
) -> int | None:
    """The ``enqueued_at`` (microseconds) of the oldest of the messages first in line at
    each priority of ``state`` (settled at ``now``); None where nothing is ready. Within a
    priority, head order is arrival order, so this takes one message a priority, from the
    rows a lease would read (through the same row cache)."""
    times = []
    for priority, level in state.levels.items():
        if not level.ready:
            continue
        reader = _Recording(store.head_reader(snapshot))
        seqs = LevelCursor(reader, state, priority, now).pop(1)[0]
        if not len(seqs):
            continue
        seen = reader.enqueued_at(int(seqs[0]))
        if seen is None:  # below the head (returned, or due after a delay): read its row
            rows = store.read_messages(snapshot, state.name, seqs, ["seq", "enqueued_at"])
            found = rows.column("enqueued_at").cast(pa.int64()).drop_null().to_pylist()
            seen = found[0] if found else None
        if seen is not None:
            times.append(seen)
    return min(times) if times else None


class _Recording:
    """A head reader that keeps the rows it hands out, for their ``enqueued_at``."""

    def __init__(self, reader: HeadReader) -> None:
        self.reader = reader
        self.batches: list[pa.Table] = []

    def read(self, queue: str, priority: int, from_seq: int) -> Iterator[pa.Table]:
        for batch in self.reader.read(queue, priority, from_seq):
            self.batches.append(batch)
            yield batch

    def keys(self, queue: str, seqs: np.ndarray) -> pa.Array:
        return self.reader.keys(queue, seqs)

    def enqueued_at(self, seq: int) -> int | None:
        for batch in self.batches:
            at = np.flatnonzero(batch.column("seq").to_numpy() == seq)
            if len(at):
                value = batch.column("enqueued_at")[int(at[0])].as_py()
                return None if value is None else int(value)
        return None


class QueueCollector(Collector):
    """The queue metrics of ``table``, read at most once per ``max_age`` seconds of
    ``clock``: a scrape within it gets the cached reading. Scrapes at once wait for one
    read. :attr:`reads` counts the table reads (exported as
    ``spark_queue_metrics_reads_total``)."""

    def __init__(
        self,
        table: QueueTable,
        max_age: float = REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = table
        self.max_age = max_age
        self.clock = clock
        self.reads = 0
        self.failed_reads = 0
        self._lock = threading.Lock()
        self._reading: QueueReading | None = None
        self._read_at = -float("inf")

    def reading(self) -> QueueReading | None:
        """The cached reading, read again if it is ``max_age`` old; None where there is
        no table, or its last read failed (logged, counted in :attr:`failed_reads`: the
        broker's own metrics are still served, and the next read is a second later)."""
        with self._lock:
            if self.clock() - self._read_at >= self.max_age:
                self._read_at = self.clock()
                self.reads += 1
                try:
                    self._reading = read_queues(self.table)
                except Exception as error:
                    self._reading = None
                    self.failed_reads += 1
                    text = scrubbed(str(error), self.table.store.location.options)
                    log.warning(
                        "the queue metrics could not be read: %s: %s", type(error).__name__, text
                    )
            return self._reading

    def collect(self) -> Iterator[Metric]:
        reading = self.reading()
        yield from queue_families(reading)
        reads = CounterMetricFamily(
            f"{PREFIX}_metrics_reads", "table reads for the queue metrics (once a second at most)"
        )
        reads.add_metric([], self.reads)
        yield reads
        failed = CounterMetricFamily(
            f"{PREFIX}_metrics_read_errors",
            "table reads for the queue metrics that failed (no queue metrics until the next)",
        )
        failed.add_metric([], self.failed_reads)
        yield failed


def queue_families(reading: QueueReading | None) -> Iterator[Metric]:
    """The queue metrics of ``reading`` (no table: none but the table version's absence)."""
    if reading is None:
        return
    version = GaugeMetricFamily(f"{PREFIX}_table_version", "the table version the metrics read")
    version.add_metric([], reading.version)
    yield version
    for name, text in GAUGES.items():
        family = GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=["queue"])
        for queue, stats in reading.stats.items():
            family.add_metric([queue], stats[name])
        yield family
    age = GaugeMetricFamily(
        f"{PREFIX}_oldest_ready_age_seconds",
        "how long the oldest message first in line has waited since it was enqueued",
        labels=["queue"],
    )
    for queue, seconds in reading.oldest_ready_age.items():
        age.add_metric([queue], seconds)
    yield age
    for counter in COUNTERS:
        total = CounterMetricFamily(
            f"{PREFIX}_{counter}",
            COUNTER_HELP.get(counter, f"stats' counter {counter}"),
            labels=["queue"],
        )
        for queue, stats in reading.stats.items():
            total.add_metric([queue], stats[counter])
        yield total


def queue_exposition(table: QueueTable, queue: str | None = None) -> str:
    """The queue metrics of ``table`` (or of ``queue`` only) now, in Prometheus's text
    format (for node_exporter's textfile collector); empty where there is no table.

    Raises:
        QueueNotFoundError: no queue ``queue``.
    """
    reading = read_queues(table, queue)
    registry = CollectorRegistry(auto_describe=False)

    class Once(Collector):
        def collect(self) -> Iterable[Metric]:
            return queue_families(reading)

    registry.register(Once())
    return generate_latest(registry).decode()


class BrokerMetrics:
    """A broker's metrics: its table's queues (:class:`QueueCollector`), its requests by
    protocol and operation, its group commit's rounds. Thread-safe."""

    def __init__(self, table: QueueTable, sqs_operations: Iterable[str] = ()) -> None:
        # No ``*_created`` series (when each labelled series began): a broker's series
        # begin with it, and they would double what a scrape carries.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=False)
        self.queues = QueueCollector(table)
        self.registry.register(self.queues)
        labels = ["protocol", "operation"]
        self.requests = Counter(
            f"{PREFIX}_requests", "requests answered", labels, registry=self.registry
        )
        self.errors = Counter(
            f"{PREFIX}_request_errors",
            "requests answered with an error, by its kind (the table's error class for "
            "Flight, the error code for SQS)",
            [*labels, "error"],
            registry=self.registry,
        )
        self.latency = Histogram(
            f"{PREFIX}_request_seconds",
            "seconds from a request's start to its answer",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.round_requests = Histogram(
            f"{PREFIX}_commit_requests",
            "requests in one commit of the group commit",
            buckets=ROUND_BUCKETS,
            registry=self.registry,
        )
        self.commit_latency = Histogram(
            f"{PREFIX}_commit_seconds",
            "seconds from a round's start to its landed commit (lost races included)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.conflicts = Counter(
            f"{PREFIX}_commit_conflicts",
            "commit attempts lost to another writer (each planned again)",
            registry=self.registry,
        )
        self._known = {
            "flight": frozenset(FLIGHT_OPERATIONS),
            "sqs": frozenset(sqs_operations),
        }
        # Each known operation's children made once: a request finds them in a dict.
        self._children = {
            (protocol, operation): (
                self.requests.labels(protocol, operation),
                self.latency.labels(protocol, operation),
            )
            for protocol, operations in self._known.items()
            for operation in (*operations, UNKNOWN)
        }
        group_of(table.store.location).observer = self.observe_round

    def observer(self, protocol: str) -> Callable[[str, float, str | None], None]:
        """The per-request hook of ``protocol``'s server: ``(operation, seconds, error)``,
        where ``error`` is None for an answer and the error's kind for a refusal."""

        def observe(operation: str, seconds: float, error: str | None) -> None:
            self.observe_request(protocol, operation, seconds, error)

        return observe

    def observe_request(
        self, protocol: str, operation: str, seconds: float, error: str | None
    ) -> None:
        if operation not in self._known[protocol]:
            operation = UNKNOWN
        count, latency = self._children[protocol, operation]
        count.inc()
        latency.observe(seconds)
        if error is not None:
            self.errors.labels(protocol, operation, error).inc()

    def observe_round(self, requests: int, seconds: float, attempts: int) -> None:
        self.round_requests.observe(requests)
        self.commit_latency.observe(seconds)
        if attempts > 1:
            self.conflicts.inc(attempts - 1)


def check_metrics_token(host: str, token: str | None, tls: bool) -> None:
    """Metrics served beyond loopback must ask for a token, over HTTPS: a bearer token sent
    in clear text would serve whoever saw it for as long as the broker runs.

    Raises:
        InvalidOptionError: ``host`` is not loopback and there is no token, or no TLS.
    """
    refuse_unguarded(
        host,
        bool(token),
        "the metrics would be served",
        f"without a token: give one with ${TOKEN_ENV_VAR} (Prometheus sends it as a bearer "
        f"token), or serve them on 127.0.0.1",
        tls=tls,
    )


def _guarded(app: Any, token: str | None) -> Any:
    """``app`` at :data:`PATH` only, behind ``Authorization: Bearer <token>`` when given."""
    expected = None if token is None else f"Bearer {token}".encode()

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") != PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"not found: the metrics are at {PATH}\n".encode()]
        given = environ.get("HTTP_AUTHORIZATION", "").encode()
        if expected is not None and not hmac.compare_digest(given, expected):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")],
            )
            return [b"the metrics need this broker's metrics token as a bearer token\n"]
        return app(environ, start_response)

    return guarded


class _Quiet(WSGIRequestHandler):
    timeout = 60  # seconds a connection may idle before it is closed

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


class MetricsServer:
    """``metrics`` at ``http(s)://host:port/metrics`` (port 0: a free one, then
    :attr:`port`), by the standard library's WSGI server on threads of its own, with
    prometheus-client's exposition (content negotiation, compression).

    Raises:
        OSError: it cannot listen there, or a TLS file cannot be read.
    """

    def __init__(
        self,
        metrics: BrokerMetrics,
        host: str,
        port: int,
        *,
        token: str | None = None,
        tls_files: tuple[str, str] | None = None,
    ) -> None:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

        class Server(ThreadingMixIn, WSGIServer):
            address_family = family
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                """One line, not socketserver's traceback (plain HTTP to HTTPS, say)."""
                log.info("a metrics connection failed: %s", sys.exc_info()[1])

        app = _guarded(make_wsgi_app(metrics.registry), token)
        self._server = make_server(host, port, app, Server, handler_class=_Quiet)
        self.scheme = "http"
        if tls_files is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(tls_files[0], tls_files[1])
            # Each handshake in its connection's thread, not in the one that accepts: a
            # client that connects and says nothing holds up no other scrape.
            self._server.socket = context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
            self.scheme = "https"
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-server", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{shown}:{self.port}{PATH}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
