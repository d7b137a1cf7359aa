"""The docs' tables of arguments, generated from the specification
(:mod:`spark_queue.model.arguments`).

Each table sits in a doc between ``<!-- arguments:NAME -->`` and ``<!-- arguments:end -->``;
``python -m spark_queue.argument_docs --write`` regenerates them all, ``--markdown NAME``
prints one, and a test fails when a doc and the specification drift apart.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from spark_queue.model.arguments import ARGUMENTS, SPECIFICATION, arguments_of

README_OPTIONS = (
    "queue",
    "max_length",
    "max_length_bytes",
    "ring_size",
    "overflow",
    "dead_letter_queue",
    "reject_threshold",
    "on_reject",
    "expiration",
    "duplicate_window",
)
_STORAGE = (
    "`storage.<KEY>`",
    "the environment",
    "a delta-rs storage option: `storage.AWS_ENDPOINT_URL`, "
    "`storage.AZURE_STORAGE_ACCOUNT_KEY`, ... (`docs/STORAGE.md`)",
    "how to reach an object store; keys are case-insensitive, values never appear in errors",
)
# Rows of options that are not arguments: the store's, and Spark's own.
EXTRA_ROWS = {
    "sink": [_STORAGE, ("`checkpointLocation`", "", "", "Spark's own; passed through")],
    "source": [_STORAGE],
    "browse": [_STORAGE],
}
# Policy keys that select the queues a policy applies to, before the argument keys.
SELECTOR_ROWS = [
    ("`match`", "Artemis wildcard expression", "the queue names it applies to (below)"),
    (
        "`pattern`",
        "regular expression (Python `re`)",
        "applies where it is found in the name (`re.search`, unanchored as in RabbitMQ: write "
        "`^...$` for a whole name)",
    ),
    ("`priority`", "integer, default 0", "higher wins (below)"),
]
DOC_FILES = ("README.md", "docs/OPTIONS.md", "docs/POLICIES.md", "docs/CLI.md", "docs/CLIENTS.md")
_REGION = re.compile(r"(<!-- arguments:([a-z-]+) -->\n).*?(<!-- arguments:end -->)", re.DOTALL)


def _rows(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _scope_table(scope: str, spelling: str) -> str:
    rows = []
    for argument in arguments_of(scope):
        default, doc = argument.described(scope)
        name = argument.option if spelling == "option" else argument.name
        rows.append((f"`{name}`", default, argument.kind.doc_valid, doc))
    heading = "option" if spelling == "option" else "keyword"
    return _rows((heading, "default", "valid values", "meaning"), rows + EXTRA_ROWS.get(scope, []))


def _flags_table() -> str:
    rows = [
        (f"`{a.flag}`", f"`{a.option}`", a.kind.doc_valid, a.doc) for a in arguments_of("queue")
    ]
    return _rows(("flag", "option", "valid values", "meaning"), rows)


def _policy_table() -> str:
    rows = list(SELECTOR_ROWS)
    for argument in SPECIFICATION:
        for key in argument.policy_keys:
            if not key.startswith("default-"):
                meaning = argument.cap_doc
            elif argument.name == "ring_size":
                meaning = (
                    'shorthand for `default-max-length = N` and `default-overflow = "ring"`; '
                    "giving it with either of those is an error"
                )
            else:
                meaning = f"the default of `{argument.option}`"
            rows.append((f"`{key}`", argument.kind.doc_valid, meaning))
    return _rows(("key", "value", "meaning"), rows)


def _readme_table() -> str:
    rows = []
    for name in README_OPTIONS:
        argument = ARGUMENTS[name]
        default, doc = argument.described("sink")
        rows.append((f"`{argument.option}`", default, doc))
    return _rows(("option", "default", "meaning"), rows)


DOC_TABLES = {
    "sink": lambda: _scope_table("sink", "option"),
    "source": lambda: _scope_table("source", "option"),
    "browse": lambda: _scope_table("browse", "option"),
    "consumer": lambda: _scope_table("consumer", "keyword"),
    "publisher": lambda: _scope_table("publisher", "keyword"),
    "flags": _flags_table,
    "policy-keys": _policy_table,
    "readme": _readme_table,
}


def markdown(table: str) -> str:
    """One of the docs' tables (:data:`DOC_TABLES`), as Markdown."""
    return DOC_TABLES[table]()


def regenerate(text: str) -> str:
    """``text`` with every ``<!-- arguments:NAME -->`` ... ``<!-- arguments:end -->``
    region replaced by the table NAME, as the specification makes it now."""
    return _REGION.sub(lambda m: m.group(1) + markdown(m.group(2)) + m.group(3), text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m spark_queue.argument_docs",
        description="Print a table of the argument specification, or write the docs' tables.",
    )
    parser.add_argument("--markdown", choices=sorted(DOC_TABLES), help="print this table")
    parser.add_argument(
        "--write", action="store_true", help=f"regenerate the tables in {', '.join(DOC_FILES)}"
    )
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(args.markdown), end="")
    if args.write:
        root = Path(__file__).resolve().parents[1]
        for name in DOC_FILES:
            path = root / name
            path.write_text(regenerate(path.read_text(encoding="utf-8")), encoding="utf-8")


if __name__ == "__main__":
    main()
