"""The arguments page, ``docs/ARGUMENTS.md``, generated from the specification
(:mod:`spark_queue.model.arguments`) and the command line's parser.

``python -m spark_queue.argument_docs --write`` writes it, without ``--write`` it is printed,
and a test fails when the page and the specification drift apart. Other pages link to it
and keep no copy of its tables.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spark_queue.cli import build_parser
from spark_queue.model.arguments import MAX_DURATION_DAYS, SPECIFICATION, Argument

ARGUMENTS_PAGE = "docs/ARGUMENTS.md"

# Policy keys that select the queues a policy applies to, beside the argument keys.
SELECTOR_ROWS = [
    ("`match`", "Artemis wildcard expression", "the queue names it applies to"),
    (
        "`pattern`",
        "regular expression (Python `re`)",
        "applies where it is found in the name (`re.search`, unanchored as in RabbitMQ: write "
        "`^...$` for a whole name)",
    ),
    ("`priority`", "integer, default 0", "where policies overlap, the highest applies"),
]


# -- the arguments page -------------------------------------------------------------------

# Each scope (:data:`spark_queue.model.arguments.SCOPES`) as a user meets it.
_REFERENCE = "reference/queue-table.md#spark_queue.QueueTable"
SCOPE_SURFACES = {
    "queue": (
        "a queue argument, stored with the queue: a keyword of "
        f"[`QueueTable.declare`]({_REFERENCE}.declare), "
        f"[`alter`]({_REFERENCE}.alter) and [`publish`]({_REFERENCE}.publish), a flag of the "
        "CLI's `declare`, `alter` and `publish`, and a policy's default"
    ),
    "sink": 'an option of a write: `df.writeStream.format("ringqueue")`, '
    '`df.write.format("ringqueue")`',
    "source": 'an option of a streaming read: `spark.readStream.format("ringqueue")`',
    "browse": 'an option of a batch read: `spark.read.format("ringqueue")`',
    "lease": f"a keyword of [`QueueTable.lease`]({_REFERENCE}.lease)",
    "consumer": f"a keyword of [`QueueTable.consumer`]({_REFERENCE}.consumer)",
    "publisher": f"a keyword of [`QueueTable.publisher`]({_REFERENCE}.publisher)",
    "publish": f"a keyword of [`QueueTable.publish`]({_REFERENCE}.publish)",
    "call": "an argument of every call that acts on a queue or a consumer's leases, by the "
    "same name in the same place: `QueueTable`'s methods, the clients' and the CLI's "
    "commands (whose first argument is `QUEUE`)",
}
SPARK_SCOPES = ("sink", "source", "browse")
KEYWORD_SCOPES = ("queue", "lease", "consumer", "publisher", "publish", "call")
NONE = ""  # a surface that does not take the argument: an empty cell

_PAGE_HEAD = f"""# Arguments

<!-- Generated from spark_queue/model/arguments.py by
     `python -m spark_queue.argument_docs --write`: edit the specification, not this page. -->

Every argument spark-queue takes, once. Each surface (Spark options, the Python keywords of
`QueueTable` and its clients, the command line's flags, the policies file) reads the one
specification in `spark_queue/model/arguments.py`, from which this page is generated, so a
value means the same everywhere. Each surface spells an argument its own way:

- a **Spark option** of `format("ringqueue")` is camelCase and case-insensitive (Spark
  lower-cases it): `maxLength`;
- a **Python keyword** is snake_case: `max_length`;
- a **CLI flag** is kebab-case: `--max-length`;
- a **policy key** is `default-max-length` (the default a policy gives a queue) or
  `max-length` (the cap it puts on one).

An unknown argument, or a value outside its valid values, is refused with one line naming the
argument as that surface spells it and the values it takes
([`InvalidOptionError`](reference/errors.md#spark_queue.InvalidOptionError)); nothing is
written.

## Values

Values are checked as what they are, and refused, never rounded or clamped:

- **Whole numbers** (limits, counts, seqs) are an `int` or decimal digits (`"1000"`), within
  an int64: not a bool, not a fraction (`5.0`, `"5.0"`), not `"1_000"` or `"1e3"`.
- **Durations** have one grammar: a whole number of milliseconds (`250`), or a number with a
  unit, `ms`, `s`/`seconds`, `m`/`minutes`, `h`/`hours`, `d`/`days`, `w`/`weeks` (`"30s"`,
  `"1.5 s"`, `"5 minutes"`, `"1 week"`); a Python keyword also takes a `timedelta`. A
  fraction of a millisecond is refused. A duration is at most {MAX_DURATION_DAYS:,} days, so
  now plus any duration is a valid timestamp. No argument's name carries a unit: every
  duration (`lease_period`, `linger`, `ack_interval`, ...) takes this one grammar.
- **Fractions** and **multipliers** are finite numbers; **choices** any case; **bools**
  `true`/`false`, never 0 or 1.
- A queue's arguments are also checked together once merged (with a queue's own on `alter`,
  with a policy's on every declare): a ring takes no byte limit.

## Where an argument applies

| scope | where |
|---|---|
"""

_OTHER_KEYS = """## Other keys

Options of a write or read that are not arguments:

| option | scopes | default | meaning |
|---|---|---|---|
| `storage.<KEY>` | sink, source, browse | the environment | a delta-rs storage option, how to \
reach an object store: `storage.AWS_ENDPOINT_URL`, `storage.AZURE_STORAGE_ACCOUNT_KEY`, ... \
([Storage](STORAGE.md)); keys are case-insensitive, values never appear in errors |
| `checkpointLocation` | sink, source | Spark's | Spark's own, passed through |

A policy's keys that select the queues it applies to, beside the policy keys above
([Policies](POLICIES.md)):

| key | value | meaning |
|---|---|---|
""" + "".join(f"| {key} | {value} | {meaning} |\n" for key, value, meaning in SELECTOR_ROWS)


def cli_flags() -> dict[str, list[str]]:
    """Each flag of the command line's subcommands, and the subcommands that take it."""
    flags: dict[str, list[str]] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip())
            elif prefix and action.help != argparse.SUPPRESS:  # not an old spelling
                # A positional argument as the usage line shows it: QUEUE.
                for flag in action.option_strings or [action.dest.upper()]:
                    flags.setdefault(flag, []).append(prefix)

    walk(build_parser(), "")
    return flags


def _flag_commands(argument: Argument, flags: dict[str, list[str]]) -> list[str]:
    """The commands whose flag is this argument: the queue arguments' flags and
    ``--on-reject`` (read by the specification), and the global options every command
    takes (``--path``, ``--policies``); a command's own flag of the same spelling
    (``release --queue``) is not the argument."""
    commands = flags.get(_cli_spelling(argument, flags), [])
    every = set(flags["--path"])
    if set(commands) == every or {"queue", "publish", "call"} & set(argument.scopes):
        return commands
    return []


def _cli_spelling(argument: Argument, flags: dict[str, list[str]]) -> str:
    """The argument on the command line: its flag, or the positional argument (``QUEUE``)
    a call's first argument is."""
    positional = argument.name.upper()
    return positional if "call" in argument.scopes and positional in flags else argument.flag


def _keyword(argument: Argument) -> str:
    scopes = [s for s in KEYWORD_SCOPES if s in argument.scopes]
    return f"`{argument.name}`" if scopes else NONE


def _option(argument: Argument) -> str:
    return f"`{argument.option}`" if set(SPARK_SCOPES) & set(argument.scopes) else NONE


def _summary_row(argument: Argument, flags: dict[str, list[str]]) -> str:
    cells = (
        f"[`{argument.name}`](#{argument.name})",
        _option(argument),
        _keyword(argument),
        f"`{_cli_spelling(argument, flags)}`" if _flag_commands(argument, flags) else NONE,
        ", ".join(f"`{key}`" for key in argument.policy_keys) or NONE,
        argument.described(argument.scopes[0])[0],
        argument.unit or NONE,
        argument.kind.doc_valid,
        ", ".join(argument.scopes),
    )
    return "| " + " | ".join(cells) + " |\n"


def _section(argument: Argument, flags: dict[str, list[str]]) -> str:
    lines = [f"### `{argument.name}`", "", argument.doc[0].upper() + argument.doc[1:] + ".", ""]
    spelled = []
    if _option(argument) != NONE:
        scopes = ", ".join(s for s in SPARK_SCOPES if s in argument.scopes)
        spelled.append(f"Spark option {_option(argument)} ({scopes})")
    keyword_scopes = [s for s in KEYWORD_SCOPES if s in argument.scopes]
    if keyword_scopes:
        spelled.append(f"Python keyword `{argument.name}` ({', '.join(keyword_scopes)})")
    commands = _flag_commands(argument, flags)
    cli = _cli_spelling(argument, flags)
    what = "CLI flag" if cli.startswith("--") else "CLI argument"
    if set(commands) == set(flags["--path"]):
        spelled.append(f"{what} `{cli}` (every command)")
    elif commands:
        spelled.append(f"{what} `{cli}` ({', '.join(f'`{c}`' for c in commands)})")
    lines.append("- " + "; ".join(spelled) + ".")
    default = argument.described(argument.scopes[0])[0]
    unit = f" Unit: {argument.unit}." if argument.unit else ""
    lines.append(f"- Default: {default}.{unit} Valid: {argument.kind.doc_valid}.")
    for scope in argument.scopes:
        if scope in argument.per_scope:
            scope_default, scope_doc = argument.described(scope)
            more = f": {scope_doc}" if argument.per_scope[scope][1] else ""
            lines.append(f"- In {scope}: default {scope_default}{more}.")
    for key, meaning in _policy_meanings(argument):
        lines.append(f"- Policy key `{key}`: {meaning}.")
    return "\n".join(lines) + "\n"


def _policy_meanings(argument: Argument) -> list[tuple[str, str]]:
    meanings = []
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
        meanings.append((key, meaning))
    return meanings


def arguments_page() -> str:
    """``docs/ARGUMENTS.md``: every argument of the specification, one row each, then what
    each means."""
    flags = cli_flags()
    parts = [_PAGE_HEAD]
    parts += [f"| {scope} | {where} |\n" for scope, where in SCOPE_SURFACES.items()]
    parts.append(
        "\n## All arguments\n\n"
        "| argument | Spark option | Python keyword | CLI flag or argument | policy keys "
        "| default | unit | valid values | scopes |\n|" + "---|" * 9 + "\n"
    )
    parts += [_summary_row(argument, flags) for argument in SPECIFICATION]
    parts.append("\n## Each argument\n")
    parts += ["\n" + _section(argument, flags) for argument in SPECIFICATION]
    parts.append("\n" + _OTHER_KEYS)
    return "".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m spark_queue.argument_docs",
        description=f"Print {ARGUMENTS_PAGE} as the argument specification makes it, or write it.",
    )
    parser.add_argument("--write", action="store_true", help=f"write {ARGUMENTS_PAGE}")
    args = parser.parse_args(argv)
    if args.write:
        root = Path(__file__).resolve().parents[1]
        (root / ARGUMENTS_PAGE).write_text(arguments_page(), encoding="utf-8")
    else:
        print(arguments_page(), end="")


if __name__ == "__main__":
    main()
