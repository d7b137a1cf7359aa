"""Optimistic commits: a writer that loses a race plans again, within a bound."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pyarrow.fs as pafs
import pytest

from spark_queue import CommitConflictError, QueueTable
from spark_queue.commit.failpoints import CRASH_AT, CRASH_DIR
from spark_queue.commit.transaction import QueueTransaction, run
from spark_queue.rules import identity_holds


def test_a_commit_that_loses_every_race_fails_naming_the_queue_and_attempts(tmp_path):
    path = str(tmp_path / "queues")
    table, other = QueueTable(path), QueueTable(path)
    table.declare("orders")
    tried: list[int] = []

    def work(transaction: QueueTransaction) -> None:
        tried.append(transaction.attempt)
        other.declare(f"other{transaction.attempt}")  # another writer commits first
        transaction.declare("orders", {"max_length": 5}, alter=True)
        transaction.commit(operation="ALTER orders")

    with pytest.raises(CommitConflictError, match=r"queue 'orders' in .* each of 3 attempts"):
        run(table.store, work, attempts=3, what="queue 'orders'")
    assert tried == [1, 2, 3]
    assert table.queues() == ["orders", "other1", "other2", "other3"]
    assert table.arguments("orders").max_length is None  # nothing of the lost attempts landed


def test_a_commit_that_loses_once_plans_again_on_the_new_version(tmp_path):
    path = str(tmp_path / "queues")
    table, other = QueueTable(path), QueueTable(path)
    table.declare("orders")
    seen: list[list[str]] = []

    def work(transaction: QueueTransaction) -> int:
        seen.append(sorted(transaction.states))
        if transaction.attempt == 1:
            other.declare("late")  # wins the race once
        transaction.declare("orders", {"max_length": 5}, alter=True)
        transaction.commit(operation="ALTER orders")
        return transaction.attempt

    assert run(table.store, work, what="queue 'orders'") == 2
    assert seen == [["orders"], ["late", "orders"]]  # the second plan saw the winner's commit
    assert table.arguments("orders").max_length == 5


# A publishing service: idempotent publishes of m1..m10, resuming after the last committed.
PUBLISHER = """
import json, sys
from spark_queue import QueueTable
table = QueueTable(sys.argv[1], storage_options=json.loads(sys.argv[2]), broker="off")
start = (table.last_sequence("svc") or 0) + 1
for sequence in range(start, 11):
    table.publish("q", [f"m{sequence}"], producer="svc", sequence=sequence)
"""


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_publisher_killed_between_its_files_and_its_log_entry_loses_and_doubles_nothing(
    store, tmp_path, request
):
    """SIGKILLed with its fourth commit's files stored and its log entry not created
    (failpoint ``commit.files-stored``): the table holds three publishes, the files are
    orphans no version names, and the restarted service publishes the rest once."""
    if store == "s3":
        options = request.getfixturevalue("s3_options")
        uri = request.getfixturevalue("s3_table")
    else:
        options, uri = {}, str(tmp_path / "queues")
    QueueTable(uri, storage_options=options).declare("q")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    command = [sys.executable, "-c", PUBLISHER, uri, json.dumps(options)]
    crashing = {**env, CRASH_AT: "commit.files-stored:4", CRASH_DIR: str(tmp_path / "hits")}
    killed = subprocess.run(command, env=crashing, start_new_session=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    table = QueueTable(uri, storage_options=options)
    assert table.last_sequence("svc") == 3
    snapshot = table.store.snapshot()
    listed = set(snapshot.files["path"].to_pylist())
    fs, base = table.store.fs, table.store.base
    stored = fs.get_file_info(pafs.FileSelector(f"{base}/record=message", recursive=True))
    orphans = [info.path for info in stored if info.path[len(base) + 1 :] not in listed]
    assert len(orphans) == 1  # the fourth publish's message file
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    bodies = [b.decode() for b in table.peek("q", 100)["body"].to_pylist()]
    assert bodies == [f"m{i}" for i in range(1, 11)]
    stats = table.stats("q")
    assert stats["added"] == 10 and identity_holds(stats)
