"""A user's files in and around a queue table's folder: spark-queue never takes a folder
holding them for a new table, and its vacuum never deletes them (docs/MAINTENANCE.md,
"Vacuum"; docs/STORAGE.md, "Which folder becomes a queue table"). Real tables on a local
disk and on the suite's S3 server, real processes for the CLI, the jobs and the broker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction, RemoveAction

from spark_queue import NotAQueueTableError, QueueTable
from spark_queue.cli import main
from spark_queue.model.schema import TABLE_SCHEMA
from spark_queue.storage.files import MESSAGE, QUEUE, new_file
from spark_queue.storage.location import Location
from tests.helpers import messages, set_table_property, write_batch

ROOT = Path(__file__).resolve().parent.parent
HOUR = 3600.0
USERS_FILES = ("file.txt", "mydata/report.csv")


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> content)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def leave_users_files(folder: Path, hours_old: float = 48.0) -> dict[str, bytes]:
    """A user's ``file.txt`` and ``mydata/report.csv``, ``hours_old`` hours old."""
    for name in USERS_FILES:
        file = folder / name
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(f"the user's {name}\n")
        then = time.time() - hours_old * HOUR
        os.utime(file, (then, then))
    return tree(folder)


def python(*argv: str) -> subprocess.CompletedProcess[str]:
    """This interpreter run with ``argv`` in a process of its own, this checkout first."""
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


# -- a new table: only in an empty or new folder ----------------------------------------------


def test_declare_refuses_a_folder_holding_a_users_files_by_name_and_writes_nothing(
    tmp_path, capsys
):
    folder = tmp_path / "documents"
    before = leave_users_files(folder)
    refusal = (
        f"path {folder} is not empty and is not a queue table (it holds file.txt, mydata/): "
        "give an empty or new folder"
    )
    table = QueueTable(str(folder), broker="off")
    for create in (lambda: table.declare("q"), lambda: table.publish("q", ["m"])):
        with pytest.raises(NotAQueueTableError) as error:
            create()
        assert str(error.value) == refusal
    message = tmp_path / "message.jsonl"
    message.write_text('{"body": "m"}\n')
    for command in (["declare", "q"], ["publish", "q", "--file", str(message)]):
        assert main(["--path", str(folder), *command]) == 1
        assert capsys.readouterr().err == f"spark-queue: {refusal}\n"
    assert tree(folder) == before


def test_an_empty_folder_may_hold_hidden_files_and_spark_queues_own_folders(tmp_path):
    """Hidden files (``.DS_Store``) are litter a user expects an empty folder to hold, and
    vacuum never deletes them; a hidden folder (``.git``) is someone's content."""
    litter = tmp_path / "litter"
    litter.mkdir()
    (litter / ".DS_Store").write_bytes(b"\0")
    (litter / "_spark_queue" / "brokers").mkdir(parents=True)  # a broker started here first
    (litter / "_spark_queue" / "brokers" / "b1.json").write_text("{}")
    QueueTable(str(litter), broker="off").declare("q")
    assert QueueTable(str(litter), broker="off").queues() == ["q"]

    repository = tmp_path / "repository"
    (repository / ".git").mkdir(parents=True)
    with pytest.raises(NotAQueueTableError, match=r"\(it holds \.git/\)"):
        QueueTable(str(repository), broker="off").declare("q")

    crowded = tmp_path / "crowded"
    crowded.mkdir()
    for number in range(8):
        (crowded / f"f{number}").write_text("x")
    with pytest.raises(NotAQueueTableError, match=r"\(it holds f0, f1, f2, f3, f4 and 3 more\)"):
        QueueTable(str(crowded), broker="off").declare("q")
    assert not (repository / "_delta_log").exists() and not (crowded / "_delta_log").exists()


def test_a_table_inside_a_delta_table_is_refused_by_name(tmp_path):
    queues = tmp_path / "queues"
    QueueTable(str(queues), broker="off").declare("q")
    before = tree(queues)
    for inside in (queues / "record=queue", queues / "record=queue" / "a" / "b", queues / "x"):
        with pytest.raises(NotAQueueTableError) as error:
            QueueTable(str(inside), broker="off").declare("q")
        assert str(error.value) == (
            f"path {inside} is inside the Delta table at {queues}: give a folder outside "
            "every Delta table"
        )
    assert tree(queues) == before
    # Another tool's Delta table: neither it nor a folder inside it becomes a queue table.
    other = tmp_path / "other"
    write_deltalake(str(other), pa.table({"a": [1]}))
    with pytest.raises(NotAQueueTableError, match=f"{other} holds a Delta table that is not a"):
        QueueTable(str(other), broker="off").declare("q")
    with pytest.raises(NotAQueueTableError, match=f"is inside the Delta table at {other}:"):
        QueueTable(str(other / "part"), broker="off").declare("q")
    assert not (other / "part").exists() and DeltaTable(str(other)).version() == 0


def s3_objects(uri: str, options: dict[str, str]) -> dict[str, int]:
    """Every object of the bucket of ``uri`` (key -> size)."""
    fs, _ = Location.of(uri, options).filesystem()
    bucket = uri.split("://", 1)[1].split("/", 1)[0]
    found = fs.get_file_info(pafs.FileSelector(bucket, recursive=True, allow_not_found=True))
    return {info.path: info.size for info in found if info.type == pafs.FileType.File}


def put_object(uri: str, options: dict[str, str], relative: str, body: bytes) -> None:
    """Write ``body`` at ``relative`` under ``uri``, on a local disk or an object store."""
    fs, base = Location.of(uri, options).filesystem()
    if isinstance(fs, pafs.LocalFileSystem):
        Path(base, relative).parent.mkdir(parents=True, exist_ok=True)
    with fs.open_output_stream(f"{base}/{relative}") as out:
        out.write(body)


def test_on_s3_a_prefix_holding_objects_or_inside_a_table_is_refused(s3_table, s3_options):
    documents = s3_table.rsplit("/", 1)[0] + "/documents"
    for name in USERS_FILES:
        put_object(documents, s3_options, name, b"the user's")
    QueueTable(s3_table, storage_options=s3_options, broker="off").declare("q")
    before = s3_objects(s3_table, s3_options)
    with pytest.raises(NotAQueueTableError) as error:
        QueueTable(documents, storage_options=s3_options, broker="off").declare("q")
    assert str(error.value) == (
        f"path {documents} is not empty and is not a queue table (it holds file.txt, "
        "mydata/): give an empty or new folder"
    )
    inside = f"{s3_table}/record=queue"
    with pytest.raises(NotAQueueTableError) as error:
        QueueTable(inside, storage_options=s3_options, broker="off").publish("q", ["m"])
    assert str(error.value) == (
        f"path {inside} is inside the Delta table at {s3_table}: give a folder outside every "
        "Delta table"
    )
    assert s3_objects(s3_table, s3_options) == before


def test_a_broker_refuses_a_users_folder_and_writes_nothing(tmp_path):
    """The broker would write its record there, and its first CreateQueue would fail."""
    folder = tmp_path / "documents"
    before = leave_users_files(folder)
    result = python("-m", "spark_queue.cli", "broker", str(folder), "--sqs", "127.0.0.1:0")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        f"spark-queue: path {folder} is not empty and is not a queue table (it holds "
        "file.txt, mydata/): give an empty or new folder\n"
    )
    assert tree(folder) == before


@pytest.mark.integration  # its broker is started through a helper the reading cannot see
def test_sqs_create_queue_on_a_folder_a_user_filled_since_the_broker_started(tmp_path):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    from tests.brokers import BrokerProcess

    folder = tmp_path / "queues"
    with BrokerProcess(str(folder), "--sqs", "127.0.0.1:0", log_path=tmp_path / "log") as broker:
        leave_users_files(folder)
        before = tree(folder)  # the user's files and the broker's record
        endpoint = broker.announcement.split("SQS API at ", 1)[1].split()[0]
        sqs = boto3.client(
            "sqs",
            endpoint_url=endpoint,
            region_name="eu-west-1",
            aws_access_key_id="AKIDEXAMPLE",
            aws_secret_access_key="secret",
            config=Config(retries={"max_attempts": 1}),
        )
        with pytest.raises(ClientError) as error:
            sqs.create_queue(QueueName="orders")
        assert f"path {folder} is not empty and is not a queue table" in str(error.value)
        assert "(it holds file.txt, mydata/)" in str(error.value)
        assert tree(folder) == before


@pytest.mark.spark
def test_the_sinks_first_write_to_a_users_folder_is_refused_before_any_task(spark, tmp_path):
    folder = tmp_path / "documents"
    before = leave_users_files(folder)
    with pytest.raises(Exception, match=f"path {folder} is not empty and is not a queue table"):
        write_batch(messages(spark, ["a", "b"]), str(folder), queue="q")
    assert tree(folder) == before


# -- vacuum: only the table's files -----------------------------------------------------------


def committed_then_removed(
    uri: str, relative: str, hours_ago: float, options: dict[str, str] | None = None
) -> None:
    """A file the table's log added, then removed ``hours_ago`` hours ago (a tombstone of
    that age), as a compaction or an ack removes files; it is still on storage."""
    put_object(uri, options or {}, relative, b"rows no version reads any more")
    table = Location.of(uri, options).delta_table()
    record = {"record": relative.split("/", 1)[0].split("=", 1)[1]}
    stamp = int((time.time() - hours_ago * HOUR) * 1000)
    for action in (
        AddAction(relative, 30, record, stamp, True, None),
        RemoveAction(relative, True, stamp, 30, record),
    ):
        table.create_write_transaction(
            [action], mode="append", schema=TABLE_SCHEMA, partition_by=["record"]
        )
        table.update_incremental()


def orphan(path: Path, hours_old: float) -> str:
    """A message file staged by a producer that never committed it, ``hours_old`` old."""
    relative = new_file(MESSAGE)
    file = path / relative
    file.parent.mkdir(exist_ok=True)
    file.write_bytes(b"a staged file no commit published")
    then = time.time() - hours_old * HOUR
    os.utime(file, (then, then))
    return relative


def another_writers_name() -> str:
    """A data file as Spark or delta-rs names one, in the table's message folder."""
    return f"record=message/part-00000-{uuid.uuid4()}-c000.snappy.parquet"


def test_vacuum_deletes_the_tables_files_and_never_a_users(queue_path):
    """The reproduction: a queue table whose folder later gets a user's files. vacuum at
    the table's floor (1 hour, no force) deletes what the table removed and the staged files
    of a producer that never committed, and lists none of the user's."""
    root = Path(queue_path)
    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    table.publish("q", ["a", "b"])
    leave_users_files(root)
    for name in ("record=message/notes.txt", another_writers_name(), ".DS_Store"):
        (root / name).write_text("someone else's")
        os.utime(root / name, (time.time() - 48 * HOUR,) * 2)
    before = tree(root)  # theirs, and the table's live files
    removed_own = new_file(QUEUE)
    removed_by_another_writer = another_writers_name()
    committed_then_removed(queue_path, removed_own, hours_ago=2)
    committed_then_removed(queue_path, removed_by_another_writer, hours_ago=2)
    stale, staged_now = orphan(root, hours_old=30 * 24), orphan(root, hours_old=0)
    tables = sorted([removed_own, removed_by_another_writer, stale])

    assert table.vacuum(1, dry_run=True) == tables
    assert all((root / name).exists() for name in tables)
    assert table.vacuum(1, dry_run=False) == tables
    assert not any((root / name).exists() for name in tables)
    assert (root / staged_now).exists()  # younger than the retention: maybe a producer's
    assert {k: v for k, v in tree(root).items() if k in before} == before
    # Once more: the removals' tombstones are listed again (delta-rs lists a tombstone
    # until a checkpoint drops it, its file gone or not), still nothing else.
    assert not any((root / name).exists() for name in table.vacuum(1, dry_run=False))
    assert {k: v for k, v in tree(root).items() if k in before} == before
    assert table.stats("q")["ready"] == 2


def test_a_forced_vacuum_below_the_floor_deletes_removed_files_only(queue_path):
    root = Path(queue_path)
    table = QueueTable(queue_path, broker="off")
    table.declare("q")
    set_table_property(queue_path, "delta.deletedFileRetentionDuration", "interval 1 days")
    before = leave_users_files(root)
    removed = new_file(MESSAGE)
    committed_then_removed(queue_path, removed, hours_ago=2)
    stale = orphan(root, hours_old=30 * 24)
    assert table.vacuum(1, dry_run=False, force=True) == [removed]
    assert (root / stale).exists()  # no commit mentions it: below the floor, kept
    assert {k: v for k, v in tree(root).items() if k in before} == before


def test_the_cli_and_the_maintain_job_vacuum_none_of_a_users_files(queue_path):
    root = Path(queue_path)
    QueueTable(queue_path, broker="off").declare("q")
    before = leave_users_files(root)
    stale = orphan(root, hours_old=30 * 24)
    job = python(str(ROOT / "jobs" / "maintain.py"), "--path", queue_path, "--steps", "vacuum",
                 "--retention-hours", "1", "--dry-run", "--json")  # fmt: skip
    assert job.returncode == 0, job.stderr
    assert f'"files": ["{stale}"]' in job.stdout
    cli = python("-m", "spark_queue.cli", "--path", queue_path, "vacuum", "--retention-hours", "1",
                 "--no-dry-run")  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines() == [stale, "removed 1 files"]
    assert not (root / stale).exists()
    assert {k: v for k, v in tree(root).items() if k in before} == before


@pytest.mark.parametrize("users_objects", [True, False], ids=["with", "without"])
def test_vacuum_on_s3_deletes_the_tables_removed_files_and_no_other_object(
    s3_table, s3_options, s3_requests, users_objects
):
    """With a user's objects in the folder, vacuum deletes the table's files itself, a
    request each; without, delta-rs deletes them in bulk, one request for them all."""
    table = QueueTable(s3_table, storage_options=s3_options, broker="off")
    table.declare("q")
    for name in USERS_FILES if users_objects else ():
        put_object(s3_table, s3_options, name, b"the user's")
    removed = [new_file(QUEUE), new_file(MESSAGE), another_writers_name()]
    for relative in removed:
        committed_then_removed(s3_table, relative, hours_ago=2, options=s3_options)
    before = s3_objects(s3_table, s3_options)
    assert table.vacuum(1, dry_run=True) == sorted(removed)
    s3_requests.mark()
    assert table.vacuum(1, dry_run=False) == sorted(removed)
    bucket, key = s3_table.split("://", 1)[1].split("/", 1)
    deletes = [t for m, t in s3_requests.since_mark(bucket) if m in ("POST", "DELETE")]
    assert deletes == [f"/{bucket}?delete"] * (len(removed) if users_objects else 1)
    assert s3_objects(s3_table, s3_options) == {
        k: v for k, v in before.items() if k not in {f"{bucket}/{key}/{r}" for r in removed}
    } | {k: v for k, v in s3_objects(s3_table, s3_options).items() if "/_delta_log/" in k}
    assert table.queues() == ["q"]
