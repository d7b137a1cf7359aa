"""The jobs (jobs/*.py): run as their own processes, as a user or ``make demo`` runs them,
and called in this process's session, as a notebook calls ``main(argv, spark=spark)``
(each process a job starts costs a JVM: seconds of the suite's time)."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chispa import assert_df_equality

from spark_queue import QueueTable
from tests.helpers import assert_identity, bodies, messages, write_batch

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "jobs"


def run_job(
    job: str, *args: object, check: bool = True, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``jobs/<job>.py`` with this interpreter (and the checkout first on the path)."""
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, str(JOBS / f"{job}.py"), *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{job} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return result


def job_module(job: str):
    """Import ``jobs/<job>.py`` as a module (its folder on the path, as when it runs)."""
    if str(JOBS) not in sys.path:
        sys.path.insert(0, str(JOBS))
    return importlib.import_module(job)


def call_job(
    spark, job: str, *args: object, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``jobs/<job>.py``'s ``main`` called in ``spark`` (the job leaves it running), its
    output and exit status captured as :func:`run_job` captures a process's."""
    module = job_module(job)
    argv = [str(a) for a in args]
    out, err, status = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            module.main(argv, spark=spark)
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else 1
    result = subprocess.CompletedProcess([job, *argv], status, out.getvalue(), err.getvalue())
    if check and status != 0:
        raise AssertionError(f"{job} exited {status}:\n{result.stderr[-4000:]}")
    return result


def on_disk(table: str, file: str) -> bool:
    """Whether a file vacuum named (relative to the table, or absolute) is on disk."""
    return (Path(table) / file).exists() or Path(file.removeprefix("file://")).exists()


def last_json(result: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("job", "options"),
    [
        (
            "produce",
            ["--source", "--input", "--format", "--schema", "--body", "--key", "--headers",
             "--ring-size", "--max-length", "--overflow", "--trigger", "--checkpoint",
             "--remote"],
        ),
        (
            "consume",
            ["--path", "--queue", "--consumer", "--output", "--checkpoint",
             "--max-messages-per-trigger", "--max-bytes-per-trigger", "--lease-period",
             "--filter", "--trigger", "--remote"],
        ),
        ("maintain", ["--path", "--queue", "--steps", "--retention-hours", "--dry-run", "--json"]),
    ],
)  # fmt: skip
def test_help_explains_every_option(job, options):
    result = run_job(job, "--help")
    missing = [o for o in options if o not in result.stdout]
    assert not missing, f"{job} --help lacks {missing}"


@pytest.mark.parametrize(
    ("job", "args", "named"),
    [
        ("produce", ["--source", "files", "--input", "x", "--checkpoint", "c"], "--format"),
        ("produce", ["--source", "delta", "--input", "x"], "--checkpoint"),
        ("produce", ["--ring-size", "-5"], "--ring-size"),
        ("produce", ["--trigger", "once"], "--trigger"),
        ("consume", ["--path", "p", "--queue", "q", "--output", "o"], "--checkpoint"),
        ("consume", ["--path", "p", "--queue", "q", "--output", "o", "--checkpoint", "c",
                     "--columns", "body,nope"], "--columns"),
        ("maintain", ["--path", "p", "--steps", "expire,shrink"], "--steps"),
        ("consume", ["--path", "p", "--queue", "q", "--output", "o", "--checkpoint", "c",
                     "--remote", "http://host:15002"], "--remote"),
    ],
)  # fmt: skip
def test_bad_flags_exit_2_naming_the_flag(tmp_path, job, args, named):
    result = run_job(job, *args, check=False, cwd=tmp_path)  # relative paths land in tmp_path
    assert result.returncode == 2
    assert named in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "ring_size"),
    [
        ([], "1000"),  # the demo queue is a ring of 1,000
        (["--ring-size", "50"], "50"),
        (["--max-length", "50"], None),  # other arguments: only those given
        (["--queue", "orders"], None),  # other queues: only the arguments given
    ],
)
def test_produce_queue_arguments_are_only_those_given_except_the_demo(argv, ring_size):
    assert job_module("produce").parse_args(argv).ring_size == ring_size


@pytest.mark.parametrize("job", ["produce", "consume", "maintain"])
def test_a_relative_path_is_made_absolute_on_the_driver(job):
    required = {"consume": ["--queue", "q", "--output", "o", "--checkpoint", "c"]}
    parsed = job_module(job).parse_args(["--path", "lake/queues", *required.get(job, [])])
    assert parsed.path == os.path.abspath("lake/queues")
    assert job_module(job).parse_args(["--path", "s3://b/q", *required.get(job, [])]).path == (
        "s3://b/q"
    )


@pytest.mark.spark
def test_produce_demo_fills_a_ring_queue_and_prints_stats(tmp_path):
    result = run_job(
        "produce", "--path", "q", "--messages", 300, "--files", 3, "--ring-size", 100,
        cwd=tmp_path,
    )  # fmt: skip
    stats = last_json(result)
    assert (stats["added"], stats["replaced"], stats["ready"]) == (300, 200, 100)
    assert "after 3 micro-batches" in result.stdout
    assert (tmp_path / "q" / "_delta_log").is_dir()  # the relative path, from the job's folder


@pytest.mark.spark
def test_produce_from_delta_then_consume_into_delta_exactly_once(spark, tmp_path):
    rows = [(i, f"text {i}", "eu" if i % 3 else "us", i % 2) for i in range(120)]
    source = spark.createDataFrame(rows, "id long, text string, region string, prio int")
    source.coalesce(2).write.format("delta").save(str(tmp_path / "events"))
    queues = tmp_path / "queues"
    produced = call_job(
        spark, "produce", "--path", queues, "--queue", "orders",
        "--source", "delta", "--input", tmp_path / "events",
        "--body", "text", "--message-id", "concat('m-', id)", "--key", "region",
        "--headers", "map('region', region)", "--priority", "prio",
        "--max-files-per-trigger", 1, "--checkpoint", tmp_path / "produce-chk",
    )  # fmt: skip
    assert "after 2 micro-batches" in produced.stdout  # one per Delta data file
    assert last_json(produced)["added"] == 120
    browsed = spark.read.format("ringqueue").option("queue", "orders").load(str(queues))
    assert_df_equality(
        browsed.selectExpr(
            "message_id", "key", "cast(body as string) AS body", "headers['region'] AS h",
            "priority",
        ),
        source.selectExpr(
            "concat('m-', id) AS message_id", "region AS key", "text AS body",
            "region AS h", "prio AS priority",
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )  # fmt: skip

    output, checkpoint = tmp_path / "out", tmp_path / "consume-chk"
    args = [
        "--path", queues, "--queue", "orders", "--consumer", "pipeline",
        "--output", output, "--checkpoint", checkpoint,
        "--max-messages-per-trigger", 50, "--body-type", "string",
    ]  # fmt: skip
    report = last_json(call_job(spark, "consume", *args))
    assert (report["messages"], report["batches"]) == (120, 3)
    assert (report["stats"]["acked"], report["stats"]["ready"]) == (120, 0)
    consumed = spark.read.format("delta").load(str(output))
    assert consumed.columns[:2] == ["queue", "seq"] and "state" not in consumed.columns
    # Each message once, delivered once, to this consumer.
    assert_df_equality(
        consumed.select("message_id", "body", "priority", "delivery_count", "consumer"),
        source.selectExpr(
            "concat('m-', id) AS message_id",
            "text AS body",
            "prio AS priority",
            "1 AS delivery_count",
            "'pipeline' AS consumer",
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    # The same checkpoint: nothing new, nothing twice.
    again = last_json(call_job(spark, "consume", *args))
    assert again["messages"] == 0
    assert spark.read.format("delta").load(str(output)).count() == 120
    assert_identity(str(queues))


@pytest.mark.spark
def test_produce_rejects_an_expression_naming_its_flag_and_writes_nothing(spark, tmp_path):
    spark.createDataFrame([(1, "a")], "id long, text string").write.format("delta").save(
        str(tmp_path / "events")
    )
    result = call_job(
        spark, "produce", "--path", tmp_path / "queues", "--queue", "orders",
        "--source", "delta", "--input", tmp_path / "events", "--body", "text",
        "--key", "no_such_column", "--checkpoint", tmp_path / "chk",
        check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "--key 'no_such_column' is not a valid expression" in result.stderr
    assert "['id', 'text']" in result.stderr
    assert not (tmp_path / "queues").exists()


@pytest.mark.spark
def test_maintain_returns_expired_leases_compacts_and_prints_stats(spark, tmp_path):
    queues = str(tmp_path / "queues")
    for batch in range(3):
        write_batch(messages(spark, [f"b{batch}-{i}" for i in range(10)]), queues, queue="jobs")
    write_batch(messages(spark, ["x"]), queues, queue="other")
    table = QueueTable(queues)
    assert table.lease("jobs", "worker", max_messages=4, lease_period=1).num_rows == 4
    version = table.store.open().version()

    report = last_json(
        run_job("maintain", "--path", queues, "--steps", "expire,compact,stats", "--json")
    )
    assert report["expire"] == {
        "jobs": {"leases_returned": 4, "scheduled_due": 0},
        "other": {"leases_returned": 0, "scheduled_due": 0},
    }
    assert set(report["compact"]) and "vacuum" not in report
    jobs = report["stats"]["jobs"]
    assert (jobs["ready"], jobs["leased"], jobs["added"]) == (30, 0, 30)
    assert report["stats"]["other"]["ready"] == 1
    assert len(table.store.snapshot().states["jobs"].leases) == 0  # the return was committed
    assert sorted(bodies(spark, queues, "jobs")) == sorted(
        f"b{b}-{i}" for b in range(3) for i in range(10)
    )
    assert table.store.open().version() > version
    assert_identity(queues)

    text = run_job("maintain", "--path", queues, "--queue", "jobs", "--steps", "expire,stats")
    lines = text.stdout.splitlines()
    assert "expire jobs: 0 leases returned, 0 scheduled messages due" in lines
    assert lines[0] == f"queue table {QueueTable(queues).path}"
    assert lines[2].split()[:5] == ["queue", "ready", "ready_bytes", "leased", "scheduled"]
    assert any(line.split()[:2] == ["jobs", "30"] for line in lines)
    assert not any(line.startswith("other") for line in lines)


@pytest.mark.spark
def test_maintain_vacuum_keeps_what_the_retention_protects(spark, tmp_path):
    queues = str(tmp_path / "queues")
    for batch in range(3):
        write_batch(messages(spark, [f"b{batch}-{i}" for i in range(5)]), queues, queue="jobs")
    table = QueueTable(queues)
    table.purge("jobs")
    table.compact()  # the purged messages' files: unreferenced now, but only just

    def files() -> set[Path]:
        return {p for p in (tmp_path / "queues").rglob("*.parquet")}

    before = files()
    dry = last_json(
        run_job("maintain", "--path", queues, "--steps", "vacuum", "--dry-run", "--json")
    )
    assert dry["vacuum"] == {"dry_run": True, "files": []}  # nothing unreferenced for a week
    done = last_json(run_job("maintain", "--path", queues, "--steps", "vacuum,stats", "--json"))
    assert done["vacuum"] == {"dry_run": False, "files": []}
    assert done["stats"]["jobs"]["purged"] == 15
    assert files() == before
    short = run_job(
        "maintain", "--path", queues, "--steps", "vacuum", "--retention-hours", 0.5, check=False
    )
    assert short.returncode == 1  # the table refuses a retention below its floor
    assert short.stderr.startswith("maintain.py: ") and "--retention-hours" in short.stderr
    assert files() == before
    assert_identity(queues)


@pytest.mark.spark
@pytest.mark.parametrize(
    ("flags", "named", "exit_code"),
    [
        (["--queue", "orders", "--filter", "priority >>> 1"], "filter", 1),
        # A flag's value of the wrong kind is bad usage, refused before Spark starts.
        (["--queue", "orders", "--lease-period", "soon"], "--lease-period", 2),
        (["--queue", "nope"], "nope", 1),
    ],
)
def test_consume_bad_input_names_it_and_moves_nothing(spark, tmp_path, flags, named, exit_code):
    queues = str(tmp_path / "queues")
    write_batch(messages(spark, ["a", "b"]), queues, queue="orders")
    result = call_job(
        spark, "consume", "--path", queues, "--output", tmp_path / "out",
        "--checkpoint", tmp_path / "chk", *flags, check=False,
    )  # fmt: skip
    assert result.returncode == exit_code
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("consume.py: error:") and named in error
    assert not (tmp_path / "out" / "_delta_log").exists()
    stats = QueueTable(queues).stats("orders")
    assert (stats["ready"], stats["leased"], stats["acked"]) == (2, 0, 0)


def test_consume_of_a_missing_table_or_queue_is_one_line_before_spark_starts(tmp_path):
    """The job's own process, as a user runs it: one line on stderr (no Spark log, no JVM
    stack trace), as SPARK-SUBMIT.md promises; the check comes before a session starts."""
    missing = tmp_path / "missing"
    flags = ["--output", tmp_path / "out", "--checkpoint", tmp_path / "chk"]
    result = run_job("consume", "--path", missing, "--queue", "q", *flags, check=False)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"consume.py: error: TableNotFoundError: no queue table at {missing}"
    ]
    queues = tmp_path / "queues"
    QueueTable(queues).declare("orders")
    result = run_job("consume", "--path", queues, "--queue", "nope", *flags, check=False)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"consume.py: error: QueueNotFoundError: queue 'nope' does not exist in {queues}; "
        "queues: ['orders']"
    ]
    assert not (tmp_path / "out").exists() and not (tmp_path / "chk").exists()


@pytest.mark.spark
def test_produce_csv_files_with_an_inferred_schema(spark, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.csv").write_text("name,n\nann,1\nbob,2\n")
    (landing / "b.csv").write_text("name,n\ncid,3\n")
    queues = str(tmp_path / "queues")
    result = call_job(
        spark, "produce", "--path", queues, "--queue", "people", "--max-length", 10,
        "--source", "files", "--input", landing, "--format", "csv",
        "--body", "concat(name, ':', n + 1)", "--priority", "n",
        "--checkpoint", tmp_path / "chk",
    )  # fmt: skip
    assert last_json(result)["ready"] == 3
    table = QueueTable(queues)
    assert table.arguments("people").max_length == 10
    peeked = table.peek("people", 10)  # head order: highest priority first
    assert [bytes(b).decode() for b in peeked["body"].to_pylist()] == ["cid:4", "bob:3", "ann:2"]
    version = table.store.open().version()
    clash = call_job(
        spark, "produce", "--path", queues, "--queue", "people", "--max-length", 20,
        "--source", "files", "--input", landing, "--format", "csv",
        "--body", "name", "--checkpoint", tmp_path / "chk2", check=False,
    )  # fmt: skip
    assert clash.returncode == 1  # the queue exists with maxLength 10
    error = clash.stderr.strip().splitlines()[-1]
    assert error.startswith("produce.py: error: ArgumentMismatchError: queue 'people'")
    assert table.store.open().version() == version  # nothing written


@pytest.mark.spark
def test_produce_files_without_a_schema_or_files_asks_for_schema(spark, tmp_path):
    (tmp_path / "empty").mkdir()
    result = call_job(
        spark, "produce", "--path", tmp_path / "queues", "--queue", "q", "--source", "files",
        "--input", tmp_path / "empty", "--format", "json", "--checkpoint", tmp_path / "chk",
        check=False,
    )  # fmt: skip
    assert result.returncode == 1
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("produce.py: error: cannot infer a schema from --input")
    assert error.endswith("give --schema")
    assert not (tmp_path / "queues").exists()


@pytest.mark.spark
@pytest.mark.connect_only
def test_produce_and_consume_on_a_connect_server(spark, connect_server, tmp_path, monkeypatch):
    """``--remote`` and ``SPARK_REMOTE``: each job is a Connect client of the test session's
    server, whose workers lack the package until the job's session ships it."""
    queues = tmp_path / "queues"
    produced = run_job(
        "produce", "--path", queues, "--messages", 200, "--files", 2, "--ring-size", 100,
        "--remote", connect_server.url,
    )  # fmt: skip
    stats = last_json(produced)
    assert (stats["added"], stats["replaced"], stats["ready"]) == (200, 100, 100)
    assert "after 2 micro-batches" in produced.stdout
    peeked = QueueTable(str(queues)).peek("demo", 200)
    ready = [bytes(body).decode() for body in peeked["body"].to_pylist()]

    monkeypatch.setenv("SPARK_REMOTE", connect_server.url)
    output = tmp_path / "out"
    report = last_json(
        run_job(
            "consume", "--path", queues, "--queue", "demo", "--output", output,
            "--checkpoint", tmp_path / "chk", "--max-messages-per-trigger", 40,
            "--body-type", "string",
        )
    )  # fmt: skip
    assert (report["messages"], report["batches"]) == (100, 3)
    assert (report["stats"]["acked"], report["stats"]["ready"]) == (100, 0)
    consumed = spark.read.format("delta").load(str(output)).select("body")
    expected = spark.createDataFrame([(body,) for body in ready], "body string")
    assert_df_equality(consumed, expected, ignore_row_order=True, ignore_nullable=True)
    assert_identity(str(queues))


@pytest.mark.spark
def test_the_jobs_produce_consume_and_maintain_a_partitioned_queue(spark, tmp_path):
    rows = [(i, f"text {i}", f"customer-{i % 7}") for i in range(60)]
    source = spark.createDataFrame(rows, "id long, text string, customer string")
    source.coalesce(2).write.format("delta").save(str(tmp_path / "events"))
    queues = tmp_path / "queues"
    produced = call_job(
        spark, "produce", "--path", queues, "--queue", "orders", "--partitions", 3,
        "--source", "delta", "--input", tmp_path / "events", "--body", "text",
        "--key", "customer", "--checkpoint", tmp_path / "produce-chk",
    )  # fmt: skip
    assert last_json(produced)["added"] == 60
    table = QueueTable(str(queues))
    assert table.arguments("orders").partitions == 3
    assert all(stats["added"] for stats in table.partition_stats("orders"))
    assert table.lease("orders", "worker", max_messages=None, lease_period=1).num_rows == 60

    report = last_json(run_job("maintain", "--path", queues, "--steps", "expire,stats", "--json"))
    assert report["expire"] == {"orders": {"leases_returned": 60, "scheduled_due": 0}}
    assert report["stats"]["orders"]["ready"] == 60

    output = tmp_path / "out"
    consumed = last_json(
        call_job(
            spark, "consume", "--path", queues, "--queue", "orders", "--consumer", "pipeline",
            "--output", output, "--checkpoint", tmp_path / "consume-chk",
            "--body-type", "string",
        )
    )  # fmt: skip
    assert consumed["messages"] == 60 and consumed["stats"]["acked"] == 60
    got = sorted(r.body for r in spark.read.format("delta").load(str(output)).collect())
    assert got == sorted(f"text {i}" for i in range(60))
    assert_identity(str(queues))
