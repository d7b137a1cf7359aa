"""Values handed to queue operations: seqs, priorities, counts, periods and message values.

Each bad value raises a named error in one line that names the argument and the values it
takes, and changes nothing (not even an empty commit); a lease, however long, never lets
two consumers hold one message. No Spark: real tables in ``tmp_path``, a real broker.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_queue import InvalidInputError, InvalidOptionError, QueueTable
from spark_queue.broker.wire import encode_request
from spark_queue.commit.group import group_of
from spark_queue.commit.requests import ChangeRequest, ExtendRequest, LeaseRequest, cancel_planner
from spark_queue.model.arguments import MAX_DURATION_MS, parse_seq
from spark_queue.model.messages import as_input_table, normalise
from spark_queue.model.queue_arguments import ConsumerLimits
from spark_queue.rules import NEVER
from spark_queue.storage.commit_log import CommitOperation
from spark_queue.storage.store import QueueStore
from tests.brokers import BrokerProcess
from tests.clock import now_micros

NOT_SEQS = [[1.5], [True], ["a"], [None], [2**70], [-1], 2, "12", np.array([1.5])]


def version(table: QueueTable) -> int:
    return table.store.open().version()


def leased_table(path: str, messages: int = 3) -> QueueTable:
    """A table whose queue ``q`` holds ``messages`` messages, all leased by ``c`` (seqs
    0 to messages - 1)."""
    table = QueueTable(path, broker="off")
    table.publish("q", [f"m{i}" for i in range(messages)])
    assert table.lease("q", "c", max_messages=messages).num_rows == messages
    return table


def one_line(error: pytest.ExceptionInfo, *words: str) -> bool:
    text = str(error.value)
    return "\n" not in text and all(word in text for word in words)


SEQ_OPERATIONS = {
    "ack": lambda t, seqs: t.ack("q", seqs),
    "cancel": lambda t, seqs: t.cancel("q", seqs),
    "expire": lambda t, seqs: t.expire("q", seqs),
    "extend": lambda t, seqs: t.extend("q", seqs, "c", "1 minute"),
    "release": lambda t, seqs: t.release("q", consumer="c", seqs=seqs),
}


@pytest.mark.parametrize("operation", SEQ_OPERATIONS)
@pytest.mark.parametrize("seqs", NOT_SEQS, ids=repr)
def test_values_that_are_not_seqs_are_refused_and_change_nothing(tmp_path, operation, seqs):
    table = leased_table(str(tmp_path))
    before = version(table)
    with pytest.raises(InvalidOptionError) as error:
        SEQ_OPERATIONS[operation](table, seqs)
    assert one_line(error, "seqs", "whole number")
    assert version(table) == before
    assert table.stats("q")["leased_by_consumer"] == {"c": 3}


SEQ_FORMS = {
    "list": [1],
    "tuple": (1,),
    "range": range(1, 2),
    "numpy": np.array([1]),
    "arrow array": pa.array([1]),
    "arrow column": pa.chunked_array([[1]]),
    "numpy scalars": [np.int32(1)],
}


@pytest.mark.parametrize("seqs", SEQ_FORMS.values(), ids=SEQ_FORMS)
def test_seqs_are_taken_as_lists_arrays_and_columns(tmp_path, seqs):
    table = leased_table(str(tmp_path))
    assert table.ack("q", seqs) == 1
    assert table.stats("q")["leased_by_consumer"] == {"c": 2}


CHANGES_THAT_END_NOTHING = {
    "ack of a seq never leased": lambda t: t.ack("q", [7]),
    "ack of another consumer's": lambda t: t.ack("q", [0], "other"),
    "cancel of a seq never leased": lambda t: t.cancel("q", [7]),
    "expire of a seq never leased": lambda t: t.expire("q", [7], "c"),
    "release of an unknown consumer": lambda t: t.release("q", consumer="nobody"),
    "release of an unknown consumer, every queue": lambda t: t.release(consumer="nobody"),
    "release of seqs not held": lambda t: t.release("q", consumer="c", seqs=[7]),
    "ack of no seqs": lambda t: t.ack("q", []),
}


@pytest.mark.parametrize("change", CHANGES_THAT_END_NOTHING)
def test_a_change_that_ends_no_lease_commits_nothing(tmp_path, change):
    table = leased_table(str(tmp_path))
    before = version(table)
    assert CHANGES_THAT_END_NOTHING[change](table) == 0
    assert version(table) == before


def test_an_ack_that_ends_a_lease_still_commits(tmp_path):
    table = leased_table(str(tmp_path))
    before = version(table)
    assert table.ack("q", [0, 7]) == 1
    assert version(table) == before + 1


# -- lease periods: a lease's end never wraps into the past -------------------------------

# Periods a lease's end holds (the longest duration is 1000 years), with the milliseconds
# each means, and periods beyond it, whole numbers past it up to and beyond an int64.
HELD_PERIODS = [("1 day", 86_400_000), (10**13, 10**13), (MAX_DURATION_MS, MAX_DURATION_MS)]
REFUSED_PERIODS = [MAX_DURATION_MS + 1, 10**16, 2**62, 2**63 - 1, 10**20]


def lease_as_a(lease) -> tuple[pa.Table, int, int]:
    """The rows ``lease()`` returns, and the clock before and after it (microseconds)."""
    before = now_micros()
    rows = lease()
    return rows, before, now_micros()


def assert_only_a_holds(table: QueueTable, queue: str, millis: int, before: int, after: int):
    """``queue``'s one message is A's, until ``millis`` after a lease made between ``before``
    and ``after``, and B's lease takes nothing."""
    (until,) = QueueStore(table.path).snapshot().states[queue].leases.until.tolist()
    assert before + millis * 1000 <= until <= after + millis * 1000
    assert table.lease(queue, "B", lease_period="1 minute").num_rows == 0
    assert table.stats(queue)["leased_by_consumer"] == {"A": 1}


@pytest.mark.parametrize(("period", "millis"), HELD_PERIODS, ids=repr)
def test_a_lease_period_up_to_the_longest_duration_leases_to_one_consumer_that_long(
    tmp_path, period, millis
):
    table = QueueTable(str(tmp_path), broker="off")
    table.publish("q", ["only"])
    first, before, after = lease_as_a(lambda: table.lease("q", "A", lease_period=period))
    assert (first["body"].to_pylist(), first["delivery_count"].to_pylist()) == ([b"only"], [1])
    assert_only_a_holds(table, "q", millis, before, after)


@pytest.mark.parametrize("period", REFUSED_PERIODS, ids=repr)
def test_a_lease_period_beyond_the_longest_duration_is_refused_by_name(tmp_path, period):
    table = QueueTable(str(tmp_path), broker="off")
    table.publish("q", ["only"])
    before = version(table)
    with pytest.raises(InvalidOptionError) as error:
        table.lease("q", "A", lease_period=period)
    assert one_line(error, "lease_period must be a duration", "at most 365000 days")
    assert version(table) == before
    assert table.stats("q")["leased"] == 0


@pytest.mark.parametrize("period_us", [2**62, NEVER - 1, NEVER, 10**19, 10**30], ids=repr)
def test_the_core_never_wraps_a_lease_end_whatever_period_reaches_it(tmp_path, period_us):
    """Defence in depth: the core's own arithmetic, reached with periods no parser lets
    through (a lease, an extension and a cancel's delay)."""
    table = QueueTable(str(tmp_path), broker="off")
    table.publish("q", ["first", "second"])
    group = group_of(table.store.location)  # the commit path QueueTable's calls take

    def call(request):
        return group.submit(request).result()

    limits = ConsumerLimits("A", period_us, 1, None, 0, 0)
    (seq,) = call(LeaseRequest("q", limits, None)).leased.seq
    assert call(ExtendRequest("q", np.array([seq]), "A", period_us)) == 1
    other = ConsumerLimits("B", 60_000_000, None, None, 0, 0)
    assert call(LeaseRequest("q", other, None)).leased.seq.tolist() == [1]
    cancel = ChangeRequest(
        CommitOperation.CANCEL, "q", cancel_planner("B", period_us), np.array([1]), "B"
    )
    assert call(cancel) == 1  # waits that long: never due
    again = call(LeaseRequest("q", other, None)).leased
    assert len(again) == 0
    stats = table.stats("q")
    assert (stats["leased_by_consumer"], stats["scheduled"]) == ({"A": 1}, 1)


# -- the consumer -------------------------------------------------------------------------


@pytest.mark.parametrize("settle", ["ack", "nack"])
@pytest.mark.parametrize("value", [True, 1.5, -1, 2**70, None], ids=repr)
def test_a_consumer_refuses_what_is_neither_a_message_nor_a_seq(tmp_path, settle, value):
    table = QueueTable(str(tmp_path), broker="off")
    table.publish("q", ["a", "b"])
    with table.consumer("q", "w") as consumer:
        held = consumer.receive(2, wait_time="60s")
        held += consumer.receive(1, wait_time="60s")  # the first lease may prefetch one only
        assert [m.seq for m in held] == [0, 1]
        with pytest.raises(InvalidOptionError) as error:
            getattr(consumer, settle)(value)
        assert one_line(error, "message", "seq")
        consumer.flush()
        assert table.stats("q")["leased_by_consumer"] == {"w": 2}
        for message in held:
            message.ack()
    assert table.stats("q")["acked"] == 2


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("max_messages", "x"),
        ("max_messages", -1),
        ("max_messages", 1.5),
        ("max_messages", True),
        ("wait_time", -1),
        ("wait_time", "soon"),
        ("wait_time", 1.5),
        ("wait_time", float("nan")),
        ("wait_time", float("inf")),
    ],
    ids=repr,
)
def test_receive_refuses_bad_counts_and_waits(tmp_path, keyword, value):
    table = QueueTable(str(tmp_path), broker="off")
    table.publish("q", ["a"])
    with table.consumer("q", "w") as consumer:
        with pytest.raises(InvalidOptionError) as error:
            consumer.receive(**{"wait_time": "60s", keyword: value})
        assert one_line(error, keyword)
        assert [m.body for m in consumer.receive(1, wait_time="60s")] == [b"a"]


@pytest.mark.parametrize("option", ["prefetch", "ack_every", "max_messages"])
def test_a_consumer_refuses_an_unknown_option_by_name(tmp_path, option):
    """An unknown keyword was Python's bare TypeError ("unexpected keyword argument")."""
    table = QueueTable(str(tmp_path), broker="off")
    table.publish("q", ["a"])
    before = version(table)
    with pytest.raises(InvalidOptionError) as error:
        table.consumer("q", "w", **{option: 1})
    assert one_line(error, repr(option), "max_prefetch", "ack_interval")
    assert version(table) == before


@pytest.mark.parametrize("count", [False, 0.0, np.float64(0), True, 1.5, "x", -1], ids=repr)
def test_lease_refuses_a_max_messages_that_is_not_a_count(tmp_path, count):
    """A lease may ask for 0 messages (it then only settles): False and 0.0 were taken as
    that 0."""
    table = QueueTable(str(tmp_path), broker="off")
    table.publish("q", ["a"])
    before = version(table)
    with pytest.raises(InvalidOptionError) as error:
        table.lease("q", "c", max_messages=count)
    assert one_line(error, "max_messages", "whole number >= 0")
    assert version(table) == before
    assert table.lease("q", "c", max_messages=0).num_rows == 0
    assert table.lease("q", "c", max_messages="1").num_rows == 1


@pytest.mark.parametrize("limit", [-1, 1.5, True, "x", None], ids=repr)
def test_peek_refuses_a_limit_that_is_not_a_count(tmp_path, limit):
    table = QueueTable(str(tmp_path), broker="off")
    table.publish("q", ["a", "b"])
    with pytest.raises(InvalidOptionError) as error:
        table.peek("q", limit)
    assert one_line(error, "limit", "whole number")


# -- message values -----------------------------------------------------------------------

BAD_ROW_VALUES = [
    ("priority", 1.5, "whole numbers"),
    ("priority", 2.0, "whole numbers"),
    ("priority", True, "whole numbers"),
    ("priority", 2**31, "whole numbers"),
    ("priority", "5", "whole numbers"),
    ("deliver_at", 10**6, "datetimes"),
    ("expires_at", 10**6, "datetimes"),
    ("deliver_at", datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14))), "9999"),
    ("expires_at", np.datetime64("300000-01-01"), "9999"),
    ("message_id", 5, "strings"),
    ("key", 5, "strings"),
    ("headers", {"a": 1}, "dicts of UTF-8 string keys to UTF-8 string values"),
]


def publish_rows(table: QueueTable, row: dict) -> None:
    table.publish("q", [{"body": "ok"}, row])


def send(table: QueueTable, row: dict) -> None:
    with table.publisher("q") as publisher:
        publisher.send(**row)


@pytest.mark.parametrize("surface", [publish_rows, send], ids=["publish", "Publisher.send"])
@pytest.mark.parametrize(("column", "value", "takes"), BAD_ROW_VALUES, ids=repr)
def test_a_message_value_of_the_wrong_kind_is_refused(tmp_path, surface, column, value, takes):
    table = QueueTable(str(tmp_path), broker="off")
    table.publish("q", ["first"])
    before = version(table)
    with pytest.raises(InvalidInputError) as error:
        surface(table, {"body": "x", column: value})
    assert one_line(error, f"'{column}'", takes, repr(value)[:20])
    assert version(table) == before


def test_whole_priorities_and_datetimes_are_stored_as_given(tmp_path):
    table = QueueTable(str(tmp_path), broker="off")
    due = datetime(2001, 2, 3, tzinfo=UTC)
    table.publish("q", [{"body": "a", "priority": np.int16(-7), "deliver_at": due}, {"body": "b"}])
    with table.publisher("q") as publisher:
        assert publisher.send("c", priority=2**31 - 1).result(timeout=60) == 2
    rows = table.peek("q", 3).to_pylist()
    assert [(r["body"], r["priority"]) for r in rows] == [(b"c", 2**31 - 1), (b"b", 0), (b"a", -7)]
    assert rows[2]["deliver_at"] == due


def test_the_cli_refuses_a_fractional_priority(tmp_path):
    path = str(tmp_path / "queues")
    table = QueueTable(path, broker="off")
    table.publish("q", ["first"])
    before = version(table)
    result = subprocess.run(
        [sys.executable, "-m", "spark_queue.cli", "--path", path, "publish", "q"],
        input='{"body": "x", "priority": 1.5}\n',
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and result.stdout == ""
    assert len(lines) == 1 and "'priority'" in lines[0] and "1.5" in lines[0]
    assert version(table) == before


@pytest.mark.parametrize(
    ("command", "flags"),
    [("ack", []), ("cancel", []), ("extend", ["--consumer", "c", "--period", "1m"])],
    ids=["ack", "cancel", "extend"],
)
def test_the_cli_refuses_a_seq_beyond_int64_in_one_line(tmp_path, capsys, command, flags):
    """``ack w 99999999999999999999999`` printed a traceback."""
    from spark_queue.cli import main

    table = leased_table(str(tmp_path))
    before = version(table)
    argv = ["--path", str(tmp_path), "--broker", "off", command, "q", "0", str(10**23), *flags]
    assert main(argv) == 2  # bad usage, as every other bad command argument
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("spark-queue: argument seqs: must be a seq: ")
    assert "whole number from 0 to 2**63-1" in captured.err
    assert version(table) == before
    assert table.stats("q")["leased_by_consumer"] == {"c": 3}


# -- through a broker ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("broker")
    with BrokerProcess(str(folder / "queues"), log_path=folder / "broker.log") as process:
        yield process


def test_a_long_lease_through_a_broker_is_one_consumers(broker):
    table = QueueTable(broker.path, broker=broker.target)
    table.publish("long", ["only"])
    served = broker.status()["served"]
    first, before, after = lease_as_a(
        lambda: table.lease("long", "A", lease_period=MAX_DURATION_MS)
    )
    assert (first["body"].to_pylist(), first["delivery_count"].to_pylist()) == ([b"only"], [1])
    assert_only_a_holds(table, "long", MAX_DURATION_MS, before, after)
    # A's lease, B's and the stats: each reached the broker.
    assert broker.status()["served"] == served + 3


def test_seqs_that_are_not_seqs_never_reach_a_broker(broker):
    table = QueueTable(broker.path, broker=broker.target)
    table.publish("acks", ["a", "b"])
    assert table.lease("acks", "c").num_rows == 2
    before = version(table)
    with pytest.raises(InvalidOptionError) as error:
        table.ack("acks", [1.5])
    assert one_line(error, "seqs")
    assert version(table) == before
    assert table.stats("acks")["leased_by_consumer"] == {"c": 2}


# -- any value at all ---------------------------------------------------------------------

SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.integers(min_value=0, max_value=2**63 - 1).map(np.int64),
)
ANY_SEQS = st.one_of(SCALARS, st.lists(SCALARS, max_size=4), st.tuples(SCALARS))


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> QueueTable:
    """A table whose seqs 0, 1 and 2 ``c`` holds, which no test may change."""
    return leased_table(str(tmp_path_factory.mktemp("held")))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=ANY_SEQS)
def test_any_value_as_seqs_is_refused_by_name_or_taken_as_the_seqs_it_is(held, value):
    table = held
    before = version(table)
    try:
        ended = table.ack("q", value, "other")  # holds nothing: nothing may change
    except InvalidOptionError as error:
        assert "seqs" in str(error) and "\n" not in str(error)
    else:
        assert isinstance(value, list | tuple) and ended == 0
        for seq in value:  # each a whole number in int64, or its digits
            whole = int(seq) if isinstance(seq, str) else seq
            assert not isinstance(seq, bool | float) and whole == parse_seq("seq", seq)
            assert 0 <= whole < 2**63
    assert version(table) == before
    assert table.stats("q")["leased_by_consumer"] == {"c": 3}


@settings(max_examples=300, deadline=None)
@given(value=SCALARS)
def test_any_priority_is_refused_by_name_or_stored_as_given(value):
    try:
        rows = normalise(as_input_table([{"body": "x", "priority": value}]), 0, 0, "q")
    except InvalidInputError as error:
        assert "'priority'" in str(error) and "\n" not in str(error)
    else:
        assert rows["priority"].to_pylist() == [0 if value is None else value]


def raw_lease(broker, queue: str, period: object) -> pa.Table:
    """A lease of ``queue`` for A with ``period`` as the request's JSON carries it, sent as
    any client could send it."""
    client = broker.client()
    arguments = {"queue": queue, "consumer": "A", "lease_period": period}
    return client.call("lease", encode_request(client.table, "lease", arguments))


@pytest.mark.parametrize(
    ("queue", "period", "millis"),
    [("raw-longest", MAX_DURATION_MS, MAX_DURATION_MS), ("raw-text", "1 day", 86_400_000)],
)
def test_a_raw_request_with_a_lease_period_up_to_the_longest_leases_to_one_consumer(
    broker, queue, period, millis
):
    """What the broker decodes from any client, not only from ours."""
    table = QueueTable(broker.path, broker="off")
    table.publish(queue, ["only"])
    first, before, after = lease_as_a(lambda: raw_lease(broker, queue, period))
    assert (first["body"].to_pylist(), first["delivery_count"].to_pylist()) == ([b"only"], [1])
    assert_only_a_holds(table, queue, millis, before, after)


@pytest.mark.parametrize(
    ("queue", "period", "valid"),
    [
        ("raw-long", 10**16, "at most 365000 days"),
        ("raw-huge", 2**63 + 5, "at most 365000 days"),
        ("raw-float", 1e300, "a whole number of milliseconds"),
        ("raw-whole-float", 1000.0, "a whole number of milliseconds"),
    ],
)
def test_a_raw_request_with_any_other_lease_period_is_refused_by_name(broker, queue, period, valid):
    """JSON numbers beyond the longest duration, beyond an int64, and floats (a float is never
    a whole number, even 1000.0)."""
    table = QueueTable(broker.path, broker="off")
    table.publish(queue, ["only"])
    before = version(table)
    with pytest.raises(InvalidOptionError) as error:
        raw_lease(broker, queue, period)
    assert one_line(error, "lease_period must be a duration", valid)
    assert version(table) == before
    assert table.stats(queue)["leased"] == 0
