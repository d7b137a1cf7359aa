"""The public API's types against the specification, the typed parameter object through the
real API, and the facade as the one import of jobs, notebooks and the docs. No Spark."""

from __future__ import annotations

import ast
import dataclasses
import datetime
import importlib
import inspect
import pkgutil
import re
import typing
from pathlib import Path

import pytest

import spark_queue
from spark_queue import (
    COUNTERS,
    GAUGES,
    ConsumerOptions,
    InvalidOptionError,
    Publisher,
    PublisherOptions,
    QueueArgumentKeywords,
    QueueArguments,
    QueueStats,
    QueueTable,
    SparkQueueDeprecationWarning,
)
from spark_queue.clients.consumer import CONSUMER_OPTIONS
from spark_queue.model.arguments import ARGUMENTS, SPECIFICATION, Choice, arguments_of
from spark_queue.spark.options import SinkOptions, SourceOptions

ROOT = Path(__file__).resolve().parents[1]
# Where a Python type of an argument is spelt: its name there -> its annotation.
TYPED = {
    "QueueArgumentKeywords": typing.get_type_hints(QueueArgumentKeywords),
    "ConsumerOptions": typing.get_type_hints(ConsumerOptions),
    "PublisherOptions": typing.get_type_hints(PublisherOptions),
    "QueueArguments": typing.get_type_hints(QueueArguments),
    "SinkOptions": typing.get_type_hints(SinkOptions),
    "SourceOptions": typing.get_type_hints(SourceOptions),
    "QueueTable.publish": typing.get_type_hints(QueueTable.publish),
    "Publisher": typing.get_type_hints(Publisher.__init__),
}


def names(scope: str) -> set[str]:
    return {a.name for a in arguments_of(scope)}


def admits_none(hint: object) -> bool:
    return hint is type(None) or type(None) in typing.get_args(hint)


# -- the types against the specification -------------------------------------------------


def test_the_keyword_types_hold_each_scopes_arguments():
    assert set(QueueArgumentKeywords.__annotations__) == names("queue")
    assert set(ConsumerOptions.__annotations__) == names("consumer") == set(CONSUMER_OPTIONS)
    assert set(TYPED["PublisherOptions"]) == names("publisher") | names("queue")
    assert {f.name for f in dataclasses.fields(QueueArguments)} == names("queue") - {"ring_size"}
    publisher = inspect.signature(Publisher.__init__).parameters.values()
    own = {p.name for p in publisher if p.kind is p.KEYWORD_ONLY}
    assert own == names("publisher")


def test_every_choice_is_one_literal_type_with_the_specifications_values():
    choices = [a for a in SPECIFICATION if isinstance(a.kind, Choice)]
    assert {a.name for a in choices} >= {
        "overflow",
        "on_reject",
        "expiration_model",
        "semantics",
        "ack_mode",
        "read_mode",
    }
    for argument in choices:
        spelt = {
            where: hints[argument.name] for where, hints in TYPED.items() if argument.name in hints
        }
        assert spelt, f"{argument.name} has no Literal type in {sorted(TYPED)}"
        for where, hint in spelt.items():
            assert typing.get_origin(hint) is typing.Literal, f"{where}.{argument.name}: {hint}"
            assert typing.get_args(hint) == argument.kind.values, f"{where}.{argument.name}"
        assert getattr(spark_queue, _literal_name(argument.name)) == next(iter(spelt.values()))


def _literal_name(argument: str) -> str:
    """The package's name of a choice's Literal type: ``on_reject``, ``OnReject``."""
    return "".join(word.capitalize() for word in argument.split("_"))


@pytest.mark.parametrize("typed", ["QueueArgumentKeywords", "ConsumerOptions", "PublisherOptions"])
def test_a_keyword_type_admits_none_only_where_the_parser_takes_none(typed: str):
    admitted = [name for name, hint in TYPED[typed].items() if admits_none(hint)]
    assert admitted
    for name in admitted:
        assert ARGUMENTS[name].parse(None) is None, f"{typed}.{name} admits None"


def test_a_duration_keyword_takes_what_the_duration_parser_takes():
    durations = {a.name for a in SPECIFICATION if type(a.kind).__name__ == "Duration"}
    for typed in ("QueueArgumentKeywords", "ConsumerOptions", "PublisherOptions"):
        for name, hint in TYPED[typed].items():
            if name in durations:
                allowed = set(typing.get_args(hint)) - {type(None)}
                assert allowed == {int, str, datetime.timedelta}, f"{typed}.{name}: {hint}"


def test_stats_hold_the_keys_of_their_type(queue_path: str):
    table = QueueTable(queue_path)
    table.publish("orders", [b"x"])
    stats = table.stats("orders")
    assert set(stats) == set(QueueStats.__annotations__)
    assert set(stats) == {*COUNTERS, *GAUGES, "leased_by_consumer", "groups_by_consumer"}
    assert all(type(stats[name]) is int for name in (*COUNTERS, *GAUGES))


# -- QueueArguments as a parameter object ---------------------------------------------------


def test_declare_takes_queue_arguments_as_an_object(queue_path: str):
    table = QueueTable(queue_path)
    declared = table.declare("orders", QueueArguments(max_length=10, overflow="ring"))
    assert (declared.max_length, declared.overflow) == (10, "ring")
    assert table.arguments("orders") == declared
    # The object and keywords that agree; the same queue by keywords alone.
    assert table.declare("orders", QueueArguments(max_length=10, overflow="ring"), ring_size=10)
    assert table.declare("orders", max_length=10, overflow="ring") == declared
    # A queue's arguments declare another queue with the same ones.
    assert table.declare("copy", table.arguments("orders")) == declared


def test_alter_and_resolve_take_queue_arguments(queue_path: str, tmp_path: Path):
    table = QueueTable(queue_path)
    table.declare("orders", max_length=10)
    altered = table.alter("orders", QueueArguments(max_length=5, expiration=60_000))
    assert (altered.max_length, altered.expiration) == (5, 60_000)
    policies = tmp_path / "policies.toml"
    policies.write_text('[policy.all]\nmatch = "#"\nmax-length = 3\n')
    capped = QueueTable(queue_path, policies=str(policies))
    resolution = capped.resolve("new", QueueArguments(max_length=100))
    assert resolution.arguments.max_length == 3


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        (
            {"max_length": 20},
            "max_length is given twice, differently: max_length=10 by the QueueArguments, "
            "max_length=20 as a keyword",
        ),
        (
            {"ring_size": 5},
            "max_length is given twice, differently: max_length=10 by the QueueArguments, "
            "ring_size=5 as a keyword",
        ),
        (
            {"overflow": "ring"},
            "overflow is given twice, differently: overflow='drop-head' by the "
            "QueueArguments, overflow='ring' as a keyword",
        ),
    ],
)
def test_an_argument_given_differently_by_the_object_and_a_keyword_is_refused(
    queue_path: str, keywords: dict[str, object], message: str
):
    table = QueueTable(queue_path)
    with pytest.raises(InvalidOptionError) as refused:
        table.declare("orders", QueueArguments(max_length=10), **keywords)
    assert str(refused.value) == message
    assert not Path(queue_path).exists()  # nothing written


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            QueueArguments(overflow="rings"),
            "overflow must be one of drop-head, ring, reject-publish, reject-publish-dlx; "
            "got 'rings'",
        ),
        (QueueArguments(max_length=-5), "max_length must be a whole number >= 0, or None"),
        (QueueArguments(max_length=True), "max_length must be a whole number >= 0, or None"),
        (
            QueueArguments(overflow="ring", max_length_bytes=10),
            "overflow=ring bounds the message count only",
        ),
        (
            {"max_length": 10},
            "arguments must be a QueueArguments (or give the queue arguments as keywords); "
            "got {'max_length': 10} (dict)",
        ),
    ],
)
def test_a_wrong_queue_arguments_object_gets_the_named_error(
    queue_path: str, arguments: object, message: str
):
    table = QueueTable(queue_path)
    for call in (table.declare, table.alter):
        with pytest.raises(InvalidOptionError, match=re.escape(message)) as refused:
            call("orders", arguments)
        assert "\n" not in str(refused.value)
    assert not Path(queue_path).exists()


def test_a_wrong_keyword_value_still_gets_the_named_error(queue_path: str):
    table = QueueTable(queue_path)
    with pytest.raises(InvalidOptionError, match=r"^overflow must be one of drop-head, ring,"):
        table.declare("orders", overflow="rings")
    with pytest.raises(InvalidOptionError, match=r"^on_reject must be one of drop, fail"):
        table.publish("orders", [b"x"], on_reject="ignore")
    with pytest.raises(InvalidOptionError, match=r"^unknown consumer option 'max_length'"):
        table.consumer("orders", "worker", max_length=3)
    assert not Path(queue_path).exists()


# -- the facade --------------------------------------------------------------------------

SUBMODULES = {m.name for m in pkgutil.iter_modules(spark_queue.__path__)}


def internal_imports(tree: ast.AST) -> list[str]:
    """What ``tree`` takes from the package's internal modules: ``from spark_queue.x import
    ...``, ``import spark_queue.x``, and ``spark_queue.x`` reached as an attribute."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("spark_queue."):
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.startswith("spark_queue.")]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "spark_queue"
            and node.attr in SUBMODULES
        ):
            found.append(f"spark_queue.{node.attr}")
    return found


def python_sources() -> list[tuple[str, ast.AST]]:
    """The Python of jobs/ and notebooks/, and the Python blocks of the README and docs."""
    sources = [
        (str(path.relative_to(ROOT)), ast.parse(path.read_text(encoding="utf-8")))
        for folder in ("jobs", "notebooks")
        for path in sorted((ROOT / folder).rglob("*.py"))
    ]
    fence = re.compile(r"^```(?:python|py)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in fence.findall(page.read_text(encoding="utf-8")):
            try:
                sources.append((str(page.relative_to(ROOT)), ast.parse(block)))
            except SyntaxError:  # elided text (...) or a console session
                continue
    return sources


# What the jobs take beside the facade: the argument specification, to make their flags from
# it, and the storage flags' parser, as the CLI does. Nothing a user calls.
JOBS_INTERNALS = {
    "from spark_queue.model.arguments import ...",
    "from spark_queue.model.queue_arguments import ...",
    "from spark_queue.storage.location import ...",
}


def test_notebooks_and_docs_import_only_the_facade_and_jobs_only_their_helpers_beside():
    sources = python_sources()
    assert any(name.startswith("jobs/") for name, _ in sources)
    assert any(name.startswith("notebooks/") for name, _ in sources)
    internal = [
        (name, used)
        for name, tree in sources
        for used in internal_imports(tree)
        if not (name.startswith("jobs/") and used in JOBS_INTERNALS)
    ]
    assert not internal, f"internal modules used (import them from spark_queue): {internal}"
    jobs = {
        used
        for name, tree in sources
        if name.startswith("jobs/")
        for used in internal_imports(tree)
    }
    assert jobs == JOBS_INTERNALS  # each allowed module is still needed


def test_the_facade_holds_what_users_call_and_the_cli_helpers_moved_out_with_a_warning():
    moved = {
        "ARGUMENTS": "spark_queue.model.arguments",
        "Argument": "spark_queue.model.arguments",
        "flag_type": "spark_queue.model.arguments",
        "validate_arguments": "spark_queue.model.queue_arguments",
        "parse_storage_flags": "spark_queue.storage.location",
    }
    assert not set(moved) & set(spark_queue.__all__)
    assert {"Rows", "SparkQueueDeprecationWarning", "check_exclusive_commits"} <= set(
        spark_queue.__all__
    )
    for name, module in moved.items():
        with pytest.warns(SparkQueueDeprecationWarning, match=f"import it from {module}"):
            assert getattr(spark_queue, name) is getattr(importlib.import_module(module), name)


def test_the_internal_import_check_finds_each_form():
    tree = ast.parse(
        "from spark_queue.rules import COUNTERS\nimport spark_queue.storage.location\n"
        "import spark_queue\nspark_queue.model.schema.BROWSE_COLUMNS\nspark_queue.QueueTable\n"
    )
    assert internal_imports(tree) == [
        "from spark_queue.rules import ...",
        "import spark_queue.storage.location",
        "spark_queue.model",
    ]


def test_the_facade_exports_each_public_name_once_and_each_resolves():
    assert len(set(spark_queue.__all__)) == len(spark_queue.__all__)
    for name in spark_queue.__all__:
        if name in ("configure_s3a", "local_session", "register", "s3a_conf"):
            continue  # imported from the Spark layer when first asked for
        assert getattr(spark_queue, name) is not None
    errors = {
        name
        for name, value in vars(spark_queue.errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and not name.startswith("_")
    }
    assert errors <= set(spark_queue.__all__)
