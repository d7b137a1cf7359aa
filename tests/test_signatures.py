"""Every public signature against the specification: the Python API (``QueueTable``, the
consumer and publisher factories, the clients' and messages' methods), the CLI's flags and
arguments, the jobs' flags and the Spark options name each argument as the specification
does, in the surface's case, the queue first and the consumer after it; a duration is a
``DurationLike`` wherever one is taken; no name is an old spelling or carries a unit it does
not take alone. No Spark."""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_queue import Consumer, Message, Publisher, QueueTable
from spark_queue.cli import build_parser
from spark_queue.model.arguments import ARGUMENTS, SPECIFICATION, Duration, arguments_of, camel
from spark_queue.model.deprecations import CONSUMER_RENAMES, PUBLISHER_RENAMES, QUEUE_RENAMES
from spark_queue.spark.options import BROWSE_OPTIONS, SOURCE_OPTIONS

ROOT = Path(__file__).resolve().parents[1]
# Names a call takes beside the specification's arguments: what it acts on (seqs, rows, a
# message), an idempotent publish's pair, vacuum's (delta-rs's names), and the catch-alls
# of queue arguments and client options.
CALL_ONLY = {
    "seqs",
    "rows",
    "deliveries",
    "producer",
    "sequence",
    "strict_groups",
    "progress",
    "retention_hours",
    "dry_run",
    "force",
    "versions",
    "message",
    "body",
    "key",
    "headers",
    "message_id",
    "priority",
    "deliver_at",
    "expires_at",
    "storage_options",
    "broker",
    "broker_token",
    "arguments",
    "keywords",
    "options",
}
# Old names, which only a deprecation keeps: no signature declares one.
OLD_NAMES = {*QUEUE_RENAMES, *CONSUMER_RENAMES, *PUBLISHER_RENAMES, "timeout"}
TIME_UNITS = re.compile(r"_(ms|s|sec|seconds|minutes|hours|days)$")
# delta-rs's vacuum(retention_hours=...): hours, and only hours.
UNIT_NAMED = {"retention_hours"}
DURATIONS = {a.name for a in SPECIFICATION if isinstance(a.kind, Duration)}


def public_callables() -> Iterator[tuple[str, Callable[..., object]]]:
    """Every public method of the API's classes, and what makes the table and the clients
    (a message is made by its consumer)."""
    for cls in (QueueTable, Consumer, Publisher, Message):
        for name, member in vars(cls).items():
            made_by_users = name == "__init__" and cls is not Message
            if callable(member) and (not name.startswith("_") or made_by_users):
                yield f"{cls.__name__}.{name}", getattr(cls, name)


# Each call's parameters, past the object it acts on (``self``; a client's ``table``).
SIGNATURES = {
    where: [
        p
        for p in inspect.signature(function).parameters.values()
        if p.name != "self" and not (p.name == "table" and where.endswith("__init__"))
    ]
    for where, function in public_callables()
}


def test_the_signatures_were_found():
    assert {"QueueTable.publish", "QueueTable.release", "Consumer.receive", "Publisher.send"} <= (
        set(SIGNATURES)
    )


@pytest.mark.parametrize("where", sorted(SIGNATURES))
def test_every_parameter_is_the_specifications_or_a_calls_own(where: str):
    for parameter in SIGNATURES[where]:
        name = parameter.name
        assert name in ARGUMENTS or name in CALL_ONLY, f"{where}: {name} is in no vocabulary"
        assert name not in OLD_NAMES, f"{where}: {name} is an old spelling"
        assert not TIME_UNITS.search(name) or name in UNIT_NAMED, f"{where}: {name}'s unit"


@pytest.mark.parametrize("where", sorted(SIGNATURES))
def test_the_queue_comes_first_and_the_consumer_after_it(where: str):
    names = [p.name for p in SIGNATURES[where]]
    if "queue" in names:
        assert names[0] == "queue", f"{where}{names}"
    if "consumer" in names and "queue" in names:
        assert names.index("queue") < names.index("consumer"), f"{where}{names}"


@pytest.mark.parametrize("where", sorted(SIGNATURES))
def test_a_duration_is_one_type_wherever_one_is_taken(where: str):
    for parameter in SIGNATURES[where]:
        if parameter.name in DURATIONS:
            assert "DurationLike" in str(parameter.annotation), f"{where}: {parameter}"


@pytest.mark.parametrize(
    ("scope", "where"),
    [
        ("lease", "QueueTable.lease"),
        ("consumer", "Consumer.__init__"),
        ("publisher", "Publisher.__init__"),
        ("publish", "QueueTable.publish"),
    ],
)
def test_each_scope_is_a_signatures_keywords_by_the_same_names(scope: str, where: str):
    names = {p.name for p in SIGNATURES[where]}
    assert {a.name for a in arguments_of(scope)} <= names, where


def test_each_call_argument_is_taken_by_name_where_the_calls_take_it():
    takers = {
        name: {
            where
            for where, parameters in SIGNATURES.items()
            if name in {p.name for p in parameters}
        }
        for name in (a.name for a in arguments_of("call"))
    }
    assert takers["queue"] >= {
        f"QueueTable.{m}"
        for m in (
            "declare",
            "alter",
            "arguments",
            "resolve",
            "stats",
            "peek",
            "purge",
            "publish",
            "publish_outcome",
            "lease",
            "ack",
            "cancel",
            "expire",
            "extend",
            "release",
            "consumer",
            "publisher",
            "history",
        )
    }
    assert takers["consumer"] >= {
        f"QueueTable.{m}" for m in ("lease", "ack", "cancel", "expire", "extend", "release")
    } | {"QueueTable.consumer", "Consumer.__init__"}
    assert takers["delay"] == {"QueueTable.cancel", "Consumer.nack", "Message.nack"}
    assert takers["period"] == {"QueueTable.extend"}
    assert takers["wait_time"] == {"Consumer.receive"}
    assert takers["limit"] == {"QueueTable.peek"}


# -- the command line -------------------------------------------------------------------

GLOBAL = {"--path", "--policies", "--broker", "--storage-option", "-h", "--help"}
OUTPUT = {"--json", "--progress", "--quiet", "--format", "--file", "--per-partition"}


def commands() -> dict[str, list[argparse.Action]]:
    """Each CLI command's own arguments, as the parser declares them (old spellings, kept
    hidden for one release, left out)."""
    found: dict[str, list[argparse.Action]] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip())
            elif (
                prefix
                and action.help != argparse.SUPPRESS
                and not set(action.option_strings) & (GLOBAL | OUTPUT)
            ):
                found.setdefault(prefix, []).append(action)

    walk(build_parser(), "")
    return found


def snake(action: argparse.Action) -> str:
    """An argument's name as Python spells it (``--retention-hours``: retention_hours), its
    flag's own spelling checked by :func:`test_every_flag_is_its_name_in_kebab_case`."""
    return action.dest


def test_every_flag_is_its_name_in_kebab_case():
    for command, actions in COMMANDS.items():
        for action in actions:
            if action.option_strings:
                kebab = "--" + action.dest.replace("_", "-")
                assert kebab in action.option_strings, (command, action.option_strings)


COMMANDS = commands()
# The commands that are one QueueTable call, whose arguments are the call's.
CALL_COMMANDS = sorted(c for c in COMMANDS if hasattr(QueueTable, c.replace(" ", "_")))


@pytest.mark.parametrize("command", CALL_COMMANDS)
def test_a_commands_arguments_are_its_calls_by_the_same_names_in_the_same_order(command: str):
    call = inspect.signature(getattr(QueueTable, command))
    names = [p for p in call.parameters if p != "self"]
    takes_queue_arguments = any(p.kind is p.VAR_KEYWORD for p in call.parameters.values())
    queue_arguments = {a.name for a in arguments_of("queue")} | {"on_reject"}
    given = [snake(action) for action in COMMANDS[command]]
    for name in given:
        assert name in names or (takes_queue_arguments and name in queue_arguments), (
            f"spark-queue {command}: {name} is not an argument of QueueTable.{command}"
        )
    positionals = [snake(a) for a in COMMANDS[command] if not a.option_strings]
    assert positionals == [n for n in names if n in positionals], (command, positionals)
    if "queue" in positionals:
        assert positionals[0] == "queue", command


def test_every_cli_flag_of_an_argument_is_the_specifications():
    for command, actions in COMMANDS.items():
        for action in actions:
            name = snake(action)
            assert name not in OLD_NAMES, f"spark-queue {command}: {action.option_strings}"
            assert not TIME_UNITS.search(name) or name in UNIT_NAMED, (command, name)
            if name in ARGUMENTS and action.option_strings:
                assert ARGUMENTS[name].flag in action.option_strings, (command, name)


# -- the jobs ----------------------------------------------------------------------------


@pytest.mark.parametrize("job", ["consume", "produce", "maintain"])
def test_the_jobs_flags_are_the_specifications_or_its_spark_options(job: str):
    sys.path.insert(0, str(ROOT / "jobs"))
    try:
        parser = importlib.import_module(job).build_parser()
    finally:
        sys.path.remove(str(ROOT / "jobs"))
    spark_flags = {
        "--" + re.sub(r"(?<!^)(?=[A-Z])", "-", a.option).lower(): a
        for a in SPECIFICATION
        if a.spark_option
    }
    for action in parser._actions:
        for flag in action.option_strings:
            name = flag.removeprefix("--").replace("-", "_")
            assert name not in OLD_NAMES and (not TIME_UNITS.search(name) or name in UNIT_NAMED)
            if name in ARGUMENTS:
                assert flag == ARGUMENTS[name].flag, (job, flag)
            if flag in spark_flags:  # --max-messages-per-trigger: its Spark option's
                assert spark_flags[flag].option == camel(name), (job, flag)


# -- Spark options -------------------------------------------------------------------------


def test_a_spark_option_is_its_arguments_name_in_camel_case():
    for argument in SPECIFICATION:
        if argument.spark_option is None:
            assert argument.option == camel(argument.name)
        else:  # Spark's and Delta's per-micro-batch limits: maxBytesPerTrigger
            assert argument.option == camel(argument.name) + "PerTrigger", argument.name
    assert set(SOURCE_OPTIONS) == {a.option for a in arguments_of("source")}
    assert set(BROWSE_OPTIONS) == {a.option for a in arguments_of("browse")}
