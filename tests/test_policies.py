"""Queue policies (SEMANTICS §5, docs/POLICIES.md): matching, precedence, defaults, caps,
invalid files; then the policies at work in QueueTable, the CLI and the sink.

Everything above the ``spark`` section runs without Spark (QueueTable commits through
delta-rs); the sink tests at the end need the session.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_queue import QueueTable
from spark_queue.errors import ArgumentMismatchError, InvalidOptionError, PolicyError
from spark_queue.model.policies import (
    ENV_VAR,
    Policies,
    compare_specificity,
    load_policies,
    match_words,
)
from spark_queue.model.queue_arguments import QueueArguments

LAYERS = """
[policy.everything]
match = "#"
default-max-length = 100

[policy.orders]
match = "orders.#"
default-max-length = 200

[policy.any-region]
match = "orders.*"
default-max-length = 300

[policy.eu]
match = "orders.eu"
default-max-length = 400
"""


def policies(text: str) -> Policies:
    return Policies.parse(text, "test.toml")


def chosen(text: str, queue: str) -> str | None:
    return policies(text).resolve(queue, {}).policy


def write(tmp_path: Path, text: str, name: str = "policies.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- matching --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "queue", "expected"),
    [
        ("orders", "orders", True),
        ("orders", "orders.eu", False),
        ("orders.*", "orders.eu", True),
        ("orders.*", "orders", False),  # '*' is exactly one word
        ("orders.*", "orders.eu.fr", False),
        ("orders.#", "orders", True),  # '#' matches zero words (Artemis)
        ("orders.#", "orders.eu.fr", True),
        ("orders.#", "ordersx", False),
        ("#.dlq", "dlq", True),
        ("#.dlq", "a.b.dlq", True),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y", False),
        ("*.*", "a.b", True),
        ("*.*", "a", False),
        ("#", "anything.at.all", True),
        ("a.*.#", "a", False),
        ("a.*.#", "a.b", True),
    ],
)
def test_artemis_wildcards(expression, queue, expected):
    assert match_words(expression, queue) is expected


WORDS = st.sampled_from(["a", "b", "c-1"])


def _oracle(expression: str) -> re.Pattern[str]:
    """An independent translation of a match expression to a regex over '.'-joined words."""
    parts = []
    for word in expression.split("."):
        parts.append({"*": r"[^.]+", "#": r"(?:[^.]+(?:\.[^.]+)*)?"}.get(word, re.escape(word)))
    # '#' may stand for zero words: then the '.' beside it goes too.
    text = r"\.".join(parts)
    text = text.replace(r"\.(?:[^.]+(?:\.[^.]+)*)?", r"(?:\.[^.]+)*")
    text = text.replace(r"(?:[^.]+(?:\.[^.]+)*)?\.", r"(?:[^.]+\.)*")
    return re.compile(text)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(WORDS, st.just("*"), st.just("#")), min_size=1, max_size=4),
    st.lists(WORDS, min_size=1, max_size=5),
)
def test_wildcards_agree_with_a_regex_translation(expression_words, queue_words):
    expression, queue = ".".join(expression_words), ".".join(queue_words)
    if expression_words.count("#") > 1:  # the oracle's rewrite handles one '#' only
        return
    assert match_words(expression, queue) == bool(_oracle(expression).fullmatch(queue))


# -- precedence --------------------------------------------------------------------------------


def test_exact_beats_star_beats_hash():
    assert chosen(LAYERS, "orders.eu") == "eu"
    assert chosen(LAYERS, "orders.us") == "any-region"
    assert chosen(LAYERS, "orders.us.east") == "orders"
    assert chosen(LAYERS, "orders") == "orders"  # 'orders.#' matches with zero words
    assert chosen(LAYERS, "payments") == "everything"
    resolved = policies(LAYERS).resolve("orders.us", {})
    assert resolved.arguments.max_length == 300


def test_file_order_does_not_change_specificity():
    reversed_text = "\n".join(
        "[policy." + block for block in reversed(LAYERS.split("[policy.")[1:])
    )
    assert chosen(reversed_text, "orders.eu") == "eu"
    assert chosen(reversed_text, "orders.us") == "any-region"


def test_artemis_specificity_between_wildcards():
    # Among '#' expressions the longer is more specific; among '*' ones, a literal word beats
    # a '*' at the first position where they differ.
    assert compare_specificity("a.b.#", "a.#") < 0
    assert compare_specificity("a.*.c", "*.b.c") < 0
    assert compare_specificity("a.b.c", "a.*.c") < 0
    assert compare_specificity("a.*", "#") < 0
    text = '[policy.wide]\nmatch = "*.b.c"\n[policy.narrow]\nmatch = "a.*.c"\n'
    assert chosen(text, "a.b.c") == "narrow"


def test_priority_comes_first_then_match_before_pattern_then_file_order():
    text = """
    [policy.exact]
    match = "orders.eu"

    [policy.regex-low]
    pattern = "^orders"

    [policy.regex-high]
    pattern = "eu$"
    priority = 5

    [policy.regex-high-too]
    pattern = "^orders\\\\."
    priority = 5
    """
    # Highest priority wins across both kinds; at equal priority, file order.
    assert chosen(text, "orders.eu") == "regex-high"
    # Equal priority (0): a match entry beats a pattern entry.
    assert chosen(text.replace("priority = 5", "priority = 0"), "orders.eu") == "exact"
    # Patterns only: the highest priority wins.
    assert chosen(text, "orders.us") == "regex-high-too"
    assert chosen(text, "ordersx") == "regex-low"
    assert chosen(text, "payments") is None


# -- defaults and caps ---------------------------------------------------------------------------

CAPPED = """
[policy.rings]
match = "ring.#"
default-ring-size = 1000
default-expiration = "5 minutes"

[policy.capped]
match = "#"
default-max-length = 800
max-length = 500
max-length-bytes = 4096
default-dead-letter-queue = "dlq"
"""


def test_defaults_apply_only_where_the_queue_has_no_explicit_value():
    rings = policies(CAPPED)
    plain = rings.resolve("ring.orders", {})
    assert plain.arguments == QueueArguments(max_length=1000, overflow="ring", expiration=300_000)
    assert str(plain.origins["max_length"]) == "policy 'rings' default"
    assert str(plain.origins["dead_letter_queue"]) == "built-in default"
    explicit = rings.resolve("ring.orders", {"max_length": 10, "expiration": None})
    assert explicit.arguments.max_length == 10
    assert explicit.arguments.overflow == "ring"  # not given: the policy's default
    assert explicit.arguments.expiration is None  # given as "none": stays
    assert explicit.origins["max_length"].kind == "queue"
    given_overflow = rings.resolve("ring.orders", {"overflow": "drop-head"})
    assert (given_overflow.arguments.max_length, given_overflow.arguments.overflow) == (
        1000,
        "drop-head",
    )


def test_caps_take_the_minimum_of_argument_and_policy():
    capped = policies(CAPPED)
    assert capped.resolve("a", {"max_length": 1000}).arguments.max_length == 500
    assert capped.resolve("a", {"max_length": 20}).arguments.max_length == 20
    assert capped.resolve("a", {"max_length": None}).arguments.max_length == 500  # unlimited
    assert capped.resolve("a", {}).arguments.max_length == 500  # default 800, capped
    assert capped.resolve("a", {}).arguments.max_length_bytes == 4096
    origin = capped.resolve("a", {"max_length": 1000}).origins["max_length"]
    assert (origin.kind, origin.policy, origin.before) == ("cap", "capped", 1000)
    assert str(origin) == "policy 'capped' cap (was 1000)"


def test_a_default_dead_letter_queue_is_not_its_own():
    capped = policies(CAPPED)
    assert capped.resolve("orders", {}).arguments.dead_letter_queue == "dlq"
    assert capped.resolve("dlq", {}).arguments.dead_letter_queue is None


def test_a_byte_cap_on_a_ring_queue_is_an_error_naming_the_policy():
    with pytest.raises(PolicyError, match=r"overflow=ring \(from queue\).*policy 'capped' cap"):
        policies(CAPPED).resolve("orders", {"overflow": "ring"})


def test_resolution_as_json():
    data = policies(CAPPED).resolve("a", {"max_length": 1000}).to_dict()
    assert data["policy"] == "capped"
    assert data["arguments"]["max_length"] == {
        "value": 500,
        "kind": "cap",
        "policy": "capped",
        "before": 1000,
    }
    assert json.loads(json.dumps(data)) == data


LIMIT = st.one_of(st.none(), st.integers(0, 10_000))


@settings(max_examples=200, deadline=None)
@given(explicit=LIMIT, default=LIMIT, cap=LIMIT, give=st.booleans())
def test_effective_limit_is_explicit_or_default_then_capped(explicit, default, cap, give):
    lines = ['[policy.p]\nmatch = "#"']
    if default is not None:
        lines.append(f"default-max-length = {default}")
    if cap is not None:
        lines.append(f"max-length = {cap}")
    given_arguments = {"max_length": explicit} if give else {}
    effective = policies("\n".join(lines)).resolve("q", given_arguments).arguments.max_length
    before = explicit if give else default
    if cap is None:
        assert effective == before
    else:
        assert effective == (cap if before is None else min(before, cap))


# -- invalid files ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "key", "words"),
    [
        ('[policy.a]\nmatch = "a"\nmax-length = [1,', 3, None, "not valid TOML"),
        ('[policy.a]\nmatch = "a"\n\nmax-lenght = 5', 4, "policy.a.max-lenght", "valid keys:"),
        ('[policy.a]\nmatch = "a"\ndefault-overflow = "sideways"', 3, "default-overflow", "one of"),
        ('[policy.a]\nmatch = "a"\nmax-length = -2', 3, "policy.a.max-length", "whole number"),
        ('[policy.a]\nmatch = "a"\ndefault-expiration = "soon"', 3, "default-expiration", "dur"),
        ('[policy.a]\nmatch = "a"\npattern = "b"', 3, "policy.a.pattern", "has both"),
        ("\n[policy.a]\npriority = 1", 2, "policy.a", "has neither"),
        ('[policy.a]\nmatch = "a.b*"', 2, "policy.a.match", "whole words"),
        ('[policy.a]\nmatch = "a..b"', 2, "policy.a.match", "empty word"),
        ('[policy.a]\npattern = "(x"', 2, "policy.a.pattern", "not a valid regex"),
        ('[policy.a]\nmatch = "a"\npriority = "high"', 3, "policy.a.priority", "integer"),
        ('[policy.a]\nmatch = "a"\n[policy.b]\nmatch = "a"', 4, "policy.b.match", "same match"),
        ('name = "x"\n[policy.a]\nmatch = "a"', 1, "name", "valid: policy"),
        (
            '[policy.a]\nmatch = "a"\ndefault-ring-size = 3\ndefault-overflow = "ring"',
            4,
            "default-overflow",
            "not both",
        ),
        (
            '[policy.a]\nmatch = "a"\ndefault-ring-size = 3\nmax-length-bytes = 10',
            4,
            "policy.a.max-length-bytes",
            "ring",
        ),
        ('[policy."a b"]\nmatch = "a"', 1, "policy.a b", "policy name"),
    ],
)
def test_invalid_files_name_file_line_and_key(tmp_path, text, line, key, words):
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as raised:
        Policies.load(path)
    message = str(raised.value)
    assert message.startswith(f"{path}:{line}:"), message
    if key is not None:
        assert key in message, message
    assert words in message, message
    assert isinstance(raised.value, InvalidOptionError)  # a bad option, to every caller


def test_missing_file_and_environment_fallback(tmp_path, monkeypatch):
    with pytest.raises(PolicyError, match=r"nope\.toml: policies file does not exist"):
        Policies.load(tmp_path / "nope.toml")
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert load_policies(None) is None
    monkeypatch.setenv(ENV_VAR, write(tmp_path, CAPPED))
    from_env = load_policies(None)
    assert from_env is not None and from_env.select("x").name == "capped"
    given = load_policies(write(tmp_path, LAYERS, "other.toml"))
    assert given is not None and given.select("x").name == "everything"  # the option wins


def test_the_example_file_in_conf_is_valid():
    example = Policies.load(Path(__file__).resolve().parent.parent / "conf" / "policies.toml")
    assert example.policies, "conf/policies.toml should show at least one policy"


# -- explicit versus effective arguments in the queue state -------------------------------------


def test_queue_table_applies_defaults_and_caps_and_compares_explicit_values(tmp_path, queue_path):
    table = QueueTable(queue_path, policies=write(tmp_path, CAPPED))
    assert table.declare("orders", max_length=1000).max_length == 500
    # Re-declaring the explicit value is no mismatch, though the cap lowered it.
    assert table.declare("orders", max_length=1000).max_length == 500
    with pytest.raises(ArgumentMismatchError, match="maxLength: queue has 1000, given 999"):
        table.declare("orders", max_length=999)
    # A policy default is not an explicit value: giving it is a mismatch with "not set".
    with pytest.raises(
        ArgumentMismatchError,
        match=r"deadLetterQueue: queue has no value set \(in effect 'dlq'\), given 'dlq'",
    ):
        table.declare("orders", dead_letter_queue="dlq")
    ring = table.declare("ring.a")
    assert (ring.max_length, ring.overflow, ring.expiration) == (1000, "ring", 300_000)
    # alter changes the explicit value; the cap still applies.
    assert table.alter("orders", max_length=100).max_length == 100
    assert table.alter("orders", max_length=5000).max_length == 500
    resolution = table.resolve("orders")
    assert resolution.origins["max_length"].before == 5000


def test_policies_are_resolved_again_and_stand_without_a_policies_source(
    tmp_path, queue_path, monkeypatch
):
    monkeypatch.delenv(ENV_VAR, raising=False)
    QueueTable(queue_path, policies=write(tmp_path, CAPPED)).declare("orders", max_length=1000)
    # A process without policies: the stored effective arguments stand.
    plain = QueueTable(queue_path)
    assert plain.declare("orders", max_length=1000).max_length == 500
    assert plain.arguments("orders").dead_letter_queue == "dlq"
    # The file is edited: the next declare by a process with policies applies it, and stores it.
    tighter = write(tmp_path, CAPPED.replace("max-length = 500", "max-length = 50"), "new.toml")
    assert QueueTable(queue_path, policies=tighter).declare("orders").max_length == 50
    assert plain.arguments("orders").max_length == 50
    # No policy matches any more: the queue reverts to its explicit and built-in values.
    none_match = write(tmp_path, '[policy.x]\nmatch = "other"\nmax-length = 1', "none.toml")
    reverted = QueueTable(queue_path, policies=none_match).declare("orders")
    assert (reverted.max_length, reverted.dead_letter_queue) == (1000, None)


def test_a_bad_policies_file_fails_queue_table_before_anything_is_written(tmp_path, queue_path):
    with pytest.raises(PolicyError, match=r"policies\.toml:3: key 'policy\.a\.max-length'"):
        QueueTable(
            queue_path, policies=write(tmp_path, '[policy.a]\nmatch = "#"\nmax-length = "x"')
        )
    assert not Path(queue_path).exists()


# -- the CLI --------------------------------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "spark_queue.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )


def test_cli_policies_check_shows_values_and_their_origin(tmp_path, queue_path):
    path = write(tmp_path, CAPPED)
    QueueTable(queue_path, policies=path).declare("orders", max_length=1000)
    shown = cli("--path", queue_path, "--policies", path, "policies", "check", "orders")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("queue 'orders': policy 'capped'")
    rows = {line.split()[0]: line.rstrip().split(None, 2)[1:] for line in lines[2:]}
    assert rows["maxLength"] == ["500", "policy 'capped' cap (was 1000)"]
    assert rows["deadLetterQueue"] == ["dlq", "policy 'capped' default"]
    assert rows["overflow"] == ["drop-head", "built-in default"]
    # A queue that does not exist, no table needed; flags act as explicit arguments.
    fresh = cli("policies", "check", "ring.x", "--max-length", "7", "--json", env={ENV_VAR: path})
    assert fresh.returncode == 0, fresh.stderr
    data = json.loads(fresh.stdout)
    assert data["policy"] == "rings"
    assert data["arguments"]["max_length"]["value"] == 7
    assert data["arguments"]["overflow"] == {
        "value": "ring",
        "kind": "default",
        "policy": "rings",
        "before": None,
    }


def test_cli_policies_errors_exit_non_zero_and_name_the_problem(tmp_path, queue_path):
    bad = write(tmp_path, '[policy.a]\nmatch = "#"\n\nmax-length-bites = 3')
    refused = cli("--policies", bad, "policies", "check", "orders")
    assert refused.returncode == 1
    assert f"spark-queue: {bad}:4: key 'policy.a.max-length-bites'" in refused.stderr
    declare = cli("--path", queue_path, "--policies", bad, "declare", "orders")
    assert declare.returncode == 1 and "max-length-bites" in declare.stderr
    assert not Path(queue_path).exists()
    missing = cli("policies", "check", "orders")
    assert missing.returncode == 2 and "needs a policies file" in missing.stderr
    good = write(tmp_path, CAPPED, "good.toml")
    name = cli("--policies", good, "policies", "check", "bad name!")
    assert name.returncode == 1 and "queue must be a queue name" in name.stderr
    value = cli("--policies", good, "policies", "check", "q", "--max-length", "many")
    assert value.returncode == 1 and "--max-length must be a whole number" in value.stderr
    # Commands that never declare do not read the policies file.
    QueueTable(queue_path).declare("orders")
    stats = cli("--path", queue_path, "stats", "orders", "--json", env={ENV_VAR: bad})
    assert stats.returncode == 0 and json.loads(stats.stdout)["ready"] == 0
    no_path = cli("stats")
    assert no_path.returncode == 2 and "--path is required by 'stats'" in no_path.stderr


# -- the sink (Spark) ------------------------------------------------------------------------------


@pytest.mark.connect
@pytest.mark.spark
def test_sink_option_policies_defaults_and_caps_queues(spark, tmp_path, queue_path):
    from tests.helpers import messages, write_batch, write_stream

    path = write(tmp_path, CAPPED.replace("max-length = 500", "max-length = 2"))
    rows = messages(spark, ["a", "b", "c", "d", "e"], ["ring.x"] * 3 + ["plain"] * 2)
    write_batch(rows, queue_path, policies=path)
    table = QueueTable(queue_path)
    ring = table.arguments("ring.x")
    assert (ring.max_length, ring.overflow) == (1000, "ring")  # the default, under its cap
    assert table.stats("ring.x")["ready"] == 3
    assert table.arguments("plain").max_length == 2
    # The sink re-declares maxLength=1000 on every batch: capped at 2, never a mismatch.
    for _ in range(2):
        write_stream(
            spark,
            messages(spark, ["f", "g", "h"]),
            queue_path,
            tmp_path,
            queue="capped",
            maxLength=1000,
            policies=path,
        )
    stats = table.stats("capped")
    assert (stats["ready"], stats["dropped"]) == (2, 4)
    assert table.arguments("capped").max_length == 2


@pytest.mark.spark
def test_sink_with_a_bad_policies_file_writes_nothing(spark, tmp_path, queue_path):
    from tests.helpers import messages, write_batch

    bad = write(tmp_path, '[policy.a]\nmatch = "#"\ndefault-overflow = "sideways"')
    with pytest.raises(Exception, match=r"policies\.toml:3: key 'policy\.a\.default-overflow'"):
        write_batch(messages(spark, ["a"]), queue_path, queue="q", policies=bad)
    assert not Path(queue_path).exists()
