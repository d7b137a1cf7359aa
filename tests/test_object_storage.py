"""Queue tables on object storage: a local S3-compatible server (moto's) on 127.0.0.1.

Every test reaches the server through storage options only (the ``AWS_*`` environment is
cleared), except the one that checks the environment fallback. The Spark tests are in
``test_object_storage_spark.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from spark_queue import (
    InvalidOptionError,
    QueueTable,
    StorageError,
    check_exclusive_commits,
)
from spark_queue.rules import identity_holds
from spark_queue.storage import row_cache
from spark_queue.storage.location import Location
from tests.object_store import SECRET_KEY, RequestLog

ROOT = Path(__file__).resolve().parent.parent


def test_queue_table_on_s3_publish_lease_ack_stats_compact_vacuum(
    s3_table: str, s3_options: dict[str, str]
) -> None:
    table = QueueTable(s3_table, storage_options=s3_options)
    table.declare("orders", ring_size=5)
    first = table.publish("orders", [f"m{i}" for i in range(8)], producer="svc", sequence=1)
    assert first.seqs == list(range(8))
    again = table.publish("orders", [f"m{i}" for i in range(8)], producer="svc", sequence=1)
    assert again.duplicate and table.last_sequence("svc") == 1
    for round_ in range(3):  # small files for compaction
        table.publish("orders", [f"r{round_}"])
    stats = table.stats("orders")
    assert stats["ready"] == 5 and stats["added"] == 11 and identity_holds(stats)
    leased = table.lease("orders", consumer="worker", max_messages=3)
    assert [bytes(b).decode() for b in leased.column("body").to_pylist()] == [
        "m6",
        "m7",
        "r0",
    ]
    assert table.ack("orders", leased.column("seq").to_pylist(), consumer="worker") == 3
    stats = table.stats("orders")
    assert stats["ready"] == 2 and stats["acked"] == 3 and identity_holds(stats)

    before = table.stats("orders")
    assert set(table.compact()) == {"dropped", "rewritten", "written"}
    table.checkpoint()
    # Object stores set a file's time on upload: every file here is younger than the floor,
    # so the listing runs and deletes nothing (tests/test_maintenance.py ages files on disk).
    assert table.vacuum(retention_hours=1, dry_run=False, force=True) == []
    assert table.stats("orders") == before
    assert [bytes(b).decode() for b in table.peek("orders").column("body").to_pylist()] == [
        "r1",
        "r2",
    ]
    # A plain Delta reader with the same options sees a real Delta table.
    delta = DeltaTable(s3_table, storage_options=s3_options)
    assert delta.protocol().min_reader_version == 1 and delta.protocol().min_writer_version == 2


def test_keys_are_case_insensitive_and_the_environment_is_the_fallback(
    s3_table: str, s3_options: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    QueueTable(s3_table, storage_options={k.lower(): v for k, v in s3_options.items()}).publish(
        "q", ["a"]
    )
    for key, value in s3_options.items():
        monkeypatch.setenv(key, value)
    assert QueueTable(s3_table).stats("q")["ready"] == 1


def test_keys_are_spelt_as_delta_rs_reads_them() -> None:
    """The stores' keys in upper case; delta-rs's retry and runtime keys in lower case, the
    only spelling it reads (tests/test_clients.py shows a stopped store honour them)."""
    given = {"aws_region": "eu-west-1", "Max_Retries": 1, "BACKOFF_CONFIG.BASE": "2"}
    assert Location.of("s3://b/t", given).options == {
        "AWS_REGION": "eu-west-1",
        "max_retries": "1",
        "backoff_config.base": "2",
    }


def test_publishes_through_delta_rs_store_are_stored_whole(
    s3_table: str, s3_options: dict[str, str]
) -> None:
    """With delta-rs's retry keys, files go through delta-rs's store, which takes bytes
    only: a publish's file, encoded in memory and stored in slices (``files.upload_file``),
    is stored whole, a small one and one of several slices alike."""
    options = {**s3_options, "max_retries": "3"}
    fs, _ = Location.of(s3_table, options).filesystem()
    assert isinstance(fs, pafs.PyFileSystem)  # delta-rs's store, not pyarrow's S3 client
    table = QueueTable(s3_table, storage_options=options)
    large = [os.urandom(1024 * 1024) for _ in range(3)]  # one file over three slices
    table.publish("q", [b"small"])
    table.publish("q", large)
    assert [bytes(b) for b in table.peek("q", 10)["body"].to_pylist()] == [b"small", *large]


def test_secrets_stay_out_of_reprs_and_errors(s3_server: str, s3_options: dict[str, str]) -> None:
    location = Location.of("s3://queues-missing/lake", s3_options)
    assert SECRET_KEY not in repr(location) and "AWS_SECRET_ACCESS_KEY" in repr(location)
    with pytest.raises(StorageError) as caught:  # no such bucket
        QueueTable("s3://queues-missing/lake", storage_options=s3_options).queues()
    assert "s3://queues-missing/lake" in str(caught.value)
    assert SECRET_KEY not in str(caught.value)
    with pytest.raises(InvalidOptionError, match="AWS_REGION must be a string"):
        QueueTable("s3://queues-missing/lake", storage_options={"aws_region": ["eu"]})


def test_the_server_keeps_racing_commits_apart_and_the_guard_says_so(
    s3_table: str, s3_options: dict[str, str]
) -> None:
    # What every queue-table commit relies on, shown with delta-rs alone: two writers of
    # version 1, one wins and one is refused.
    uri = s3_table.rsplit("/", 1)[0] + "/plain"
    rows = pa.table({"x": pa.array([1], pa.int64())})
    write_deltalake(uri, rows, storage_options=s3_options)
    first = DeltaTable(uri, storage_options=s3_options)
    second = DeltaTable(uri, storage_options=s3_options)
    once = CommitProperties(max_commit_retries=0)
    write_deltalake(first, rows, mode="append", commit_properties=once)
    with pytest.raises(CommitFailedError):
        write_deltalake(second, rows, mode="append", commit_properties=once)
    assert DeltaTable(uri, storage_options=s3_options).version() == 1

    assert check_exclusive_commits(Location.of(s3_table, s3_options)) >= 0
    fs, base = Location.of(s3_table, s3_options).filesystem()
    from pyarrow.fs import FileSelector

    left = fs.get_file_info(FileSelector(base, recursive=True, allow_not_found=True))
    assert not [info.path for info in left if "_spark_queue_probe" in info.path]
    # Where no table is yet: no object (nor folder marker) under the path after.
    fresh = Location.of(s3_table.rsplit("/", 1)[0] + "/no-table-yet", s3_options)
    assert check_exclusive_commits(fresh) >= 0
    fs, base = fresh.filesystem()
    assert fs.get_file_info(FileSelector(base, recursive=True, allow_not_found=True)) == []


PUBLISHER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {root!r})
    from spark_queue import QueueTable
    options = json.loads(sys.argv[3])
    table = QueueTable(sys.argv[1], storage_options=options)
    name = sys.argv[2]
    attempts = 0
    for batch in range(20):
        result = table.publish("shared", [f"{{name}}-{{batch}}-{{i}}" for i in range(5)],
                               producer=name, sequence=batch + 1)
        attempts += result.attempts
    print(json.dumps({{"attempts": attempts}}))
    """
)


def test_two_processes_racing_publishes_on_s3_lose_nothing(
    s3_table: str, s3_options: dict[str, str], tmp_path: Path
) -> None:
    QueueTable(s3_table, storage_options=s3_options).declare("shared")
    script = tmp_path / "publisher.py"
    script.write_text(PUBLISHER.format(root=str(ROOT)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    runs = [
        subprocess.Popen(
            [sys.executable, str(script), s3_table, name, json.dumps(s3_options)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in ("alpha", "beta")
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    for run, (_, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err[-2000:]
    attempts = sum(json.loads(out)["attempts"] for out, _ in outputs)

    table = QueueTable(s3_table, storage_options=s3_options)
    rows = table.peek("shared", limit=1000)
    seqs = rows.column("seq").to_pylist()
    bodies = [bytes(b).decode() for b in rows.column("body").to_pylist()]
    assert seqs == list(range(200)), "every message once, seqs without gaps"
    for name in ("alpha", "beta"):
        mine = [b for b in bodies if b.startswith(name)]
        assert mine == [f"{name}-{b}-{i}" for b in range(20) for i in range(5)]
    stats = table.stats("shared")
    assert stats["added"] == 200 and identity_holds(stats)
    assert attempts >= 40


def test_cli_on_s3_takes_storage_options(s3_table: str, s3_options: dict[str, str]) -> None:
    flags = [f"--storage-option={key}={value}" for key, value in s3_options.items()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}

    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "spark_queue.cli", "--path", s3_table, *flags, *args],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=120,
        )

    published = cli("publish", "jobs", stdin='{"body": "one"}\n{"body": "two"}\n')
    assert published.returncode == 0, published.stderr
    stats = cli("stats", "jobs", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["ready"] == 2
    checked = cli("check-storage")
    assert checked.returncode == 0 and "one was refused" in checked.stdout, checked.stderr
    missing = cli("stats", "nope")
    assert missing.returncode == 1 and "nope" in missing.stderr
    assert SECRET_KEY not in missing.stderr
    # A value given without its key (a secret, say) is refused and never echoed.
    unkeyed = ["--storage-option", SECRET_KEY, "stats"]
    bad = subprocess.run(
        [sys.executable, "-m", "spark_queue.cli", "--path", s3_table, *unkeyed],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 2 and "--storage-option takes KEY=VALUE" in bad.stderr
    assert SECRET_KEY not in bad.stderr


def test_a_small_data_file_is_read_whole_in_one_get(
    s3_table: str, s3_options: dict[str, str], s3_requests: RequestLog
) -> None:
    """A data file whose size the log gives is read in one GET: the same rows as a read
    of its footer and then its columns."""
    table = QueueTable(s3_table, storage_options=s3_options, broker="off")
    table.publish("q", [f"m{i}" for i in range(100)])
    files = table.store.snapshot().message_files("q")
    path, size = files["path"][0].as_py(), files["size"][0].as_py()
    bucket = s3_table.removeprefix("s3://").split("/")[0]
    row_cache.clear()  # the bytes this process wrote: read as another process reads them
    s3_requests.mark()
    whole = table.store.read_rows(path, ["seq", "body"], size=size)
    requests = [method for method, target in s3_requests.since_mark(bucket) if path in target]
    assert requests == ["GET"]
    assert whole.equals(table.store.read_rows(path, ["seq", "body"]))
    assert whole.num_rows == 100


def test_the_upkeep_reads_each_log_entry_once_in_its_life(
    s3_table: str, s3_options: dict[str, str], s3_requests: RequestLog
) -> None:
    """A log entry is read once in its life by the writer's process: its commits read
    nothing back, and a checkpoint reads the entries since the last one once each, into
    a local copy of the log where delta-rs writes it. Entry ``interval + 1`` is counted
    over the next interval of one-message publishes: its create, then the checkpoint
    ``2 * interval``'s read. delta-rs opens the table from that checkpoint, which keeps
    the removals of the files the publishes replaced."""
    from spark_queue.commit.group import group_of

    table = QueueTable(s3_table, storage_options=s3_options, broker="off")
    table.declare("q")
    interval = int(
        DeltaTable(s3_table, storage_options=s3_options)
        .metadata()
        .configuration["delta.checkpointInterval"]
    )
    bucket = s3_table.removeprefix("s3://").split("/")[0]
    declared = DeltaTable(s3_table, storage_options=s3_options).version()
    s3_requests.mark()
    for _ in range(2 * interval + 1 - declared):  # one commit each: one caller at a time
        table.publish("q", ["m"])
    group_of(table.store.location).settle()
    entry = f"_delta_log/{interval + 1:020d}.json"
    reads = [m for m, target in s3_requests.since_mark(bucket) if target.endswith(entry)]
    log = table.store.fs.get_file_info(pafs.FileSelector(f"{table.store.base}/_delta_log"))
    names = {info.base_name for info in log}
    assert f"{2 * interval + 1:020d}.json" in names
    assert f"{2 * interval:020d}.checkpoint.parquet" in names
    assert reads == ["PUT", "GET"]
    fresh = DeltaTable(s3_table, storage_options=s3_options)
    assert fresh.version() == 2 * interval + 1
    view = table.store.snapshot(with_states=False)
    assert view is not None and sorted(
        uri.removeprefix(f"{s3_table}/") for uri in fresh.file_uris()
    ) == sorted(view.files["path"].to_pylist())
    written = pq.read_table(
        table.store.fs.open_input_file(
            f"{table.store.base}/_delta_log/{2 * interval:020d}.checkpoint.parquet"
        )
    )
    assert pc.sum(written["remove"].is_valid()).as_py() >= interval  # a state file a publish
    stats = table.stats("q")
    assert stats["added"] == stats["ready"] and identity_holds(stats)


@pytest.mark.parametrize("case", ["multi-part", "entry-gone"])
def test_a_checkpoint_a_copy_of_the_log_cannot_build_writes_nothing(
    s3_table: str, s3_options: dict[str, str], case: str
) -> None:
    """Where the last checkpoint is in parts (delta-spark's) or an entry after it is gone,
    the copy writes nothing and says so: the upkeep then lets delta-rs read the store."""
    import obstore

    from spark_queue.storage.log_checkpoint import LAST_CHECKPOINT, checkpoint_from_copy

    table = QueueTable(s3_table, storage_options=s3_options, broker="off")
    table.declare("q")
    for body in ["a", "b", "c"]:
        table.publish("q", [body])
    location = Location.of(s3_table, s3_options)
    store = location.object_store()
    version = DeltaTable(s3_table, storage_options=s3_options).version()
    if case == "multi-part":
        obstore.put(store, LAST_CHECKPOINT, b'{"version": 1, "size": 4, "parts": 2}')
    else:
        obstore.delete(store, f"_delta_log/{version - 1:020d}.json")
    before = sorted(o["path"] for o in obstore.list(store, "_delta_log/").collect())
    assert checkpoint_from_copy(location, version) is None
    assert sorted(o["path"] for o in obstore.list(store, "_delta_log/").collect()) == before


@pytest.mark.parametrize("existing", [True, False], ids=["a-table", "a-new-path"])
def test_the_storage_check_leaves_nothing_on_a_local_disk(tmp_path: Path, existing: bool) -> None:
    """``check-storage`` deletes its scratch table, folders and all: next to a table, and
    where no table (nor its folder) exists yet."""
    path = tmp_path / "lake" / "queues"
    if existing:
        QueueTable(str(path), broker="off").publish("q", ["a"])
    before = sorted(tmp_path.rglob("*"))
    assert check_exclusive_commits(Location.of(str(path))) >= 0
    assert sorted(tmp_path.rglob("*")) == before
