"""The `spark-queue` command on a real queue table: output, exit codes, messages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from spark_queue import QueueTable
from tests.helpers import messages, write_batch

pytestmark = pytest.mark.spark


def cli(path: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spark_queue.cli", "--path", path, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_commands_on_a_real_queue(spark, queue_path):
    declared = cli(queue_path, "declare", "orders", "--ring-size", "3")
    assert declared.returncode == 0
    assert json.loads(declared.stdout)["overflow"] == "ring"
    write_batch(messages(spark, list("abcd")), queue_path, queue="orders")
    assert cli(queue_path, "queues").stdout.split() == ["orders"]
    stats = json.loads(cli(queue_path, "stats", "orders", "--json").stdout)
    assert (stats["ready"], stats["replaced"]) == (3, 1)
    table = cli(queue_path, "stats").stdout
    assert table.splitlines()[0].split()[:3] == ["queue", "ready", "ready_bytes"]
    peeked = cli(queue_path, "peek", "orders", "--limit", "2").stdout.splitlines()
    assert [line.split()[-1] for line in peeked[1:]] == ["b", "c"]
    held = QueueTable(queue_path).lease("orders", "c", max_messages=2)["seq"].to_pylist()
    assert cli(queue_path, "cancel", "orders", str(held[0])).stdout.strip() == "cancelled 1"
    assert cli(queue_path, "ack", "orders", str(held[1])).stdout.strip() == "acked 1"
    assert cli(queue_path, "release", "c").stdout.strip() == "released 0"
    assert cli(queue_path, "alter", "orders", "--max-length", "1").returncode == 0
    assert cli(queue_path, "purge", "orders").stdout.strip() == "purged 2"
    assert json.loads(cli(queue_path, "compact").stdout)["written"] >= 0


def test_cli_errors_exit_non_zero_and_name_the_problem(queue_path):
    QueueTable(queue_path).declare("orders", max_length=5)
    missing = cli(queue_path, "stats", "nope")
    assert missing.returncode == 1 and "queue 'nope' does not exist" in missing.stderr
    mismatch = cli(queue_path, "declare", "orders", "--max-length", "6")
    assert mismatch.returncode == 1 and "maxLength: queue has 5, given 6" in mismatch.stderr
    bad = cli(queue_path, "declare", "other", "--overflow", "sideways")
    assert bad.returncode == 1 and "overflow must be one of" in bad.stderr
    usage = cli(queue_path, "frobnicate")
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
