"""Every argument of the specification, on every surface that takes it: bad values of its
kind give a named error that spells it as that surface does, and change nothing; random
values are refused on every surface or parse to the same value on every surface; the docs'
tables are the specification's. No Spark: the Spark options are parsed as a data source
parses them (tests/test_bad_input.py writes through Spark)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_queue import QueueTable, cli
from spark_queue.errors import InvalidOptionError, PolicyError
from spark_queue.model.arguments import (
    INT64_MAX,
    SPECIFICATION,
    Argument,
    Bool,
    Choice,
    Count,
    Duration,
    Fraction,
    Limit,
    Multiplier,
    Name,
    Text,
    arguments_of,
)
from spark_queue.model.policies import Policies
from spark_queue.model.queue_arguments import parse_consumer_limits, validate_arguments
from spark_queue.spark.options import parse_browse_options, parse_sink_options, parse_source_options
from tools.argument_docs import ARGUMENTS_PAGE, arguments_page

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_tables_are_the_specifications():
    fix = "make arguments"
    page = (ROOT / ARGUMENTS_PAGE).read_text(encoding="utf-8")
    assert page == arguments_page(), f"{ARGUMENTS_PAGE} differs from the specification: {fix}"
    for argument in SPECIFICATION:
        assert f"\n### `{argument.name}`\n" in page
    # The other pages link to it and copy no table of it.
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        assert "<!-- arguments:" not in path.read_text(encoding="utf-8"), path


def test_the_page_refuses_notes_that_no_longer_fit_the_specification():
    """What only the page says of an argument (tools/argument_docs.py) is checked against
    the specification each time the page is made: a drift fails the test above by name."""
    (capped,) = (a for a in SPECIFICATION if a.name == "max_length")
    new_cap = dataclasses.replace(capped, name="max_widgets")
    with pytest.raises(ValueError, match="max_widgets: a policy cap without CAP_MEANINGS"):
        arguments_page((*SPECIFICATION, new_cap))
    gone = tuple(a for a in SPECIFICATION if a.name != "lease_period")
    with pytest.raises(ValueError, match="lease_period: not an argument of the specification"):
        arguments_page(gone)
    narrowed = tuple(
        dataclasses.replace(a, scopes=("source",)) if a.name == "max_messages" else a
        for a in SPECIFICATION
    )
    with pytest.raises(ValueError, match="max_messages: IN_SCOPE names scope 'lease'"):
        arguments_page(narrowed)
    # A scope's own default (Argument.defaults) is the one the page shows there.
    for name, defaults, message in (
        ("max_messages", {"lease": 50}, "the page shows the default '100' in lease"),
        ("lease_period", {"consumer": "1 minute"}, "the page shows the default '30 s' in consumer"),
        ("max_bytes", {"lease": 7}, "the page shows the default 'unset' in lease"),
    ):
        changed = tuple(
            dataclasses.replace(a, defaults=defaults) if a.name == name else a
            for a in SPECIFICATION
        )
        with pytest.raises(ValueError, match=f"{name}: {message}"):
            arguments_page(changed)


# -- bad values of each kind, on every surface ----------------------------------------------


def bad_values(kind) -> list:
    if isinstance(kind, Count | Limit):
        low = [0] if isinstance(kind, Count) and kind.minimum > 0 else [-2]
        return [True, 1.5, "5.0", "1_000", 2**70, *low]
    if isinstance(kind, Duration):
        return [1.5, True, "5 fortnights", 10**16, "0.5ms"]
    if isinstance(kind, Fraction):
        return [0, 1.5, True, "nan"]
    if isinstance(kind, Multiplier):
        return [0.5, "inf", True]
    if isinstance(kind, Choice):
        return ["bogus", 3]
    if isinstance(kind, Bool):
        return [1, "yes"]
    if isinstance(kind, Name):
        return ["a\x01b", 3]
    assert isinstance(kind, Text), kind
    return ["  ", 3]


def spark_text(value) -> str:
    """A value as ``DataStreamWriter.option`` hands it to the data source (``to_str``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def toml(value) -> str | None:
    """A value in TOML, or None where TOML cannot hold it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value) if -(2**63) <= value <= INT64_MAX else None
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value).replace("inf", "inf")
    return json.dumps(value)


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> QueueTable:
    table = QueueTable(str(tmp_path_factory.mktemp("surfaces") / "queues"))
    table.declare("q")
    table.publish("q", [{"body": b"x"}])
    return table


def version(table: QueueTable) -> int:
    return table.store.open().version()


def surfaces(argument: Argument) -> list[tuple[str, str, object]]:
    """``(surface, spelling, call(table, value))`` of every surface that takes it."""
    name, option = argument.name, argument.option
    found = []
    if "queue" in argument.scopes:
        found += [
            ("declare", name, lambda t, v: t.declare("other", **{name: v})),
            ("alter", name, lambda t, v: t.alter("q", **{name: v})),
            (
                "cli",
                argument.flag,
                lambda t, v: cli.main(["--path", t.path, "declare", "q", f"{argument.flag}={v}"]),
            ),
        ]
    for scope, parse in (
        ("sink", parse_sink_options),
        ("source", parse_source_options),
        ("browse", parse_browse_options),
    ):
        if scope in argument.scopes:
            found.append(
                (
                    f"{scope} option",
                    option,
                    lambda t, v, parse=parse: parse(
                        {"path": t.path, "queue": "q", option.lower(): spark_text(v)}
                    ),
                )
            )
    for key in argument.policy_keys:
        found.append(
            (
                "policy",
                key,
                lambda t, v, key=key: Policies.parse(
                    f'[policy.p]\nmatch = "#"\n{key} = {toml(v)}\n'
                ),
            )
        )
    if "lease" in argument.scopes:
        found.append(("lease", name, lambda t, v: t.lease("q", **{name: v})))
    if "consumer" in argument.scopes:
        found.append(("consumer", name, lambda t, v: t.consumer("q", "c", **{name: v}).close()))
    if "publisher" in argument.scopes:
        found.append(("publisher", name, lambda t, v: t.publisher("q", **{name: v}).close()))
    if "publish" in argument.scopes:
        found.append(("publish", name, lambda t, v: t.publish("q", [{"body": b"y"}], **{name: v})))
    if "call" in argument.scopes:
        found += [(surface, name, call) for surface, call in CALLS.get(name, [])]
    return found


# The calls that take a "call" argument (a queue name is checked where it is looked up).
CALLS = {
    "consumer": [
        ("ack", lambda t, v: t.ack("q", [0], v)),
        ("extend", lambda t, v: t.extend("q", [0], v, "1m")),
        ("release", lambda t, v: t.release("q", consumer=v)),
    ],
    "delay": [("cancel", lambda t, v: t.cancel("q", [0], delay=v))],
    "period": [("extend", lambda t, v: t.extend("q", [0], "c", v))],
    "limit": [("peek", lambda t, v: t.peek("q", v))],
}

CASES = [
    pytest.param(argument, surface, spelling, call, value, id=f"{surface}-{spelling}-{value!r}")
    for argument in SPECIFICATION
    for surface, spelling, call in surfaces(argument)
    for value in bad_values(argument.kind)
    if not (surface == "policy" and toml(value) is None)
    # a lease may ask for no message (it then only settles the queue)
    and not (surface == "lease" and argument.name == "max_messages" and value == 0)
    # Spark options and flags are text: the text "3" is a name
    and not (
        surface in ("cli", "sink option", "source option", "browse option")
        and isinstance(argument.kind, Name | Text)
        and not isinstance(value, str)
    )
]


@pytest.mark.parametrize(("argument", "surface", "spelling", "call", "value"), CASES)
def test_a_bad_value_is_a_named_error_on_every_surface(
    table, argument, surface, spelling, call, value, capsys
):
    before = version(table)
    if surface == "cli":
        assert call(table, value) == 1
        message = capsys.readouterr().err
        assert message.count("\n") == 1 and message.startswith("spark-queue: "), message
    else:
        with pytest.raises(InvalidOptionError) as caught:
            call(table, value)
        message = str(caught.value)
        if surface == "policy":
            assert isinstance(caught.value, PolicyError)
    assert spelling in message, message
    assert version(table) == before


# -- random values: refused everywhere, or the same value everywhere ------------------------

QUEUE_ARGUMENTS = [a for a in arguments_of("queue") if a.name != "ring_size"]
LIMIT_ARGUMENTS = [a for a in arguments_of("source") if a.name in ("lease_period", "max_bytes")]
words = st.sampled_from(
    [
        "",
        " ",
        "-",
        ".",
        "_",
        "e",
        "1",
        "0",
        "5",
        "9" * 25,
        "ms",
        "s",
        "m",
        "h",
        "d",
        "w",
        "week",
        "minutes",
        "true",
        "False",
        "ring",
        "drop-head",
        "inf",
        "nan",
        "q.a",
        "é",
        "\u0661",  # ARABIC-INDIC DIGIT ONE: not a decimal digit here
    ]
)
texts = st.lists(words, max_size=4).map("".join)
values = st.one_of(
    texts,
    st.integers(min_value=-(2**65), max_value=2**65),
    st.integers(min_value=-3, max_value=100_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=2),
    st.booleans(),
)


def outcome(parse):
    try:
        return ("ok", parse())
    except InvalidOptionError as error:
        return ("refused", str(error))


def same(left, right) -> bool:
    """Parsed values are the same (NaN is never parsed, floats compare exactly)."""
    return left == right and type(left) is type(right)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(argument=st.sampled_from(QUEUE_ARGUMENTS), value=values)
def test_a_queue_argument_means_the_same_on_every_surface(argument, value):
    name = argument.name
    keyword = outcome(lambda: validate_arguments({name: value})[name])
    results = {"keyword": keyword}
    if isinstance(value, str) or not isinstance(argument.kind, Name | Text):
        results["option"] = outcome(
            lambda: parse_sink_options(
                {"path": "/queues", argument.option.lower(): spark_text(value)}
            ).arguments[name]
        )
        args = cli.build_parser().parse_args(["declare", "q", f"{argument.flag}={value}"])
        results["flag"] = outcome(lambda: cli._given(args)[name])
    key = f"default-{name.replace('_', '-')}"
    if toml(value) is not None:
        results["policy"] = outcome(
            lambda: (
                Policies.parse(f'[policy.p]\nmatch = "#"\n{key} = {toml(value)}\n')
                .policies[0]
                .defaults[name]
            )
        )
    spelt = {"keyword": name, "option": argument.option, "flag": argument.flag, "policy": key}
    kinds = {kind for kind, _ in results.values()}
    assert len(kinds) == 1, (value, results)
    if kinds == {"ok"}:
        parsed = [result for _, result in results.values()]
        assert all(same(p, parsed[0]) for p in parsed), (value, results)
    else:
        for surface, (_, message) in results.items():
            assert spelt[surface] in message, (surface, message)


@settings(max_examples=80, deadline=None)
@given(argument=st.sampled_from(LIMIT_ARGUMENTS), value=values)
def test_a_consumer_limit_means_the_same_as_an_option_and_a_keyword(argument, value):
    name = argument.name
    keyword = outcome(lambda: parse_consumer_limits({name: value}, surface="keyword"))
    option = outcome(lambda: parse_consumer_limits({name: spark_text(value)}, surface="option"))
    assert keyword[0] == option[0], (value, keyword, option)
    if keyword[0] == "ok":
        assert keyword[1] == option[1]
    else:
        assert name in keyword[1] and argument.option in option[1]


def test_the_same_value_is_stored_by_every_surface(table, tmp_path):
    """Given through a keyword, a Spark option, a flag and a policy default, a queue's
    arguments are stored the same."""
    given = {
        "max_length": "1000",
        "expiration": "1.5s",
        "reject_threshold": "0.5",
        "overflow": "Reject-Publish",
        "exclusive": "TRUE",
        "duplicate_window": "2 minutes",
    }
    table.declare("by-keyword", **given)
    options = {ARG.option.lower(): v for ARG in SPECIFICATION if (v := given.get(ARG.name))}
    table.declare("by-option", **parse_sink_options({"path": "/queues", **options}).arguments)
    flags = [f"{a.flag}={given[a.name]}" for a in SPECIFICATION if a.name in given]
    assert cli.main(["--path", table.path, "declare", "by-flag", *flags]) == 0
    policy = tmp_path / "policies.toml"
    policy.write_text(
        '[policy.p]\nmatch = "by-policy"\n'
        + "".join(f'default-{n.replace("_", "-")} = "{v}"\n' for n, v in given.items())
    )
    by_policy = QueueTable(table.path, policies=str(policy))
    by_policy.declare("by-policy")
    stored = {q: table.arguments(q) for q in ("by-keyword", "by-option", "by-flag", "by-policy")}
    assert len(set(stored.values())) == 1, stored
    assert stored["by-keyword"].expiration == 1500


# A filter's SQL is checked at the consumer's first lease, on the table's columns; its type
# when the consumer is made (test_argument_regressions).
CLIENT_OPTIONS = [
    a for a in SPECIFICATION if {"consumer", "publisher"} & set(a.scopes) and a.name != "filter"
]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(argument=st.sampled_from(CLIENT_OPTIONS), value=values)
def test_a_client_option_is_refused_when_made_or_taken_as_parsed(table, argument, value):
    """A consumer's or publisher's option: refused by name when the client is made (nothing
    written), or the client runs with what the specification parses."""
    name = argument.name
    expected = outcome(lambda: argument.parse(value))
    before = version(table)
    make = table.consumer if "consumer" in argument.scopes else table.publisher
    client_args = ("q", "c") if make == table.consumer else ("q",)
    # ack_interval must be below half the lease period: a long one leaves it all valid.
    period = {"lease_period": "1000 days"} if name == "ack_interval" else {}
    made = outcome(lambda: make(*client_args, **period, **{name: value}))
    if expected[0] == "refused":
        assert made[0] == "refused" and name in made[1], (value, made)
        assert version(table) == before
        return
    assert made[0] == "ok", (value, made)
    client = made[1]
    client.close()
    parsed = expected[1]
    if name in TAKEN and parsed is not None:
        seconds = isinstance(argument.kind, Duration)
        assert TAKEN[name](client) == (parsed / 1000 if seconds else parsed), value


# Where a client keeps each option it took (durations in seconds): the consumer's parts
# (prefetch, acknowledgements, long polling) keep theirs.
TAKEN = {
    "max_prefetch": lambda client: client._prefetch.max_prefetch,
    "ack_batch": lambda client: client._acks.batch_size,
    "ack_interval": lambda client: client._acks.interval_seconds,
    "idle_check_interval": lambda client: client._long_poll.max_interval_seconds,
    "idle_lease_interval": lambda client: client._long_poll.idle_lease_interval_seconds,
    "linger": lambda client: client.linger_s,
    "max_batch": lambda client: client.max_batch,
    "on_reject": lambda client: client.on_reject,
}
