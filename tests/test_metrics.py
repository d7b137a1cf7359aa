"""Prometheus metrics (docs/BROKER.md, "Metrics"): a real broker process's ``/metrics``,
read with prometheus-client's own text parser, agrees with ``stats``; the queue metrics
are read from the table once a second at most; ``spark-queue stats --format prometheus``
agrees with ``--format json``. No Spark."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Any

import boto3
import botocore.exceptions
import pyarrow.flight as flight
import pytest
from botocore.config import Config
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from spark_queue import QueueTable
from spark_queue.cli import main
from spark_queue.commit.group import group_of
from spark_queue.errors import QueueNotFoundError
from spark_queue.rules import COUNTERS
from spark_queue.server.metrics import QueueCollector, read_queues
from spark_queue.storage import table_view
from tests.brokers import BrokerProcess

GAUGES = ("ready", "ready_bytes", "leased", "scheduled")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    return found[name, tuple(sorted(labels.items()))]


def scrape(url: str, token: str | None = None, context: ssl.SSLContext | None = None) -> str:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=60, context=context) as answer:
        return answer.read().decode()


def metrics_url(broker: BrokerProcess) -> str:
    return broker.announcement.split("metrics at ", 1)[1].split()[0]


def assert_agrees_with_stats(found: Samples, table: QueueTable, queues: list[str]) -> None:
    """The scraped queue metrics are exactly ``stats`` of each queue."""
    for queue in queues:
        stats = table.stats(queue)
        scraped = {name: value(found, f"spark_queue_{name}", queue=queue) for name in GAUGES}
        scraped |= {c: value(found, f"spark_queue_{c}_total", queue=queue) for c in COUNTERS}
        assert scraped == {name: stats[name] for name in (*GAUGES, *COUNTERS)}, queue


def traffic(table: QueueTable) -> dict[str, int]:
    """Publishes, leases, acks and a cancel on three queues (a ring that replaces, a
    priority, a scheduled message, an empty queue); the Flight calls made, by operation."""
    table.declare("ring", ring_size=2)
    table.declare("idle")
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    table.publish("orders", ["a", "b", "c"])
    table.publish("orders", [{"body": "urgent", "priority": 5}])
    table.publish("orders", [{"body": "later", "deliver_at": later}])
    table.publish("ring", ["r1", "r2", "r3"])
    leased = table.lease("orders", "worker", max_messages=3, lease_period=3_600_000)
    seqs = leased["seq"].to_pylist()
    table.ack("orders", seqs[:1], "worker")
    table.cancel("orders", seqs[1:2], "worker", delay=0)
    return {"publish": 4, "lease": 1, "ack": 1, "cancel": 1}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("metrics")
    path = str(folder / "queues")
    flags = ("--metrics", "127.0.0.1:0", "--sqs", "127.0.0.1:0")
    with BrokerProcess(path, *flags, log_path=folder / "broker.log") as process:
        yield process


def test_a_scrape_agrees_with_stats_and_counts_every_request(broker):
    started = time.time()
    table = QueueTable(broker.path, broker=broker.address)
    calls = traffic(table)
    with pytest.raises(QueueNotFoundError):  # a refused request: an error of its kind
        table.stats("nowhere")
    sqs = boto3.client(
        "sqs",
        endpoint_url=broker.announcement.split("SQS API at ", 1)[1].split()[0],
        region_name="eu-west-1",
        aws_access_key_id="any",
        aws_secret_access_key="any",
        config=Config(retries={"max_attempts": 1}),
    )
    sqs.send_message(QueueUrl=sqs.get_queue_url(QueueName="idle")["QueueUrl"], MessageBody="s")
    with pytest.raises(botocore.exceptions.ClientError):
        sqs.get_queue_url(QueueName="nowhere")
    # Names a client makes up are counted as "unknown", never as labels of their own.
    bogus = urllib.request.Request(
        sqs.meta.endpoint_url + "/",
        data=b"{}",
        headers={
            "X-Amz-Target": "AmazonSQS.MadeUp",
            "Content-Type": "application/x-amz-json-1.0",
        },
    )
    with pytest.raises(urllib.error.HTTPError) as unknown:
        urllib.request.urlopen(bogus, timeout=60)
    assert unknown.value.code == 400
    with pytest.raises(flight.FlightServerError, match="malformed request"):
        list(flight.connect(f"grpc://{broker.address}").do_action(flight.Action("made-up", b"")))
    elapsed = time.time() - started

    found = samples(scrape(metrics_url(broker)))
    direct = QueueTable(broker.path, broker="off")
    queues = ["idle", "orders", "ring"]
    assert_agrees_with_stats(found, direct, queues)
    assert value(found, "spark_queue_table_version") == direct.store.open().version()
    assert value(found, "spark_queue_replaced_total", queue="ring") == 1
    assert value(found, "spark_queue_scheduled", queue="orders") == 1
    # The oldest ready message waited since the traffic began, at most.
    for queue in ("orders", "ring", "idle"):
        age = value(found, "spark_queue_oldest_ready_age_seconds", queue=queue)
        assert 0 < age < elapsed + (time.time() - started), queue
    assert value(found, "spark_queue_metrics_reads_total") == 1

    by_flight = {"protocol": "flight"}
    for operation, count in calls.items():
        assert value(found, "spark_queue_requests_total", **by_flight, operation=operation) == count
        assert (
            value(found, "spark_queue_request_seconds_count", **by_flight, operation=operation)
            == count
        )
    assert value(found, "spark_queue_requests_total", **by_flight, operation="stats") == 1
    errors = {
        tuple(dict(labels)[k] for k in ("protocol", "operation", "error")): count
        for (name, labels), count in found.items()
        if name == "spark_queue_request_errors_total"
    }
    assert errors == {
        ("flight", "stats", "QueueNotFoundError"): 1,
        ("flight", "unknown", "BrokerRequestError"): 1,
        ("sqs", "GetQueueUrl", "QueueDoesNotExist"): 1,
        ("sqs", "unknown", "UnknownOperationException"): 1,
    }
    sqs_calls = {"GetQueueUrl": 2, "SendMessage": 1, "unknown": 1}
    for operation, count in sqs_calls.items():
        assert value(found, "spark_queue_requests_total", protocol="sqs", operation=operation) == (
            count
        )
    # Every committed round: its requests and its latency. The publishes, the lease, the
    # ack, the cancel and SQS's send commit; stats and lookups do not.
    rounds = value(found, "spark_queue_commit_requests_count")
    assert rounds >= 1
    assert value(found, "spark_queue_commit_seconds_count") == rounds
    assert rounds <= value(found, "spark_queue_commit_requests_sum") <= sum(calls.values()) + 1
    assert value(found, "spark_queue_commit_conflicts_total") >= 0  # exported


def test_rapid_scrapes_read_the_table_once_a_second_at_most(broker):
    url = metrics_url(broker)
    before = value(samples(scrape(url)), "spark_queue_metrics_reads_total")
    started = time.monotonic()
    scrapes = 40
    for _ in range(scrapes):
        found = samples(scrape(url))
    seconds = time.monotonic() - started
    reads = value(found, "spark_queue_metrics_reads_total") - before
    # One read a second at most, plus one at the start of the run: however slow the
    # machine, never one a scrape.
    assert reads <= seconds + 1
    assert reads < scrapes


def test_the_queue_metrics_refresh_once_per_second_of_the_clock(tmp_path):
    """The refresh rule on its own, on a clock the test moves: scrapes within a second of
    a read get its values; the first one after gets the table's."""
    table = QueueTable(str(tmp_path / "queues"), broker="off")
    table.publish("q", ["a"])
    now = [100.0]
    collector = QueueCollector(table, clock=lambda: now[0])
    first = collector.reading()
    assert first is not None and first.stats["q"]["ready"] == 1
    table.publish("q", ["b"])
    for moment in (100.0, 100.5, 100.999):
        now[0] = moment
        assert collector.reading() is first
    assert collector.reads == 1
    now[0] = 101.0
    second = collector.reading()
    assert second is not first and second is not None
    assert second.stats["q"]["ready"] == 2 and collector.reads == 2
    assert second.stats["q"] == {
        k: v for k, v in table.stats("q").items() if k in second.stats["q"]
    }


def test_a_failed_read_leaves_out_the_queue_metrics_and_is_counted(tmp_path, caplog):
    """A store that fails a read: the scrape still answers, with the read counted as
    failed and no queue metrics (none stale), and the failure is logged."""
    path = tmp_path / "queues"
    QueueTable(str(path), broker="off").publish("q", ["a", "b"])
    for data in path.rglob("*.parquet"):
        if "_delta_log" not in data.parts:
            data.write_bytes(b"not parquet")
    table_view.forget()  # what this process knows: read as another process reads it
    registry = CollectorRegistry(auto_describe=False)
    collector = QueueCollector(QueueTable(str(path), broker="off"))
    registry.register(collector)
    found = samples(generate_latest(registry).decode())
    assert value(found, "spark_queue_metrics_read_errors_total") == 1
    assert value(found, "spark_queue_metrics_reads_total") == 1
    assert not [name for name, _ in found if name == "spark_queue_ready"]
    assert "the queue metrics could not be read" in caplog.text


def test_an_empty_queue_has_no_age_and_a_missing_table_no_metrics(tmp_path):
    path = str(tmp_path / "queues")
    assert read_queues(QueueTable(path, broker="off")) is None
    table = QueueTable(path, broker="off")
    table.publish("q", ["a"])
    held = table.lease("q", "c")["seq"].to_pylist()
    table.ack("q", held, "c")
    reading = read_queues(table)
    assert reading is not None and reading.oldest_ready_age == {"q": 0.0}
    with pytest.raises(QueueNotFoundError):
        read_queues(table, "other")


def test_the_group_commit_tells_its_observer_of_each_commit(tmp_path):
    table = QueueTable(str(tmp_path / "queues"), broker="off")
    table.declare("empty")  # a direct commit, before the group's first
    table.publish("q", ["a"])
    seen: list[tuple[int, float, int]] = []
    group = group_of(table.store.location)
    group.observer = lambda requests, seconds, attempts: seen.append((requests, seconds, attempts))
    try:
        table.publish("q", ["b"])
        assert table.lease("empty", "c").num_rows == 0  # commits nothing: not told
    finally:
        group.observer = None
    assert [(requests, attempts) for requests, _, attempts in seen] == [(1, 1)]
    assert seen[0][1] > 0


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``spark-queue ARGS`` in this process: its exit code, stdout and stderr."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_stats_in_prometheus_format_agrees_with_json(tmp_path, capsys):
    path = str(tmp_path / "queues")
    traffic(QueueTable(path, broker="off"))
    code, prometheus, _ = cli(capsys, "--path", path, "stats", "--format", "prometheus")
    assert code == 0
    found = samples(prometheus)
    _, as_json, _ = cli(capsys, "--path", path, "stats", "--format", "json")
    assert as_json == cli(capsys, "--path", path, "stats", "--json")[1]
    rows = [json.loads(line) for line in as_json.splitlines()]
    assert [row["queue"] for row in rows] == ["idle", "orders", "ring"]
    for row in rows:
        queue = row["queue"]
        for name in GAUGES:
            assert value(found, f"spark_queue_{name}", queue=queue) == row[name], (queue, name)
        for counter in COUNTERS:
            assert value(found, f"spark_queue_{counter}_total", queue=queue) == row[counter]
    _, ring, _ = cli(capsys, "--path", path, "stats", "ring", "--format", "prometheus")
    assert {labels for (name, labels) in samples(ring) if name == "spark_queue_ready"} == {
        (("queue", "ring"),)
    }
    code, _, missing = cli(capsys, "--path", path, "stats", "nowhere", "--format", "prometheus")
    assert code == 1 and "queue 'nowhere' does not exist" in missing
    code, _, bad = cli(capsys, "--path", path, "stats", "--format", "csv")
    assert code == 2 and "argument --format: must be one of table, json, prometheus" in bad


def test_metrics_beyond_loopback_need_a_token_and_scrapes_carry_it(tmp_path, capsys):
    """Beyond loopback without a token, or with one but without TLS: no start. With a token
    (and the broker's TLS): a scrape without it, or with another, gets 401; other paths
    404; the token shows nowhere."""
    from tests.test_broker import self_signed

    path = str(tmp_path / "queues")
    code, _, refused = cli(capsys, "broker", path, "--metrics", "0.0.0.0:0")
    assert code == 2 and "$SPARK_QUEUE_METRICS_TOKEN" in refused
    clear = subprocess.run(  # a process of its own: a broker that started would not return
        [sys.executable, "-m", "spark_queue.cli", "broker", path, "--metrics", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SPARK_QUEUE_METRICS_TOKEN": "metrics-secret"},
    )
    assert clear.returncode == 2
    assert "without TLS: give --tls-cert and --tls-key" in clear.stderr
    assert "metrics-secret" not in clear.stderr and not (tmp_path / "queues").exists()
    code, _, bad_address = cli(capsys, "broker", path, "--metrics", "nowhere")
    assert code == 2 and "--metrics takes HOST:PORT" in bad_address
    token = "metrics-secret"
    cert, key = self_signed(tmp_path)
    trusted = ssl.create_default_context(cafile=str(cert))
    with BrokerProcess(
        path,
        *("--metrics", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key)),
        log_path=tmp_path / "broker.log",
        env={"SPARK_QUEUE_METRICS_TOKEN": token},
    ) as broker:
        url = metrics_url(broker)
        assert url.startswith("https://127.0.0.1:") and "(token required)" in broker.announcement
        for wrong in (None, "other"):
            with pytest.raises(urllib.error.HTTPError) as answer:
                scrape(url, wrong, trusted)
            assert answer.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as elsewhere:
            scrape(url.replace("/metrics", "/other"), token, trusted)
        assert elsewhere.value.code == 404
        assert "spark_queue_metrics_reads_total" in scrape(url, token, trusted)
        assert broker.stop() == 0
    assert token not in broker.output()
