"""The names the docs give exist, and the names that exist are documented: the public names
(``spark_queue.__all__``) against the API reference (``docs/reference``), the Spark options
and Python keywords against the argument specification (``docs/ARGUMENTS.md``), the command
line's commands against its parser (``docs/CLI.md``), the tests the docs name against the
test modules. No Spark."""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

import spark_queue
from spark_queue import Consumer, Message, Publisher, QueueTable
from spark_queue.cli import build_parser
from spark_queue.model.arguments import SPECIFICATION, arguments_of

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_ENTRY = re.compile(r"^::: (spark_queue\.\S+)\s*$", re.MULTILINE)
SHELL = ("", "bash", "sh", "shell", "console")
# Options a write or read takes beside the arguments: Spark's own, and the object store's.
SPARK_OWN_OPTIONS = {"checkpointlocation"}
# Python keywords of methods that take the arguments of a scope as ``**keywords``.
KEYWORD_SCOPES = {
    "declare": ("queue",),
    "alter": ("queue",),
    "publish": ("queue", "publish"),
    "consumer": ("consumer",),
    "publisher": ("publisher",),
}


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def code_blocks(languages: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(page, code)`` of every fenced block in one of ``languages``."""
    return [
        (relative(page), match.group(2))
        for page in PAGES
        for match in _FENCE.finditer(page.read_text(encoding="utf-8"))
        if match.group(1).lower() in languages
    ]


def prose(page: Path) -> str:
    """A page without its fenced blocks."""
    return _FENCE.sub("", page.read_text(encoding="utf-8"))


def python_trees() -> list[tuple[str, ast.Module]]:
    """The docs' Python blocks that are Python (a block with ``...`` for elided text, or
    a console session, is not)."""
    trees = []
    for page, code in code_blocks(("python", "py")):
        try:
            trees.append((page, ast.parse(code)))
        except SyntaxError:
            continue
    return trees


# -- public names ---------------------------------------------------------------------------


def reference_entries() -> dict[str, str]:
    """Each ``::: spark_queue.NAME`` entry of the API reference, and its page."""
    entries = {}
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        for path in _ENTRY.findall(page.read_text(encoding="utf-8")):
            assert path not in entries, f"{path} has two entries: {entries[path]}, {page.name}"
            entries[path] = page.name
    return entries


def test_every_public_name_has_a_reference_entry_and_every_entry_is_public():
    documented = {path.removeprefix("spark_queue.") for path in reference_entries()}
    public = set(spark_queue.__all__)
    assert not public - documented, (
        f"public names without an entry in docs/reference/*.md: {sorted(public - documented)}"
    )
    assert not documented - public, (
        f"reference entries of names not in spark_queue.__all__: {sorted(documented - public)}"
    )
    for name in public:
        assert getattr(spark_queue, name) is not None


def test_what_the_docs_import_from_the_package_exists():
    imported = []
    for page, tree in python_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("spark_queue"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), (
                        f"{page}: from {node.module} import {alias.name}: no such name"
                    )
                    imported.append(alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("spark_queue"):
                        importlib.import_module(alias.name)
    assert "QueueTable" in imported  # the docs' Python blocks were found and read


# -- Spark options and Python keywords -----------------------------------------------------


def spark_options() -> set[str]:
    """The arguments' Spark options, lower-cased as Spark passes them."""
    return {a.option.lower() for a in SPECIFICATION if {"sink", "source", "browse"} & set(a.scopes)}


def test_every_argument_is_on_the_arguments_page():
    page = (ROOT / "docs" / "ARGUMENTS.md").read_text(encoding="utf-8")
    for argument in SPECIFICATION:
        row = next(
            (line for line in page.splitlines() if line.startswith(f"| [`{argument.name}`]")),
            None,
        )
        assert row is not None, f"docs/ARGUMENTS.md has no row of {argument.name}"
        if argument.option.lower() in spark_options():
            assert f"`{argument.option}`" in row


def test_the_spark_options_the_docs_give_exist():
    known = spark_options() | SPARK_OWN_OPTIONS
    given = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for option in re.findall(r"\.option\(\s*[\"']([^\"']+)[\"']", text):
            given.append(option)
            assert option.lower() in known or option.lower().startswith("storage."), (
                f"{relative(page)}: .option({option!r}): not an option of format('ringqueue')"
            )
    for page, tree in python_trees():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "options"
            ):
                for keyword in node.keywords:
                    if keyword.arg is not None:
                        given.append(keyword.arg)
                        assert keyword.arg.lower() in known, (
                            f"{page}: .options({keyword.arg}=...): not an option"
                        )
    assert "queue" in given  # the docs' options were found


def spark_api_names() -> set[str]:
    """The names of PySpark's own API a page may show beside the options: the methods of
    the readers, writers, queries and sessions, and the triggers' keywords."""
    from pyspark.sql import DataFrame, DataFrameReader, DataFrameWriter, SparkSession
    from pyspark.sql.streaming import DataStreamReader, DataStreamWriter, StreamingQuery

    classes = (DataFrame, DataFrameReader, DataFrameWriter, SparkSession)
    classes += (DataStreamReader, DataStreamWriter, StreamingQuery)
    names = {name for cls in classes for name in dir(cls) if not name.startswith("_")}
    return names | set(inspect.signature(DataStreamWriter.trigger).parameters)


def test_the_options_the_spark_page_names_exist():
    """Every camelCase name in code on the Spark page is an option of format("ringqueue"),
    Spark's ``checkpointLocation``, or a name of PySpark's own API (``foreachBatch``)."""
    known = {a.option for a in SPECIFICATION} | {"checkpointLocation"} | spark_api_names()
    text = prose(ROOT / "docs" / "SPARK.md")
    named = [span for span in _INLINE.findall(text) if re.fullmatch(r"[a-z]+[A-Z]\w*", span)]
    unknown = sorted(set(named) - known)
    assert not unknown, f"docs/SPARK.md names options that do not exist: {unknown}"
    assert "maxMessagesPerTrigger" in named  # the page's options were found


def accepted_keywords(method: str) -> set[str] | None:
    """The keywords ``method`` of the package's classes takes (None: not one of theirs)."""
    accepted: set[str] = set()
    found = False
    for cls in (QueueTable, Consumer, Publisher, Message):
        function = getattr(cls, method, None)
        if not callable(function) or method.startswith("_"):
            continue
        found = True
        parameters = inspect.signature(function).parameters.values()
        accepted |= {p.name for p in parameters if p.kind is not p.VAR_KEYWORD}
        if any(p.kind is p.VAR_KEYWORD for p in parameters) and cls is QueueTable:
            for scope in KEYWORD_SCOPES.get(method, ()):
                accepted |= {a.name for a in arguments_of(scope)}
    return accepted if found else None


def test_the_keywords_the_docs_pass_exist():
    checked = 0
    for page, tree in python_trees():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            accepted = accepted_keywords(node.func.attr)
            if accepted is None:
                continue
            for keyword in node.keywords:
                if keyword.arg is not None:
                    assert keyword.arg in accepted, (
                        f"{page}: .{node.func.attr}({keyword.arg}=...): no such keyword"
                    )
                    checked += 1
    assert checked  # the docs' calls were found


# -- the command line ----------------------------------------------------------------------


def parser_commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, object]:
    """Every command of the parser (``policies check`` as two words), and its parser."""
    commands: dict[str, object] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = parser_commands(sub, f"{prefix}{name} ")
                commands.update(nested or {f"{prefix}{name}": sub})
    return commands


COMMANDS = set(parser_commands(build_parser()))
GROUPS = {command.split()[0] for command in COMMANDS if " " in command}


def command_of(words: list[str]) -> str:
    """The command a command line's words (after ``spark-queue``) run, global options and
    their values skipped; "" for none or a placeholder."""
    takes_value = {"--path", "--policies", "--broker", "--storage-option"}
    rest = iter(words)
    for word in rest:
        if word.startswith("-"):
            if word in takes_value:
                next(rest, None)
            continue
        word = word.rstrip(":,.")
        if not word.islower() or word[0] in "[<{$":
            return ""  # a placeholder (COMMAND, <cmd>), not a command
        return f"{word} {next(rest, '')}".strip() if word in GROUPS else word
    return ""


def documented_commands() -> set[str]:
    """The commands docs/CLI.md has a heading of: the first word (two for a group) of each
    code span in a heading of its "Commands" section."""
    text = prose(ROOT / "docs" / "CLI.md")
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    headings = [line for line in section.splitlines() if line.startswith("### ")]
    return {command_of(span.split()) for line in headings for span in _INLINE.findall(line)}


def test_every_command_is_documented_in_cli_and_every_documented_one_exists():
    documented = documented_commands()
    assert not COMMANDS - documented, (
        f"commands with no heading in docs/CLI.md: {sorted(COMMANDS - documented)}"
    )
    assert not documented - COMMANDS, (
        f"docs/CLI.md documents commands that do not exist: {sorted(documented - COMMANDS)}"
    )


def test_the_commands_the_docs_run_exist():
    """In shell blocks, each command line that runs ``spark-queue``; in the prose, each code
    span that starts with it (``spark-queue: ...`` is a message, not a command)."""
    lines = [
        (page, line.strip().removeprefix("$ "))
        for page, code in code_blocks(SHELL)
        for line in code.splitlines()
    ]
    lines += [(relative(page), span) for page in PAGES for span in _INLINE.findall(prose(page))]
    run = []
    for page, line in lines:
        for found in re.finditer(r"(?:^|[;|&(] *)spark-queue((?: +[^\s;|&)#]+)*)", line):
            command = command_of(found.group(1).split())
            if command:
                run.append(command)
                assert command in COMMANDS, f"{page}: spark-queue {command}: no such command"
    assert "declare" in run  # the docs' command lines were found


# -- the site ------------------------------------------------------------------------------


def nav_pages(entries: list) -> list[str]:
    """The pages of mkdocs.yml's navigation (the "Decisions" section is filled by its hook)."""
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_site_navigation_lists_every_page_and_only_pages_that_exist():
    yaml = pytest.importorskip("yaml")  # the docs extra
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = nav_pages(config["nav"])
    docs = ROOT / config["docs_dir"]
    missing = [page for page in listed if page != "index.md" and not (docs / page).is_file()]
    assert not missing, f"mkdocs.yml's nav lists pages that do not exist: {missing}"
    pages = {str(p.relative_to(docs)) for p in docs.rglob("*.md")}
    left_out = {p for p in pages - set(listed) if not p.startswith("decisions/")}
    assert not left_out, f"pages missing from mkdocs.yml's nav: {sorted(left_out)}"


# -- tests the docs name -------------------------------------------------------------------

_NAMED_TEST = re.compile(r"`(?:tests/)?(test_\w+\.py)::(test_\w+)")


def test_every_test_the_docs_name_exists():
    """A promise in the docs that names the test checking it (docs/BROKER.md "Security")
    names one that exists."""
    named = {
        (relative(page), m.groups()) for page in PAGES for m in _NAMED_TEST.finditer(prose(page))
    }
    missing = [
        f"{page}: {module}::{name}"
        for page, (module, name) in sorted(named)
        if not re.search(
            rf"^def {name}\(", (ROOT / "tests" / module).read_text(encoding="utf-8"), re.MULTILINE
        )
    ]
    assert any(module == "test_broker_auth.py" for _, (module, _) in named)
    assert not missing, f"the docs name tests that do not exist: {missing}"
