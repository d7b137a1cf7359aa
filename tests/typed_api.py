"""What a type checker says of the public API. ``make typecheck`` checks this file (it is never
run): the calls in ``accepted`` type-check, and each call in ``refused`` is refused with the
error code its ``type: ignore`` names. A type that loosens leaves its ignore unused, and
mypy (``warn_unused_ignores``) fails on it."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
from typing_extensions import assert_type

from spark_queue import (
    Consumer,
    Overflow,
    Publisher,
    PublishResult,
    QueueArgumentKeywords,
    QueueArguments,
    QueueTable,
)


def accepted(table: QueueTable) -> None:
    assert_type(table.declare("orders", max_length=10, overflow="ring"), QueueArguments)
    assert_type(
        table.declare("orders", QueueArguments(max_length=10), expiration="30s"), QueueArguments
    )
    table.alter("orders", redelivery_delay=timedelta(seconds=5), max_length=None)
    table.alter("orders", table.arguments("other"))
    given: QueueArgumentKeywords = {"max_length": 10, "expiration_model": "earliest"}
    table.declare("orders", **given)
    assert_type(table.publish("orders", [b"x"], on_reject="fail"), PublishResult)
    table.publish("orders", [b"x"], duplicate_window="1 hour", exclusive=True)
    assert_type(table.consumer("orders", "worker", lease_period="30s", max_prefetch=10), Consumer)
    assert_type(table.publisher("orders", linger=5, max_length=10), Publisher)
    assert_type(table.ack("orders", [1, 2]), int)
    assert_type(table.ack("orders", np.array([1, 2])), int)
    table.cancel("orders", range(3), delay="5s")
    table.lease("orders", "worker", max_messages=None, lease_period=timedelta(minutes=1))
    assert_type(table.release("orders", consumer="worker"), int)
    assert_type(table.release(consumer="worker"), int)
    assert_type(table.vacuum(dry_run=False), list[str])
    with table.consumer("orders", "worker", idle_check_interval="100ms") as consumer:
        consumer.receive(10, wait_time=timedelta(seconds=1))
        consumer.nack(1, delay=timedelta(seconds=5))
    assert_type(table.stats("orders")["ready"], int)
    assert_type(table.stats("orders")["leased_by_consumer"], dict[str, int])
    overflow: Overflow = table.arguments("orders").overflow
    assert_type(overflow, Overflow)


def refused(table: QueueTable) -> None:
    table.declare("orders", overflow="rings")  # type: ignore[arg-type]
    table.declare("orders", max_lenght=10)  # type: ignore[call-arg]
    table.declare("orders", max_length="10")  # type: ignore[arg-type]
    table.declare("orders", {"max_length": 10})  # type: ignore[arg-type]
    table.alter("orders", expiration_model="newest")  # type: ignore[arg-type]
    table.publish("orders", [b"x"], on_reject="ignore")  # type: ignore[arg-type]
    table.publish("orders", [b"x"], ring_size=1.5)  # type: ignore[arg-type]
    table.consumer("orders", "worker", lease_period=1.5)  # type: ignore[arg-type]
    table.consumer("orders", "worker", max_length=3)  # type: ignore[call-arg]
    table.publisher("orders", linger=None)  # type: ignore[arg-type]
    table.lease("orders", max_messages="5")  # type: ignore[arg-type]
    table.extend("orders", [1], "worker", period=2.5)  # type: ignore[arg-type]
    QueueArguments(overflow="rings")  # type: ignore[arg-type]
    table.stats("orders")["redy"]  # type: ignore[misc]
    table.release("orders")  # type: ignore[call-arg]
    table.consumer("orders", "worker", max_poll_interval_ms=50)  # type: ignore[call-arg]
    table.consumer("orders", "worker").receive(1, 2.0)  # type: ignore[call-arg, arg-type]
    table.publisher("orders", linger_ms=5)  # type: ignore[call-arg]
    table.stats(name="orders")  # type: ignore[call-arg]
