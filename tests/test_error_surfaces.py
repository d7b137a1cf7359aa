"""Errors as each surface shows them: a named ``spark_queue`` error that pickles, one line
from the CLI (exit 1 refused, 2 bad usage, never a traceback, a colour code or an option's
value), our class and message through Spark (not a pickling error), source options refused
at ``load()``, and filter errors about the user's own expression."""

from __future__ import annotations

import inspect
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import spark_queue
from spark_queue import QueueTable, errors
from spark_queue.cli import main
from tests.helpers import messages

SECRET = "s3cr3t-Do-Not-Print-Me"


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The CLI's error: nothing on stdout, one ``spark-queue: ...`` line on stderr, plain."""
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith("spark-queue: ") and "\x1b" not in lines[0], err
    return lines[0]


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed): connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- the error classes ----------------------------------------------------------------------


def error_classes() -> list[type[errors.QueueError]]:
    return [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, errors.QueueError)
    ]


def an_instance(cls: type[errors.QueueError]) -> errors.QueueError:
    """``cls`` made as its raisers make it (its own constructor's arguments, if any)."""
    given = {"queue": "orders", "table": "/lake/queues", "queues": ["a", "b"]}
    parameters = list(inspect.signature(cls.__init__).parameters)[1:]
    if parameters in (["args", "kwargs"], []):
        return cls(f"{cls.__name__}: something named went wrong")
    return cls(**{name: given[name] for name in parameters})


@pytest.mark.parametrize("cls", error_classes(), ids=lambda cls: cls.__name__)
def test_every_error_round_trips_through_pickle_and_cloudpickle(cls):
    from pyspark import cloudpickle

    error = an_instance(cls)
    try:  # a chained cause that cannot be pickled (a lock, as a delta-rs object holds)
        raise error from TypeError(__import__("threading").Lock())
    except errors.QueueError as raised:
        error = raised
    for dumps in (pickle.dumps, cloudpickle.dumps):
        copy = pickle.loads(dumps(error))
        assert type(copy) is cls
        assert str(copy) == str(error)
        assert vars(copy) == vars(error)


@pytest.mark.parametrize("cls", error_classes(), ids=lambda cls: cls.__name__)
def test_every_error_comes_back_from_a_broker_as_itself(cls):
    from spark_queue.broker.wire import decode_error, encode_error

    error = an_instance(cls)
    copy = decode_error(encode_error(error))
    assert type(copy) is cls and str(copy) == str(error)


def test_a_missing_table_is_a_table_not_found_error(tmp_path):
    assert issubclass(spark_queue.TableNotFoundError, spark_queue.QueueError)
    nowhere = str(tmp_path / "nowhere")
    table = QueueTable(nowhere)
    for call in (
        table.compact,
        lambda: table.vacuum(dry_run=True),
        table.history,
        lambda: table.last_sequence("p"),
    ):
        with pytest.raises(spark_queue.TableNotFoundError, match=f"no queue table at {nowhere}"):
            call()
    assert not Path(nowhere).exists()


def test_a_redeclare_mismatch_says_what_the_queue_has_and_to_use_alter(queue_path):
    table = QueueTable(queue_path)
    table.declare("orders", max_length=5)
    with pytest.raises(spark_queue.ArgumentMismatchError) as refused:
        table.declare("orders", dead_letter_queue="dlq", max_length=6)
    message = str(refused.value)
    assert "deadLetterQueue: queue has no value set (in effect none), given 'dlq'" in message
    assert "maxLength: queue has 5, given 6" in message
    assert "use alter" in message and "None" not in message


# -- the CLI --------------------------------------------------------------------------------


def test_cli_stats_of_a_missing_table_is_refused(tmp_path, capsys):
    nowhere = str(tmp_path / "nowhere")
    assert main(["--path", nowhere, "stats"]) == 1
    assert one_line(capsys) == f"spark-queue: no queue table at {nowhere}"


def test_cli_a_path_that_is_a_file_is_one_line(tmp_path, capsys):
    plain = tmp_path / "notes.txt"
    plain.write_text("not a table")
    assert main(["--path", str(plain), "stats"]) == 1
    assert f"{plain} is a file, not a queue table" in one_line(capsys)
    assert main(["broker", str(plain)]) == 1
    assert f"{plain} is a file, not a queue table" in one_line(capsys)


def test_cli_unexpected_errors_are_one_line_naming_their_type(queue_path, capsys):
    QueueTable(queue_path).declare("orders")
    # A log entry that is not JSON: delta-rs's error, with a backtrace in its message.
    (Path(queue_path) / "_delta_log" / f"{1:020d}.json").write_text("{not json")
    assert main(["--path", queue_path, "stats"]) == 1
    assert one_line(capsys).startswith("spark-queue: unexpected DeltaError: ")
    # A retention beyond what delta-rs takes (it raised OverflowError, or panicked with a
    # traceback) is refused as bad usage, naming the flag.
    for hours in ("1e300", "1e15"):
        assert main(["--path", queue_path, "vacuum", "--retention-hours", hours]) == 2
        assert "argument --retention-hours: must be a number of hours" in one_line(capsys)


def test_cli_an_unreachable_store_is_one_line_naming_the_endpoint(capsys, monkeypatch):
    from tests.object_store import clear_aws_environment

    clear_aws_environment(monkeypatch)
    endpoint = f"http://127.0.0.1:{free_port()}"
    flags = [
        *("--storage-option", f"AWS_ENDPOINT_URL={endpoint}"),
        *("--storage-option", "AWS_ALLOW_HTTP=true"),
        *("--storage-option", "AWS_ACCESS_KEY_ID=test-key"),
        *("--storage-option", f"AWS_SECRET_ACCESS_KEY={SECRET}"),
        *("--storage-option", "max_retries=0"),  # refused at once, not retried for minutes
    ]
    assert main(["--path", "s3://lake/queues", *flags, "stats"]) == 1
    line = one_line(capsys)
    assert line.startswith("spark-queue: cannot reach the queue table at s3://lake/queues")
    assert f"through endpoint {endpoint}" in line and "Connection refused" in line
    assert SECRET not in line


def test_cli_the_spark_queue_command_prints_one_plain_line(tmp_path):
    """The installed command, as a script runs it: an unreachable store (delta-rs colours
    its error's causes) and an unknown flag holding a secret."""
    command = [str(Path(sys.executable).parent / "spark-queue")]
    endpoint = f"http://127.0.0.1:{free_port()}"
    run = subprocess.run(
        [
            *command,
            *("--path", "s3://lake/queues", "stats"),
            *("--storage-option", f"AWS_ENDPOINT_URL={endpoint}"),
            *("--storage-option", "AWS_ALLOW_HTTP=true"),
            *("--storage-option", "max_retries=0"),
            *("--storage-option", f"AWS_SECRET_ACCESS_KEY={SECRET}"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and run.stdout == "", run.stderr
    assert len(run.stderr.splitlines()) == 1 and "\x1b" not in run.stderr, run.stderr
    assert endpoint in run.stderr and SECRET not in run.stderr
    # A reader that leaves before the output (`| head -1`): no traceback either.
    QueueTable(tmp_path / "queues").declare("orders")
    left = subprocess.Popen(
        [*command, "--path", str(tmp_path / "queues"), "queues", "--broker", "off"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    left.stdout.close()
    assert left.stderr.read() == b"" and left.wait(timeout=120) in (0, 1)
    usage = subprocess.run(
        [*command, "peek", "orders", "--path", str(tmp_path), "--bogus", SECRET],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert usage.returncode == 2 and usage.stdout == ""
    assert usage.stderr.splitlines() == [
        "spark-queue: unrecognized arguments: --bogus (values not shown) (see spark-queue --help)"
    ]


def test_cli_bad_usage_exits_2_and_never_echoes_a_value(queue_path, capsys):
    assert main(["--path", queue_path, "--storage-option", "NOEQUALS", "stats"]) == 2
    assert "--storage-option takes KEY=VALUE" in one_line(capsys)
    for argv in (
        ["stats", "--path", queue_path, "--storage-option", f"AWS_SESSION_TOKEN={SECRET}", "-x"],
        ["--path", queue_path, "stats", f"--unknown={SECRET}"],
        ["--path", queue_path, "publish", "q", "--on-reject", SECRET],
        ["--path", queue_path, "peek", "q", "--limit", SECRET],
        ["--path", queue_path, "stats", "--bogus", SECRET],
        ["--path", queue_path, "stats", f"--json={SECRET}"],
        [f"--p={SECRET}", "stats"],  # --path or --policies?
    ):
        assert main(argv) == 2, argv
        line = one_line(capsys)
        assert SECRET not in line and "see spark-queue" in line, (argv, line)


def test_cli_global_options_go_before_or_after_the_command(queue_path, tmp_path, capsys):
    QueueTable(queue_path).declare("orders", max_length=5)
    assert main(["queues", "--path", queue_path, "--broker", "off"]) == 0
    assert capsys.readouterr().out.split() == ["orders"]
    assert main(["--path", queue_path, "queues", "--broker", SECRET]) == 2
    line = one_line(capsys)
    assert "--broker must be 'auto', 'off'" in line and SECRET not in line
    # Storage options given before and after the command add up (a local path takes none,
    # so both reach the table's check).
    argv = ["--storage-option", "A=1", "stats", "orders", "--storage-option", "NOEQUALS"]
    assert main(["--path", queue_path, *argv]) == 2
    assert "flag 2 has no '='" in one_line(capsys)
    policies = tmp_path / "policies.toml"
    policies.write_text('[policy.capped]\nmatch = "capped"\nmax-length = 3\n')
    assert main(["declare", "capped", "--path", queue_path, "--policies", str(policies)]) == 0
    assert '"max_length": 3' in capsys.readouterr().out


def test_cli_publish_of_nothing_says_so(queue_path, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["--path", queue_path, "publish", "orders", "--file", str(empty)]) == 0
    assert capsys.readouterr().out == f"published 0: no messages in {empty}\n"


# -- filters --------------------------------------------------------------------------------


def test_a_bad_filter_names_its_position_and_the_message_columns(queue_path):
    table = QueueTable(queue_path)
    table.publish("orders", [{"body": "a", "priority": 1}])
    table.publish("other", [{"body": "b", "priority": 9}])
    with pytest.raises(spark_queue.InvalidOptionError) as refused:
        table.lease("orders", "c", filter="body = = 1")
    assert "at column 8 of the filter" in str(refused.value)
    with pytest.raises(spark_queue.InvalidOptionError) as refused:
        table.lease("orders", "c", filter="priorty > 1")
    message = str(refused.value)
    assert "No field named priorty. Did you mean 'priority'?" in message
    for internal in ("record", "outcome", "queue_state", "lease_until", "messages."):
        assert internal not in message
    with pytest.raises(spark_queue.InvalidOptionError, match="No field named outcome"):
        table.lease("orders", "c", filter="outcome IS NULL")
    # A filter cannot close its parentheses to pick other queues' messages.
    with pytest.raises(spark_queue.InvalidOptionError, match=r"a '\)' at column 13"):
        table.lease("orders", "c", filter="priority > 5) OR (TRUE")
    assert table.lease("orders", "c", filter="body = 'a' AND (priority < 5)").num_rows == 1
    assert table.stats("other")["leased"] == 0


# -- Spark ----------------------------------------------------------------------------------


def spark_error_text(error: BaseException) -> str:
    text = str(error)
    assert "PicklingError" not in text and "Could not serialize" not in text, text
    assert "UnboundLocalError" not in text, text
    return text


@pytest.mark.connect
def test_spark_batch_writes_carry_our_error_not_a_pickling_error(spark, queue_path, tmp_path):
    QueueTable(queue_path).declare("orders", max_length=5)
    rows = messages(spark, ["a"])

    def write(path: str, **options: str) -> str:
        writer = rows.write.format("ringqueue").mode("append").option("queue", "orders")
        for key, value in options.items():
            writer = writer.option(key, value)
        with pytest.raises(Exception) as failed:
            writer.save(path)
        return spark_error_text(failed.value)

    text = write(queue_path, maxLength="6")
    assert "ArgumentMismatchError: queue 'orders' exists with other arguments" in text
    assert "maxLength: queue has 5, given 6" in text
    plain = str(tmp_path / "plain")
    from deltalake import write_deltalake

    write_deltalake(plain, __import__("pyarrow").table({"x": [1]}))
    assert "NotAQueueTableError: " in write(plain)
    endpoint = f"http://127.0.0.1:{free_port()}"
    unreachable = write(
        "s3://lake/queues",
        **{
            "storage.AWS_ENDPOINT_URL": endpoint,
            "storage.AWS_ALLOW_HTTP": "true",
            "storage.AWS_ACCESS_KEY_ID": "test-key",
            "storage.AWS_SECRET_ACCESS_KEY": SECRET,
            "storage.max_retries": "0",
        },
    )
    assert "StorageError: cannot reach the queue table at s3://lake/queues" in unreachable
    assert SECRET not in unreachable
    assert QueueTable(queue_path).stats("orders")["added"] == 0


@pytest.mark.connect
def test_spark_source_options_fail_at_load(spark, queue_path, tmp_path):
    QueueTable(queue_path).publish("orders", [{"body": "a"}])

    def started(**options: str) -> str:
        reader = spark.readStream.format("ringqueue")
        for key, value in options.items():
            reader = reader.option(key, value)
        with pytest.raises(Exception) as failed:
            # Spark Connect analyses lazily: there, the error comes when the query starts.
            query = (
                reader.load(queue_path)
                .writeStream.format("noop")
                .option("checkpointLocation", str(tmp_path / f"cp-{len(list(tmp_path.iterdir()))}"))
                .start()
            )
            try:
                query.awaitTermination(60)
            finally:
                query.stop()
        return spark_error_text(failed.value)

    bad_value = started(queue="orders", maxMessagesPerTrigger="zz")
    assert "InvalidOptionError: maxMessagesPerTrigger must be a whole number" in bad_value
    unknown = started(queue="orders", maxMessages="5")
    assert "invalidoptionerror: unknown option 'maxmessages'" in unknown.lower()
    assert "a readStream takes path, queue, consumer" in unknown
    assert QueueTable(queue_path).stats("orders")["leased"] == 0


def test_what_load_cannot_refuse_fails_at_the_first_call_not_in_pickling(queue_path):
    """Spark's Python workers, without a session: a readStream given a read's options (no
    queue) gets a reader that refuses at its first call (raised by ``streamReader``, PySpark
    adds an error of its own); a refused streaming write pickles into its tasks, which
    raise the refusal (raised while pickling, it would become a pickling error)."""
    from pyspark import cloudpickle
    from pyspark.sql.types import StringType, StructField, StructType

    from spark_queue.spark.datasource import RingQueueDataSource

    QueueTable(queue_path).declare("orders", max_length=5)
    reader = RingQueueDataSource({"path": queue_path}).streamReader(StructType())
    with pytest.raises(spark_queue.InvalidOptionError, match="option 'queue' is required"):
        reader.initialOffset()
    schema = StructType([StructField("body", StringType())])
    source = RingQueueDataSource({"path": queue_path, "queue": "orders", "maxLength": "7"})
    with pytest.raises(spark_queue.ArgumentMismatchError):
        source.writer(schema, False)  # the batch writer: when made
    task_copy = pickle.loads(cloudpickle.dumps(source.streamWriter(schema, False)))
    with pytest.raises(spark_queue.ArgumentMismatchError, match="maxLength: queue has 5"):
        task_copy.write(iter([]))
    assert QueueTable(queue_path).stats("orders")["added"] == 0
