"""Optimistic commits: a writer that loses a race plans again, within a bound."""

from __future__ import annotations

import pytest

from spark_queue import CommitConflictError, QueueTable
from spark_queue.commit.transaction import QueueTransaction, run


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
