"""The notebooks in notebooks/ run end to end, and are valid Databricks source files.

Each notebook is executed in this process with the shared ``spark`` session predefined, as
Databricks predefines it (in the Connect pass a Spark Connect session, as on serverless):
the notebook's code is the code users run, cell by cell, and the test reads the notebook's
own variables (what it produced, consumed, charted) to check them. One run uses stand-ins
for Databricks' ``dbutils.widgets`` and ``display`` to cover the notebook's Databricks
branch; one runs a notebook as a script in its own process, as ``python
notebooks/monitoring.py`` does, to cover the branch that builds a local session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_queue import QueueTable
from spark_queue.rules import identity_holds

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
HEADER = "# Databricks notebook source\n"
SEPARATOR = "\n\n# COMMAND ----------\n\n"
PATH_ENV = "SPARK_QUEUE_NOTEBOOK_PATH"


class Widgets:
    """``dbutils.widgets``: what the notebook declares, and the values a job would pass."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.declared: dict[str, str] = {}

    def text(self, name: str, default: str, label: str) -> None:
        self.declared[name] = label

    def get(self, name: str) -> str:
        return self.values[name]


class DBUtils:
    def __init__(self, values: dict[str, str]) -> None:
        self.widgets = Widgets(values)


def run_notebook(name: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Execute a notebook top to bottom in ``namespace``; returns its variables."""
    path = NOTEBOOKS / name
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


@pytest.mark.parametrize("name", ["quickstart.py", "monitoring.py"])
def test_notebooks_are_databricks_source_files(name):
    text = (NOTEBOOKS / name).read_text()
    assert text.startswith(HEADER)
    cells = text[len(HEADER) :].split(SEPARATOR)
    assert len(cells) >= 6
    assert "# COMMAND" not in "".join(cells)  # every separator has its blank lines
    for cell in cells:
        lines = cell.strip("\n").splitlines()
        assert lines, "empty cell"
        if lines[0].startswith("# MAGIC"):
            # A magic cell is magic throughout, and is a comment to Python.
            assert lines[0] in ("# MAGIC %md",) or lines[0].startswith("# MAGIC %pip install")
            assert all(line.startswith("# MAGIC") for line in lines), cell
        else:
            assert not any(line.startswith(("%", "!")) for line in lines), cell
    assert "%pip install" in text
    compile(text, name, "exec")


@pytest.mark.connect
@pytest.mark.spark
def test_quickstart_produces_consumes_and_reads_the_table(spark, tmp_path, monkeypatch):
    monkeypatch.setenv(PATH_ENV, str(tmp_path))
    notebook = run_notebook("quickstart.py", {"spark": spark})
    assert notebook["QUEUES"] == f"{tmp_path}/queues"

    produced = notebook["stats_after_produce"]
    assert (produced["added"], produced["replaced"], produced["ready"]) == (150, 50, 100)
    survivors = [f"order-{i}" for i in range(50, 150)]  # the ring keeps the newest 100
    assert notebook["browsed_ids"] == survivors  # in delivery order

    consumed: DataFrame = notebook["consumed"]
    expected = spark.createDataFrame(
        [(f"order-{i}", i, i * 1.5, 1) for i in range(50, 150)],
        "message_id string, order_id bigint, amount double, delivery_count int",
    )
    assert_df_equality(
        consumed.select("message_id", "order_id", "amount", "delivery_count"),
        expected,
        ignore_row_order=True,
        ignore_nullable=True,
    )
    assert len(notebook["consumer"].recentProgress) >= 3  # maxMessagesPerTrigger=40

    after = notebook["stats_after_consume"]
    assert (after["acked"], after["ready"], after["leased"]) == (100, 0, 0)
    assert identity_holds(after)
    # Time travel to the produce commit shows the counters as they were then.
    assert [tuple(r) for r in notebook["counters_then"].collect()] == [(150, 50, 0)]
    outcomes = {
        (r.outcome, r["count"])
        for r in notebook["raw"].where("record = 'removal'").groupBy("outcome").count().collect()
    }
    assert outcomes == {("replaced", 50), ("acked", 100)}


def run_partitioned(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, partitions: int
) -> tuple[dict[str, Any], QueueTable]:
    """Notebook ``name`` run with its queue declared with ``partitions`` (the widget's local
    stand-in), and a client of its queue table."""
    monkeypatch.setenv(PATH_ENV, str(tmp_path))
    monkeypatch.setenv("SPARK_QUEUE_NOTEBOOK_PARTITIONS", str(partitions))
    notebook = run_notebook(name, {"spark": spark})
    return notebook, QueueTable(notebook["QUEUES"])


@pytest.mark.spark
def test_quickstart_on_a_partitioned_queue(spark, tmp_path, monkeypatch):
    notebook, table = run_partitioned(spark, tmp_path, monkeypatch, "quickstart.py", 3)
    assert table.arguments("orders").partitions == 3
    per_partition = table.partition_stats("orders")
    assert all(stats["added"] for stats in per_partition)  # keys customer-0 .. customer-6
    produced = notebook["stats_after_produce"]
    assert produced["added"] == 150
    assert [s["added"] - s["replaced"] for s in per_partition] == [
        min(100, s["added"]) for s in per_partition
    ]  # each partition keeps its newest 100
    assert notebook["consumed"].count() == produced["ready"]
    after = notebook["stats_after_consume"]
    assert (after["acked"], after["ready"], after["leased"]) == (produced["ready"], 0, 0)
    assert identity_holds(after)


@pytest.mark.spark
def test_quickstart_on_databricks_needs_its_base_path(spark, tmp_path):
    dbutils = DBUtils({"base_path": ""})
    with pytest.raises(ValueError, match="set the base_path widget"):
        run_notebook("quickstart.py", {"spark": spark, "dbutils": dbutils, "display": print})
    assert dbutils.widgets.declared.keys() == {"base_path"}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.connect
@pytest.mark.spark
def test_monitoring_charts_depth_and_losses_from_the_history(spark, tmp_path):
    queues = str(tmp_path / "queues")
    dbutils = DBUtils({"queue_table": queues, "queue": "", "partitions": ""})
    displayed: list[Any] = []
    notebook = run_notebook(
        "monitoring.py", {"spark": spark, "dbutils": dbutils, "display": displayed.append}
    )
    assert dbutils.widgets.declared.keys() == {"queue_table", "queue", "partitions"}
    assert notebook["DEMO"] is True

    rows = notebook["history"].to_pylist()
    events = [r for r in rows if r["queue"] == "events"]
    dlq = {r["version"]: r for r in rows if r["queue"] == "events.dlq"}
    for row in rows:
        assert identity_holds(row), row
    assert all(r["max_length"] == 50 and r["ready"] <= 50 for r in events)  # drop-head
    enqueues = [r for r in events if r["operation"] == "ENQUEUE"]
    assert [r["added"] for r in enqueues] == [20, 40, 60, 80, 100, 120]
    assert [r["leased"] for r in events if r["operation"].startswith("LEASE")] == [8] * 6
    acks = [r for r in events if r["operation"].startswith("ACK")]
    assert [r["acked"] for r in acks] == [8, 16, 24, 32, 40, 48]
    assert all(r["leased"] == 0 for r in acks)
    last = events[-1]
    assert last["dropped"] > 0 and last["expired"] > 0
    for row in events:  # every drop and expiry is dead-lettered, in the same commit
        assert row["dead_lettered"] == row["dropped"] + row["expired"]
        if row["dead_lettered"]:
            assert dlq[row["version"]]["added"] == row["dead_lettered"]
    stats = QueueTable(queues).stats("events")
    assert {k: last[k] for k in ("ready", "dropped", "expired", "acked", "added")} == {
        k: stats[k] for k in ("ready", "dropped", "expired", "acked", "added")
    }

    # Per-commit changes add up to the counters.
    totals = {
        r.queue: r
        for r in notebook["changes"]
        .groupBy("queue")
        .agg(*[F.sum(f"{c}_in_commit").alias(c) for c in ("added", "dropped", "dead_lettered")])
        .collect()
    }
    assert (totals["events"].added, totals["events"].dropped) == (120, last["dropped"])
    assert totals["events"].dead_lettered == last["dead_lettered"]

    # On Databricks the chart is display() of the series, one row per queue and commit.
    charted = displayed[-1]
    assert isinstance(charted, DataFrame)
    assert {"version", "timestamp", "queue", "ready", "leased", "dropped"} <= set(charted.columns)
    assert charted.count() == len(rows)


@pytest.mark.spark
def test_monitoring_charts_each_partition_of_a_partitioned_queue(spark, tmp_path, monkeypatch):
    notebook, table = run_partitioned(spark, tmp_path, monkeypatch, "monitoring.py", 2)
    assert table.arguments("events").partitions == 2 and table.queues() == ["events"]
    rows = notebook["history"].to_pylist()
    for row in rows:
        assert identity_holds(row), row
    last = {}
    for row in rows:  # each partition's history in its table's version order
        last[row["partition"]] = row
    assert sorted(last) == [0, 1]
    assert all(row["ready"] <= 50 for row in rows)  # max_length holds per partition
    stats = table.partition_stats("events")
    assert [last[k]["added"] for k in (0, 1)] == [s["added"] for s in stats]
    assert sum(s["added"] for s in stats) == 120
    by_partition = {
        r.partition: r.added
        for r in notebook["changes"]
        .groupBy("partition")
        .agg(F.sum("added_in_commit").alias("added"))
        .collect()
    }
    assert by_partition == {k: stats[k]["added"] for k in (0, 1)}


@pytest.mark.spark
def test_monitoring_runs_as_a_local_script(tmp_path):
    env = {
        **os.environ,
        PATH_ENV: str(tmp_path),
        "SPARK_QUEUE_NOTEBOOK_QUEUE": "events",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, str(NOTEBOOKS / "monitoring.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert f"queue table: {tmp_path}/queues" in result.stdout
    # No matplotlib in the test environment: the series is printed as a table.
    chart = "chart: " in result.stdout
    assert chart or "matplotlib is not installed: the series as a table" in result.stdout
    history = QueueTable(str(tmp_path / "queues")).history("events")
    assert history.num_rows == 19  # declare, then 6 x (enqueue, lease, ack)
    assert identity_holds(history.to_pylist()[-1])
