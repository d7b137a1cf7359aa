"""Arguments that were silently coerced or checked on one surface only: each is now refused
with a named error, and nothing is written. No Spark."""

from __future__ import annotations

import pytest

from spark_queue import InvalidOptionError, QueueTable
from spark_queue.model.arguments import MAX_DURATION_MS


def version(table: QueueTable) -> int:
    return table.store.open().version()


@pytest.fixture
def table(queue_path: str) -> QueueTable:
    table = QueueTable(queue_path)
    table.declare("q")
    return table


def test_alter_refuses_a_byte_limit_on_a_ring(table):
    table.declare("ring", ring_size=3)
    table.declare("bytes", max_length_bytes=100)
    before = version(table)
    with pytest.raises(InvalidOptionError, match=r"max_length_bytes=100 needs overflow=drop-head"):
        table.alter("ring", max_length_bytes=100)
    with pytest.raises(InvalidOptionError, match=r"max_length_bytes=100 needs overflow=drop-head"):
        table.alter("bytes", overflow="ring")
    assert version(table) == before
    assert table.arguments("ring").max_length_bytes is None
    assert table.arguments("bytes").overflow == "drop-head"


def test_declare_refuses_a_limit_beyond_int64(table):
    before = version(table)
    with pytest.raises(InvalidOptionError, match="max_length must be a whole number"):
        table.declare("big", max_length=2**70)
    assert version(table) == before


def test_declare_refuses_a_fraction_of_a_millisecond(table):
    with pytest.raises(InvalidOptionError, match="expiration must be a duration"):
        table.declare("frac", expiration=1.5)
    assert "frac" not in table.queues()


@pytest.mark.parametrize("period", [10**16, 2**62, MAX_DURATION_MS + 1])
def test_a_lease_period_beyond_a_timestamp_is_refused(table, period):
    table.publish("q", [{"body": b"x"}])
    before = version(table)
    with pytest.raises(InvalidOptionError, match="lease_period must be a duration"):
        table.lease("q", "a", max_messages=1, lease_period=period)
    with pytest.raises(InvalidOptionError, match="period must be a duration"):
        table.extend("q", [0], "a", period)
    assert version(table) == before


def test_the_longest_lease_period_holds_the_message(table):
    table.publish("q", [{"body": b"x"}])
    assert table.lease("q", "a", max_messages=1, lease_period=MAX_DURATION_MS).num_rows == 1
    assert table.lease("q", "b", max_messages=1, lease_period=MAX_DURATION_MS).num_rows == 0


def test_on_reject_is_one_choice_everywhere(table):
    """``publish`` took only the exact lower-case word where the sink took any case, and
    the publisher checked it at its first batch."""
    table.declare("full", max_length=1, overflow="reject-publish")
    table.publish("full", [{"body": b"1"}])
    before = version(table)
    with pytest.raises(Exception, match="reject"):
        table.publish("full", [{"body": b"2"}], on_reject="FAIL")
    assert version(table) == before
    with pytest.raises(InvalidOptionError, match="on_reject must be one of drop, fail"):
        table.publisher("full", on_reject="explode")


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.alter("bad name!", max_length=3),
        lambda t: t.lease("bad name!", "a"),
        lambda t: t.consumer("bad name!", "a"),
        lambda t: t.publisher("bad name!"),
    ],
    ids=["alter", "lease", "consumer", "publisher"],
)
def test_queue_names_are_checked_on_every_call(table, call):
    before = version(table)
    with pytest.raises(InvalidOptionError, match="must be a queue name"):
        call(table)
    assert version(table) == before


@pytest.mark.parametrize(
    "call, named",
    [
        (lambda t: t.consumer("q", "a", max_deliveries="x"), "max_deliveries"),
        (lambda t: t.consumer("q", "a", filter=3), "filter"),
        (lambda t: t.consumer("q", "\n"), "name"),
        (lambda t: t.publisher("q", max_length="x"), "max_length"),
        (lambda t: t.publisher("q", nonsense=1), "nonsense"),
    ],
    ids=["max_deliveries", "filter", "consumer-name", "queue-argument", "unknown"],
)
def test_clients_check_their_options_when_made(table, call, named):
    before = version(table)
    with pytest.raises(InvalidOptionError, match=named):
        call(table)
    assert version(table) == before


@pytest.mark.parametrize(
    "call, own",
    [
        (lambda t: t.consumer("q", "a", batch_size=5), "max_prefetch, lease_period"),
        (lambda t: t.publisher("q", batch_size=5), "linger, max_batch, on_reject"),
    ],
    ids=["consumer", "publisher"],
)
def test_an_unknown_client_option_lists_the_clients_own_options(table, call, own):
    with pytest.raises(InvalidOptionError) as refused:
        call(table)
    message = str(refused.value)
    assert message.startswith("unknown ") and "option 'batch_size'; valid: " in message
    assert own in message and "expiration_model" not in message
