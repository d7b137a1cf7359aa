"""Delivery and cancel limits that belong to the queue, as the brokers keep them:
RabbitMQ's ``x-delivery-limit``, Artemis's ``max-delivery-attempts`` address setting, AMPS's
``MaxDeliveries`` / ``MaxCancels`` in the queue definition. A consumer may set a lower limit,
never a higher one. No Spark: ``QueueTable`` runs the same core as the streaming source."""

from __future__ import annotations

import pytest

from spark_queue import InvalidOptionError, QueueTable
from spark_queue.model.policies import Policies, load_policies
from spark_queue.rules import identity_holds


def _cancel_until_gone(table: QueueTable, queue: str, rounds: int, **lease: object) -> list[int]:
    """Lease the one message and cancel it, ``rounds`` times; the delivery counts seen."""
    seen = []
    for _ in range(rounds):
        leased = table.lease(queue, consumer="worker", max_messages=1, **lease)
        if not leased.num_rows:
            break
        seen.append(leased.column("delivery_count")[0].as_py())
        table.cancel(queue, leased.column("seq").to_pylist(), consumer="worker")
    return seen


def _dead_letters(table: QueueTable, dlq: str) -> list[str]:
    return table.peek(dlq).column("death_reason").to_pylist()


def test_rabbitmq_x_delivery_limit_kills_a_poison_message_without_consumer_options(tmp_path):
    """RabbitMQ quorum queues: a message returned after its delivery limit is dead-lettered
    (here with reason ``delivery_limit``), whatever the consumer asked for."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare("jobs", max_deliveries=2, dead_letter_queue="jobs.dlq")
    table.publish("jobs", ["poison"])
    assert _cancel_until_gone(table, "jobs", 5) == [1, 2]
    stats = table.stats("jobs")
    assert (stats["ready"], stats["killed"], stats["dead_lettered"]) == (0, 1, 1)
    assert identity_holds(stats)
    assert _dead_letters(table, "jobs.dlq") == ["delivery_limit"]


def test_amps_max_cancels_in_the_queue_definition(tmp_path):
    """AMPS ``MaxCancels``: the third cancel of one message kills it (``cancel_limit``)."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare("jobs", max_cancels=3, dead_letter_queue="jobs.dlq")
    table.publish("jobs", ["m"])
    assert _cancel_until_gone(table, "jobs", 5) == [1, 2, 3]
    assert _dead_letters(table, "jobs.dlq") == ["cancel_limit"]


@pytest.mark.parametrize(
    ("queue_limit", "consumer_limit", "cancels"),
    [(3, 1, 1), (1, 5, 1), (2, None, 2), (None, 2, 2)],
    ids=["consumer-lower-wins", "consumer-higher-capped", "queue-only", "consumer-only"],
)
def test_the_lower_of_the_queue_and_the_consumer_limit_applies(
    tmp_path, queue_limit, consumer_limit, cancels
):
    table = QueueTable(str(tmp_path / "q"))
    table.declare("jobs", max_cancels=queue_limit)
    table.publish("jobs", ["m"])
    seen = _cancel_until_gone(table, "jobs", 6, max_cancels=consumer_limit)
    assert len(seen) == cancels
    assert table.stats("jobs")["killed"] == 1


def test_policies_give_defaults_and_caps(tmp_path):
    policies_file = tmp_path / "policies.toml"
    policies_file.write_text(
        '[policy.jobs]\nmatch = "jobs.*"\ndefault-max-deliveries = 4\nmax-cancels = 2\n'
    )
    policies = load_policies(str(policies_file))
    assert isinstance(policies, Policies)
    table = QueueTable(str(tmp_path / "q"), policies=policies)
    arguments = table.declare("jobs.a", max_cancels=10)
    assert (arguments.max_deliveries, arguments.max_cancels) == (4, 2)
    resolution = table.resolve("jobs.b", max_deliveries=9)
    assert resolution.to_dict()["arguments"]["max_deliveries"]["value"] == 9


@pytest.mark.parametrize(
    ("argument", "value"), [("max_deliveries", "lots"), ("max_cancels", -3), ("max_cancels", 1.5)]
)
def test_bad_limits_name_the_argument_and_write_nothing(tmp_path, argument, value):
    table = QueueTable(str(tmp_path / "q"))
    with pytest.raises(InvalidOptionError, match=argument):
        table.declare("jobs", **{argument: value})
    assert table.queues() == []
