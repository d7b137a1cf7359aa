"""The arguments page, ``docs/ARGUMENTS.md``, generated from the argument specification
(:mod:`spark_queue.model.arguments`), the command line's parser and what only the page says
of each argument (below: its defaults as shown, what it means in a scope, its policy cap).

``make arguments`` (``python -m tools.argument_docs --write``) writes it, without ``--write``
it is printed, and a test fails when the page and the specification drift apart. Other pages
link to it and keep no copy of its tables. A repository tool: the package neither imports
nor ships it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spark_queue.cli import build_parser
from spark_queue.model import arguments as spec
from spark_queue.model.arguments import SPECIFICATION, Argument

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


# -- what only the page says of an argument -----------------------------------------------

# The default as the page shows it, where not the specification's value itself.
SHOWN_DEFAULTS = {
    "path": "required",
    "max_redelivery_delay": "10 x `redeliveryDelay`",
    "policies": "`$SPARK_QUEUE_POLICIES`, else none",
    "delay": "the queue's redelivery backoff",
    "period": "required",
    "wait_time": "until a message comes",
}


def _consumer_limit(source_doc: str) -> dict[str, tuple[str, str]]:
    """The notes of a queue limit a consumer may only lower, whose meaning to the source is
    ``source_doc``."""
    limit_only = "none (the queue's limit only)"
    return {
        "source": (limit_only, f"{source_doc}; with a queue limit too, the lower applies"),
        "lease": (limit_only, "as for the source"),
        "consumer": (limit_only, "as for `QueueTable.lease`"),
    }


# Where an argument means something more, or shows another default: ``{scope: (default as
# shown, doc line)}``, either empty for the argument's own.
IN_SCOPE: dict[str, dict[str, tuple[str, str]]] = {
    "queue": {
        "source": ("required", "the queue to consume"),
        "browse": ("all queues", "read one queue; an unknown name is an error listing them"),
        "call": (
            "required",
            "the queue a call acts on, its first argument (`release`: None, every queue)",
        ),
    },
    "consumer": {
        "call": (
            "any consumer (`ack`, `cancel`, `expire`); required by `consumer`, `extend` "
            "and `release`",
            "the consumer whose leases a call acts on, after the queue",
        )
    },
    "max_deliveries": _consumer_limit(
        "a message delivered this many times without an ack is killed (dead-lettered "
        "`delivery_limit`) instead of returned"
    ),
    "max_cancels": _consumer_limit(
        "a message cancelled this many times is killed (dead-lettered `cancel_limit`)"
    ),
    "lease_period": {
        "source": ("unset (leases never expire)", ""),
        "consumer": (
            "30 s",
            "each lease's period; leases of messages prefetched or in hand are extended at "
            "half of it",
        ),
    },
    "max_messages": {
        "source": ("unlimited", ""),
        "lease": ("100", "messages per lease; 0 leases none and only settles"),
    },
    "max_bytes": {"source": ("unlimited", "")},
    "max_backlog": {"source": ("unlimited", "")},
    "filter": {"consumer": ("unset", "as for `QueueTable.lease`")},
    "ack_interval": {"consumer": ("1 s, or a quarter of `lease_period` where shorter", "")},
    "idle_check_interval": {"consumer": ("25 ms local, 100 ms object store", "")},
}

# What each policy cap (``Argument.policy_cap``) does.
CAP_MEANINGS = {
    "max_length": "cap on the ready-message count (`none`: no cap)",
    "max_length_bytes": "cap on the ready bodies' bytes (`none`: no cap); not on ring queues",
    "max_deliveries": "cap on the queue's delivery limit (`none`: no cap): a queue without "
    "one gets the cap",
    "max_cancels": "cap on the queue's cancel limit (`none`: no cap): a queue without one "
    "gets the cap",
    "duplicate_window": "the longest `duplicateWindow` a queue may have (`none`: no cap), "
    "which bounds what de-duplication stores; a queue without a window keeps none",
}


def check_notes(specification: Sequence[Argument]) -> None:
    """Fail where what the page says of an argument no longer fits the specification: a
    note for an argument or scope it does not have, a policy cap without its meaning, a
    default shown in a scope other than the one the specification gives there
    (``Argument.defaults``)."""
    scopes = {argument.name: argument.scopes for argument in specification}
    problems = [
        f"{name}: not an argument of the specification"
        for name in sorted({*SHOWN_DEFAULTS, *IN_SCOPE, *CAP_MEANINGS} - scopes.keys())
    ]
    problems += [
        f"{name}: IN_SCOPE names scope {scope!r}, which it does not have"
        for name, notes in IN_SCOPE.items()
        for scope in notes
        if name in scopes and scope not in scopes[name]
    ]
    capped = {argument.name for argument in specification if argument.policy_cap}
    problems += [
        f"{name}: a policy cap without CAP_MEANINGS"
        for name in sorted(capped - CAP_MEANINGS.keys())
    ]
    problems += [
        f"{name}: CAP_MEANINGS for an argument without a policy cap"
        for name in sorted(CAP_MEANINGS.keys() - capped)
        if name in scopes
    ]
    problems += [
        f"{argument.name}: the page shows the default {shown!r} in {scope}, the "
        f"specification's is {expected!r}"
        for argument in specification
        for scope, expected, shown in _scope_defaults(argument)
        if shown != expected and not shown.startswith(expected + " ")
    ]
    if problems:
        raise ValueError("tools/argument_docs.py: " + "; ".join(problems))


def _scope_defaults(argument: Argument) -> list[tuple[str, str, str]]:
    """``(scope, default as the specification gives it there, default the page shows)`` of
    each scope where the argument has a default of its own; the page may say more after it
    (``0 (the queue's limit only)``)."""
    rows = []
    for scope, value in argument.defaults.items():
        if isinstance(value, str) and argument.unit == "ms":
            value = argument.kind.parse(argument.name, value)  # "30 seconds": 30000 ms
        rows.append((scope, _shown_value(argument, value), described(argument, scope)[0]))
    return rows


def valid_values(kind: spec.Kind[Any]) -> str:
    """The valid values of ``kind`` as the page's tables show them (Markdown, short)."""
    if isinstance(kind, spec.Count):
        return kind.valid.removeprefix("a ")
    if isinstance(kind, spec.Limit):
        return f"whole number {'> 0' if kind.zero_is_none else '>= 0'}, or `none`"
    if isinstance(kind, spec.Duration):
        low = " > 0" if kind.minimum_ms else ""
        zero = "; 0: none" if kind.zero_is_none and not kind.zero_is_old_none else ""
        none = "; or `none`" if kind.optional or kind.zero_is_none else ""
        return f"a duration{low}: `30s`, `5 minutes`, `1 week`, or milliseconds{zero}{none}"
    if isinstance(kind, spec.Fraction):
        return "fraction in (0, 1]"
    if isinstance(kind, spec.Choice):
        return ", ".join(f"`{value}`" for value in kind.values)
    if isinstance(kind, spec.Bool):
        return "`true`, `false`"
    if isinstance(kind, spec.Name):
        if kind.pattern is spec.QUEUE_NAME:
            return "a queue name, `[A-Za-z0-9_.-]{1,255}`, not dots alone"
        return kind.rule.removeprefix("a name of ")
    if isinstance(kind, spec.Text):
        return "text"
    return kind.valid


def shown_default(argument: Argument) -> str:
    """The argument's default as the page shows it."""
    if argument.name in SHOWN_DEFAULTS:
        return SHOWN_DEFAULTS[argument.name]
    value = argument.default
    if value is None and isinstance(argument.kind, spec.Limit):
        return "none"
    if value is None:
        return "unset"
    return _shown_value(argument, value)


def _shown_value(argument: Argument, value: Any) -> str:
    """A value of the argument as the page shows it: a duration in its largest whole unit
    of ``s`` and ``ms``."""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`"
    if argument.unit == "ms":
        for unit, size in (("s", 1000), ("ms", 1)):
            if value % size == 0:
                return f"{value // size} {unit}"
    return str(value)


def described(argument: Argument, scope: str) -> tuple[str, str]:
    """``(default as shown, doc line)`` of ``argument`` in ``scope``."""
    default, doc = IN_SCOPE.get(argument.name, {}).get(scope, ("", ""))
    return default or shown_default(argument), doc or argument.doc


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

<!-- Generated from spark_queue/model/arguments.py and tools/argument_docs.py by
     `make arguments`: edit those, not this page. -->

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
  fraction of a millisecond is refused. A duration is at most {spec.MAX_DURATION_DAYS:,} days, so
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
        described(argument, argument.scopes[0])[0],
        argument.unit or NONE,
        valid_values(argument.kind),
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
    default = described(argument, argument.scopes[0])[0]
    unit = f" Unit: {argument.unit}." if argument.unit else ""
    lines.append(f"- Default: {default}.{unit} Valid: {valid_values(argument.kind)}.")
    notes = IN_SCOPE.get(argument.name, {})
    for scope in argument.scopes:
        if scope in notes:
            scope_default, scope_doc = described(argument, scope)
            more = f": {scope_doc}" if notes[scope][1] else ""
            lines.append(f"- In {scope}: default {scope_default}{more}.")
    for key, meaning in _policy_meanings(argument):
        lines.append(f"- Policy key `{key}`: {meaning}.")
    return "\n".join(lines) + "\n"


def _policy_meanings(argument: Argument) -> list[tuple[str, str]]:
    meanings = []
    for key in argument.policy_keys:
        if not key.startswith("default-"):
            meaning = CAP_MEANINGS[argument.name]
        elif argument.name == "ring_size":
            meaning = (
                'shorthand for `default-max-length = N` and `default-overflow = "ring"`; '
                "giving it with either of those is an error"
            )
        else:
            meaning = f"the default of `{argument.option}`"
        meanings.append((key, meaning))
    return meanings


def arguments_page(specification: Sequence[Argument] = SPECIFICATION) -> str:
    """``docs/ARGUMENTS.md``: every argument of ``specification``, one row each, then what
    each means."""
    check_notes(specification)
    flags = cli_flags()
    parts = [_PAGE_HEAD]
    parts += [f"| {scope} | {where} |\n" for scope, where in SCOPE_SURFACES.items()]
    parts.append(
        "\n## All arguments\n\n"
        "| argument | Spark option | Python keyword | CLI flag or argument | policy keys "
        "| default | unit | valid values | scopes |\n|" + "---|" * 9 + "\n"
    )
    parts += [_summary_row(argument, flags) for argument in specification]
    parts.append("\n## Each argument\n")
    parts += ["\n" + _section(argument, flags) for argument in specification]
    parts.append("\n" + _OTHER_KEYS)
    return "".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.argument_docs",
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
