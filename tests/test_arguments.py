"""The argument specification and its kind parsers (spark_queue.model.arguments), without Spark."""

from __future__ import annotations

import datetime as dt
import warnings

import numpy as np
import pytest

from spark_queue.errors import InvalidOptionError
from spark_queue.model import arguments as spec
from spark_queue.model.deprecations import SparkQueueDeprecationWarning


def refused(parse, label, value) -> str:
    with pytest.raises(InvalidOptionError) as caught:
        parse(label, value)
    message = str(caught.value)
    assert message.startswith(f"{label} must be "), message
    return message


@pytest.mark.parametrize(
    "value, parsed",
    [(0, 0), (7, 7), ("12", 12), (" 3 ", 3), (np.int64(5), 5), (2**63 - 1, 2**63 - 1)],
)
def test_a_count_is_a_whole_number(value, parsed):
    assert spec.parse_count("n", value) == parsed
    assert type(spec.parse_count("n", value)) is int


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        np.True_,
        1.5,
        5.0,
        "5.0",
        "1_000",
        "1e3",
        "",
        "x",
        None,
        -1,
        2**63,
        2**70,
        "٣",
        [1],
        b"1",
    ],
)
def test_a_count_refuses_bools_fractions_and_beyond_int64(value):
    message = refused(spec.parse_count, "maxThings", value)
    assert "whole number >= 0" in message


def test_a_count_has_its_bounds_in_its_message():
    assert "from 1 to 5" in refused(lambda n, v: spec.parse_count(n, v, 1, 5), "k", 6)
    assert spec.parse_count("k", 1, minimum=1) == 1


@pytest.mark.parametrize("value", [True, 1.0, "1.0", -1, 2**63, "a", None])
def test_a_seq_is_a_whole_number_in_int64(value):
    assert "seq" in refused(spec.parse_seq, "seqs", value)


@pytest.mark.parametrize("value, parsed", [(0, 0), ("9", 9), (2**63 - 1, 2**63 - 1)])
def test_seqs(value, parsed):
    assert spec.parse_seq("seqs", value) == parsed


@pytest.mark.parametrize("value", [1.5, True, 2**31, -(2**31) - 1, "1.0", None])
def test_a_priority_fits_an_int32(value):
    assert "priority" in refused(spec.PRIORITY.parse, "priority", value)
    assert spec.PRIORITY.parse("priority", -(2**31)) == -(2**31)
    assert spec.PRIORITY.parse("priority", "7") == 7


def test_limits():
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparkQueueDeprecationWarning)
        assert spec.LIMIT.parse("maxLength", None) is None
        assert spec.LIMIT.parse("maxLength", "none") is None
        assert spec.LIMIT.parse("maxLength", " None ") is None
        assert spec.LIMIT.parse("maxLength", 0) == 0
        assert spec.LIMIT.parse("maxLength", "10") == 10
        assert spec.DELIVERY_LIMIT.parse("maxDeliveries", None) is None
        assert spec.DELIVERY_LIMIT.parse("maxDeliveries", "NONE") is None
        assert spec.DELIVERY_LIMIT.parse("maxDeliveries", 3) == 3
    for bad in (-2, 2**70, 1.5, 10.0, True, "ten", "nothing"):
        message = refused(spec.LIMIT.parse, "maxLength", bad)
        assert "or None (as text: none) for no limit" in message
    refused(spec.DELIVERY_LIMIT.parse, "maxDeliveries", 2.0)


@pytest.mark.parametrize(
    ("kind", "old"),
    [(spec.LIMIT, -1), (spec.LIMIT, "-1"), (spec.DELIVERY_LIMIT, 0), (spec.DELIVERY_LIMIT, -1)],
)
def test_the_old_spellings_of_no_limit_still_mean_none_and_warn(kind, old):
    with pytest.warns(SparkQueueDeprecationWarning) as warned:
        assert kind.parse("maxLength", old) is None
    assert [str(w.message) for w in warned] == [
        f"maxLength={old!r} for none is deprecated: use None (as text: none)"
    ]


@pytest.mark.parametrize(
    "value, millis",
    [
        (0, 0),
        (250, 250),
        ("250", 250),
        ("250ms", 250),
        ("1.5s", 1500),
        ("30 seconds", 30_000),
        ("5m", 300_000),
        ("5 Minutes", 300_000),
        ("2h", 7_200_000),
        ("1 day", 86_400_000),
        ("1 week", 604_800_000),
        ("2w", 1_209_600_000),
        (dt.timedelta(seconds=2), 2000),
        (f"{spec.MAX_DURATION_DAYS} days", spec.MAX_DURATION_MS),
    ],
)
def test_durations_have_one_grammar(value, millis):
    assert spec.parse_duration_ms("expiration", value) == millis


@pytest.mark.parametrize(
    "value",
    [
        1.5,
        1.0,
        True,
        "1.5",
        "0.5ms",
        "1.0001s",
        "5 fortnights",
        "-1s",
        -1,
        "",
        "1e3",
        10**16,
        2**62,
        2**70,
        spec.MAX_DURATION_MS + 1,
        dt.timedelta(microseconds=1),
        dt.timedelta(seconds=-1),
        None,
    ],
)
def test_durations_refuse_fractions_of_a_millisecond_and_beyond_a_timestamp(value):
    message = refused(spec.parse_duration_ms, "leasePeriod", value)
    assert "'30s'" in message and "days" in message


def test_now_plus_the_longest_duration_is_a_timestamp():
    now = dt.datetime.now(dt.timezone.utc)
    assert now + dt.timedelta(milliseconds=spec.MAX_DURATION_MS) < dt.datetime.max.replace(
        tzinfo=dt.timezone.utc
    )


def test_a_duration_can_mean_none_or_have_a_minimum():
    assert spec.parse_duration_ms("redeliveryDelay", 0, zero_is_none=True) is None
    assert spec.parse_duration_ms("redeliveryDelay", None, zero_is_none=True) is None
    assert "> 0" in refused(lambda n, v: spec.parse_duration_ms(n, v, minimum_ms=1), "p", 0)


def test_fractions_multipliers():
    assert spec.FRACTION.parse("rejectThreshold", "0.5") == 0.5
    assert spec.FRACTION.parse("rejectThreshold", 1) == 1.0
    for bad in (0, 1.01, "nan", float("inf"), True, "1_0", "half"):
        refused(spec.FRACTION.parse, "rejectThreshold", bad)
    assert spec.MULTIPLIER.parse("m", "2.5") == 2.5
    for bad in (0.5, "inf", float("nan"), True, "x"):
        refused(spec.MULTIPLIER.parse, "m", bad)


def test_choices_bools_names():
    assert spec.Choice(spec.OVERFLOW_POLICIES).parse("overflow", " RING ") == "ring"
    message = refused(spec.Choice(spec.OVERFLOW_POLICIES).parse, "o", 1)
    assert "drop-head, ring, reject-publish, reject-publish-dlx" in message
    assert spec.BOOL.parse("exclusive", "TRUE") is True
    assert spec.BOOL.parse("exclusive", np.False_) is False
    for bad in (1, 0, "yes", None):
        refused(spec.BOOL.parse, "exclusive", bad)
    assert spec.parse_queue_name("queue", "a.b-c_1") == "a.b-c_1"
    assert spec.parse_queue_name("queue", "a.") == "a."
    for bad in ("", "a b", "x" * 256, 3, None, "orders\n", ".", "..", "..."):
        refused(spec.parse_queue_name, "queue", bad)
    for bad in ("", "a\nb", 3, "billing\n"):
        refused(spec.parse_consumer_name, "consumer", bad)


def test_a_long_value_is_cut_in_the_message():
    message = refused(spec.parse_count, "n", "9" * 10_000)
    assert len(message) < 200


def test_each_argument_has_one_spelling_per_surface():
    lease = spec.ARGUMENTS["lease_period"]
    assert (lease.option, lease.flag) == ("leasePeriod", "--lease-period")
    assert spec.ARGUMENTS["max_length_bytes"].policy_keys == (
        "default-max-length-bytes",
        "max-length-bytes",
    )
    assert spec.ARGUMENTS["max_messages"].option == "maxMessagesPerTrigger"
    for argument in spec.SPECIFICATION:
        assert argument.doc and set(argument.scopes) <= set(spec.SCOPES), argument.name
        if argument.default is not None:
            assert argument.parse(argument.default) == argument.default, argument.name
