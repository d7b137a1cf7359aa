"""``spark-queue``: inspect and administer a queue table from a shell, without Spark.

Exit codes a script can rely on: 0 done; 1 the queue table refused (unknown queue, argument
mismatch, no or not a queue table, an unreachable store, an invalid policies file, vacuum
below its floor, ...) or an unexpected error; 2 bad usage. Every error goes to stderr as one
line ``spark-queue: <message>``: no traceback, no colour, never an option's value. The
global options (``--path``, ``--policies``, ``--storage-option``, ``--broker``) go before or
after the command. Long operations (``compact``, ``vacuum``, ``purge``) report progress on
stderr, one line per step, when stderr is a terminal or with ``--progress``; ``--quiet``
silences them. The reference is ``docs/CLI.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, NoReturn

from spark_queue.broker.client import MODE_ENV_VAR, TOKEN_ENV_VAR, parse_mode
from spark_queue.broker.discovery import (
    DEFAULT_LISTEN,
    DEFAULT_MAX_REQUEST_BYTES,
    MIN_MAX_REQUEST_BYTES,
    STOP_TIMEOUT_SECONDS,
)
from spark_queue.broker.sessions import DEFAULT_PROOF_LIFETIME_SECONDS
from spark_queue.commit.maintenance import DEFAULT_VACUUM_HOURS, MAX_RETENTION_HOURS
from spark_queue.errors import (
    InvalidInputError,
    InvalidOptionError,
    QueueError,
    TableNotFoundError,
)
from spark_queue.model.arguments import (
    ARGUMENTS,
    COUNT,
    SEQ,
    Choice,
    Count,
    Duration,
    arguments_of,
    flag_type,
    parse_queue_name,
    shown,
)
from spark_queue.model.deprecations import SparkQueueDeprecationWarning, warn_deprecated
from spark_queue.model.messages import check_message
from spark_queue.model.partitions import partition_of
from spark_queue.model.policies import ENV_VAR, Policies, load_policies
from spark_queue.model.queue_arguments import ARGUMENT_NAMES, option_name, validate_arguments
from spark_queue.rules import COUNTERS
from spark_queue.server.sqs.limits import HttpLimits
from spark_queue.storage.location import (
    Location,
    check_exclusive_commits,
    one_line,
    parse_storage_flags,
    scrubbed,
)
from spark_queue.table import QueueTable

GRPC_VERBOSITY_ENV_VAR = "GRPC_VERBOSITY"
EXIT_REFUSED = 1
EXIT_USAGE = 2
STATS_FORMAT = Choice(("table", "json", "prometheus"))
# The commands that may declare a queue (a dead-letter queue too), which read the policies
# file; and every command that reads it.
DECLARING_COMMANDS = ("declare", "alter", "publish", "ack", "cancel", "extend", "release")
POLICY_COMMANDS = (*DECLARING_COMMANDS, "broker", "policies check")


class UsageError(Exception):
    """Bad usage of the command line (exit 2): the message names the flag, never its value."""


# argparse quotes the value of a flag it refuses ("invalid choice: 'x'", "ignored explicit
# argument 'x'", "ambiguous option: --p=x"): a value may be a secret (a storage option's, a
# token), so it is dropped.
_QUOTED_VALUE = re.compile(
    r"(invalid (?:[\w ]+ value|choice)|ignored explicit argument):? "
    r"(?:'(?:[^'\\]|\\.)*'|\"[^\"]*\")"
)
_AMBIGUOUS = re.compile(r"^(ambiguous option: -+[^=\s]*)=\S*")


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are raised (:func:`main` prints them on one line) and
    never quote a flag's value."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument -"):
            message = _QUOTED_VALUE.sub(r"\1", message)
        message = _AMBIGUOUS.sub(r"\1", message)
        raise UsageError(f"{message} (see {self.prog} --help)")

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {_unrecognized(extras)}")
        return parsed


def _unrecognized(extras: list[str]) -> str:
    """Unknown arguments as a usage error shows them: flags by name, a word that may be an
    unknown flag's value not at all."""
    shown, hidden, after_flag = [], 0, False
    for token in extras:
        if token.startswith("-") and token[1:2] and not token[1].isdigit():
            name, equals, _ = token.partition("=")
            shown.append(name)
            hidden += bool(equals)
            after_flag = not equals
        elif after_flag:
            hidden += 1
            after_flag = False
        else:
            shown.append(token)
    return " ".join(shown) + (" (values not shown)" if hidden else "")


_count = flag_type(COUNT)
_seq = flag_type(SEQ)  # an int64, as the table stores seqs


def _hours(text: str) -> float:
    """argparse type: a number of hours from 0 to vacuum's longest retention (else a usage
    error naming the flag)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_RETENTION_HOURS:
        raise argparse.ArgumentTypeError(
            f"must be a number of hours from 0 to {MAX_RETENTION_HOURS}"
        )
    return value


def _long_running(parser: argparse.ArgumentParser) -> None:
    """Flags of the commands that report progress and have a JSON result."""
    parser.add_argument("--json", action="store_true", help="the result as one JSON object")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="progress lines on stderr even when it is not a terminal",
    )
    shown.add_argument("--quiet", dest="progress", action="store_false", help="no progress lines")


def _progress(args: argparse.Namespace) -> Callable[[str], None]:
    """Where progress lines go: stderr if asked, or by default if stderr is a terminal."""
    shown = args.progress if args.progress is not None else sys.stderr.isatty()
    if not shown:
        return lambda _: None
    return lambda line: print(f"spark-queue: {line}", file=sys.stderr, flush=True)


def _arguments(parser: argparse.ArgumentParser) -> None:
    """The queue arguments as ``--max-length`` style flags, from the specification
    (strings: :func:`_given` parses them)."""
    for argument in arguments_of("queue"):
        parser.add_argument(argument.flag, dest=argument.name, help=argument.doc)


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The queue argument flags given, parsed; errors name the flag."""
    given = {
        a.name: getattr(args, a.name)
        for a in arguments_of("queue")
        if getattr(args, a.name, None) is not None
    }
    return validate_arguments(given, surface="flag")


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


# How _escaped() writes the characters it escapes that have a short form of their own.
_SHORT_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(text: str) -> str:
    """``text`` as a terminal may show it, on one line: printable characters as they are; a
    backslash, a control or invisible character (a newline, ESC, NUL, a bidi override) and
    an invalid UTF-8 byte (decoded with ``surrogateescape``) escaped as Python writes them:
    ``\\\\``, ``\\n``, ``\\x1b``, ``\\x00``, ``\\u202e``, ``\\xff``."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if c.isprintable() and c != "\\" else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _global_options(parser: argparse.ArgumentParser, *, after: bool, client: bool = True) -> None:
    """The options of every command, before it (``after`` unset) or after it. After it
    they are left out of the namespace unless given, so they do not undo those given
    before; storage options given after go to ``storage_options_after`` and add to them.
    ``client`` unset (the broker, which has a --storage-option of its own): the path and
    policies only."""
    group = parser.add_argument_group("global options (before or after the command)")
    default = argparse.SUPPRESS if after else None
    group.add_argument(
        "--path",
        default=default,
        help="the queue table (local path or URI); required except by 'policies check'",
    )
    group.add_argument(
        "--policies",
        metavar="FILE",
        default=default,
        help=f"the policies file, read by {', '.join(POLICY_COMMANDS)} (default: ${ENV_VAR})",
    )
    if not client:
        return
    group.add_argument(
        "--broker",
        metavar="MODE",
        default=default,
        help=f"where the command's calls run: 'auto' (the table's live broker, else here), "
        f"'off' (here), or a broker's HOST:PORT (default: ${MODE_ENV_VAR}, else auto); its "
        f"token comes from ${TOKEN_ENV_VAR}",
    )
    group.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        dest="storage_options_after" if after else "storage_options",
        default=default,
        help="a storage option of the object store (AWS_ENDPOINT_URL=..., "
        "AZURE_STORAGE_ACCOUNT_KEY=...; docs/STORAGE.md); repeat for more; keys left out "
        "come from the environment",
    )


class _PrintVersion(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        try:
            version = metadata.version("spark-queue")
        except metadata.PackageNotFoundError:
            version = "(not installed: running from a source folder)"
        print(f"{parser.prog} {version}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="spark-queue", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action=_PrintVersion, nargs=0, help="print the version")
    _global_options(parser, after=False)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("queues", help="list the queues")
    for name, text in (
        ("declare", "declare a queue (or check its arguments)"),
        ("alter", "change a queue's arguments"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("queue")
        _arguments(command)
    publish = commands.add_parser(
        "publish",
        help="enqueue messages given as JSON lines (stdin, or --file)",
        description="Enqueue one message per input line, a JSON object: body (a string, "
        "required), message_id, key, headers (an object of strings), priority (an integer), "
        "deliver_at, expires_at (ISO 8601 times; without a zone, UTC). One commit for all.",
    )
    publish.add_argument("queue")
    publish.add_argument("--file", help="read the JSON lines from this file, not stdin")
    publish.add_argument("--producer", help="with --sequence: an idempotent publish")
    publish.add_argument("--sequence", type=_count, help="grows with every publish of --producer")
    on_reject = ARGUMENTS["on_reject"]
    publish.add_argument(
        "--on-reject", type=flag_type(on_reject.kind), default=on_reject.default, help=on_reject.doc
    )
    publish.add_argument("--json", action="store_true", help="the result as one JSON object")
    _arguments(publish)
    stats = commands.add_parser("stats", help="gauges and counters of a queue (all if none)")
    stats.add_argument("queue", nargs="?")
    shown = stats.add_mutually_exclusive_group()
    shown.add_argument(
        "--format",
        type=flag_type(STATS_FORMAT),
        default="table",
        help="'table' (columns), 'json' (one JSON object per line) or 'prometheus' (the "
        "broker's queue metrics in Prometheus's text format, for a textfile collector)",
    )
    shown.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="json",
        help="one JSON object per line (--format json)",
    )
    peek = commands.add_parser("peek", help="the next messages, without side effects")
    for command in (stats, peek):
        command.add_argument(
            "--per-partition",
            action="store_true",
            help="a partitioned queue's detail: a row per partition (stats), each message's "
            "partition (peek)",
        )
    peek.add_argument("queue")
    limit = ARGUMENTS["limit"]
    peek.add_argument(
        "--limit", type=flag_type(limit.kind, limit.flag), default=limit.default, help=limit.doc
    )
    purge = commands.add_parser("purge", help="remove the ready and scheduled messages")
    purge.add_argument("queue")
    _long_running(purge)
    for name, text in (
        ("ack", "acknowledge leased messages"),
        ("cancel", "return leased messages (counts toward maxCancels)"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("queue")
        command.add_argument("seqs", nargs="+", type=_seq)
        command.add_argument("--consumer")
        if name == "cancel":
            delay = ARGUMENTS["delay"]
            command.add_argument("--delay", type=flag_type(delay.kind, delay.flag), help=delay.doc)
    extend = commands.add_parser("extend", help="extend a consumer's leases (slow work)")
    extend.add_argument("queue")
    extend.add_argument("seqs", nargs="+", type=_seq)
    extend.add_argument("--consumer", required=True)
    period = ARGUMENTS["period"]
    extend.add_argument(
        "--period", required=True, type=flag_type(period.kind, period.flag), help=period.doc
    )
    release = commands.add_parser(
        "release", help="return everything a consumer holds, in one queue or in every queue"
    )
    release.add_argument("queue", nargs="?", help="only this queue (default: every queue)")
    release.add_argument("--consumer", help="the consumer whose leases return (required)")
    # The old spelling, `release CONSUMER [--queue QUEUE]`, for one release.
    release.add_argument("--queue", dest="old_queue", help=argparse.SUPPRESS)
    _long_running(commands.add_parser("compact", help="compact small files now"))
    commands.add_parser(
        "check-storage",
        help="check that the store keeps two writers' commits apart (conditional puts)",
    )
    vacuum = commands.add_parser(
        "vacuum",
        help="list, or with --no-dry-run delete, the files no current version references "
        "(after a retention)",
    )
    vacuum.add_argument(
        "--retention-hours",
        type=_hours,
        default=DEFAULT_VACUUM_HOURS,
        help=f"keep files unreferenced for less than this ({DEFAULT_VACUUM_HOURS:g})",
    )
    vacuum.add_argument(
        "--dry-run",
        action=argparse.BooleanOptionalAction,
        help="list the files and delete nothing (the default, as delta-rs's vacuum); "
        "--no-dry-run deletes them",
    )
    vacuum.add_argument(
        "--force",
        action="store_true",
        help="allow a retention below the table's delta.deletedFileRetentionDuration "
        "(never below 1 hour)",
    )
    _long_running(vacuum)
    broker = commands.add_parser(
        "broker",
        help="serve the table's clients as a queue broker (docs/BROKER.md)",
        description="Run a queue broker for the table at PATH: QueueTable clients (publish, "
        "lease, ack, ...) find it in the table and send their calls to it over Arrow Flight; "
        "it commits them and answers once each commit has landed. Stops cleanly on SIGTERM.",
    )
    broker.add_argument("broker_path", metavar="PATH", help="the queue table (path or URI)")
    broker.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"where to listen ({DEFAULT_LISTEN}: loopback, a free port; beyond loopback "
        f"a token and TLS are required)",
    )
    broker.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="the address clients reach it at, recorded in the table (default: the "
        "listening address, this machine's name where it listens on 0.0.0.0)",
    )
    broker.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        dest="broker_storage_options",
        help="a storage option of the object store; repeat for more",
    )
    broker.add_argument(
        "--token",
        help=f"the token clients must give (default: ${TOKEN_ENV_VAR}; prefer the variable: "
        f"a flag shows in the process list)",
    )
    broker.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="its certificate chain: gRPC over TLS (with --tls-key); clients trust its root "
        "through $SPARK_QUEUE_BROKER_TLS_ROOTS or the system's",
    )
    broker.add_argument("--tls-key", metavar="PEM", help="its private key (with --tls-cert)")
    broker.add_argument(
        "--max-request-bytes",
        type=flag_type(Count(minimum=MIN_MAX_REQUEST_BYTES)),
        default=DEFAULT_MAX_REQUEST_BYTES,
        help=f"refuse larger requests ({DEFAULT_MAX_REQUEST_BYTES})",
    )
    broker.add_argument(
        "--sqs",
        metavar="HOST:PORT",
        help="also serve Amazon SQS's API there (docs/SQS.md; port 0: a free one); beyond "
        "loopback, $SPARK_QUEUE_SQS_KEYS must name a file of access keys",
    )
    broker.add_argument(
        "--sqs-max-connections",
        type=flag_type(Count(minimum=1)),
        default=HttpLimits.max_connections,
        metavar="N",
        help=f"the SQS API's open connections at most; more are refused at once "
        f"({HttpLimits.max_connections})",
    )
    broker.add_argument(
        "--sqs-timeout",
        type=flag_type(Duration(minimum_ms=1)),
        default=int(HttpLimits.timeout_seconds * 1000),
        metavar="DURATION",
        help=f"an SQS connection is closed when a request's head has not arrived this long "
        f"after it opened or was last answered, or its body this long after its head "
        f"({HttpLimits.timeout_seconds:g} s)",
    )
    broker.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (docs/BROKER.md; port 0: "
        "a free one; HTTPS with --tls-cert); beyond loopback, scrapes must carry the bearer "
        "token in $SPARK_QUEUE_METRICS_TOKEN",
    )
    broker.add_argument(
        "--stop-timeout",
        type=flag_type(Duration(minimum_ms=1)),
        default=int(STOP_TIMEOUT_SECONDS * 1000),
        metavar="DURATION",
        help=f"on SIGTERM, how long to wait for the requests in flight before cancelling "
        f"them and exiting, e.g. '30s' ({STOP_TIMEOUT_SECONDS:g} s)",
    )
    broker.add_argument(
        "--proof-lifetime",
        type=flag_type(Duration(minimum_ms=1000)),
        default=int(DEFAULT_PROOF_LIFETIME_SECONDS * 1000),
        metavar="DURATION",
        help=f"with a token: how long after a client made it a call's proof of the token is "
        f"taken (each once), e.g. '60s' ({DEFAULT_PROOF_LIFETIME_SECONDS:g} s)",
    )
    policies = commands.add_parser("policies", help="queue policies (docs/POLICIES.md)")
    policy_commands = policies.add_subparsers(dest="policies_command", required=True)
    check = policy_commands.add_parser(
        "check",
        help="the effective arguments of a queue name and where each comes from",
        description="Effective arguments of QUEUE under the policies: the queue's explicit "
        "arguments (with --path, if it exists) and the flags given, then policy defaults and "
        "caps. Writes nothing; the queue need not exist.",
    )
    check.add_argument("queue")
    _arguments(check)
    check.add_argument("--json", action="store_true", help="one JSON object")
    for name, command in commands.choices.items():
        if name == "policies":
            _global_options(check, after=True)
        else:  # the broker has its own --storage-option
            _global_options(command, after=True, client=name != "broker")
    return parser


def _check_policies(args: argparse.Namespace) -> str:
    """``policies check``: resolve without writing; the table is read only if it exists."""
    policies = load_policies(args.policies)
    assert policies is not None, "main() checks that a policies file is given"
    given = _given(args)
    if args.path is not None:
        resolution = QueueTable(
            args.path, policies=policies, storage_options=parse_storage_flags(args.storage_options)
        ).resolve(args.queue, **given)
    else:
        parse_queue_name("queue", args.queue)
        resolution = policies.resolve(args.queue, given)
    if args.json:
        return json.dumps(resolution.to_dict())
    values = asdict(resolution.arguments)
    rows = [
        {"argument": option_name(n), "value": _shown(n, values[n]), "from": resolution.origins[n]}
        for n in ARGUMENT_NAMES
    ]
    policy = "none" if resolution.policy is None else repr(resolution.policy)
    head = f"queue {resolution.queue!r}: policy {policy} (from {policies.source})"
    return head + "\n" + _table(rows, ["argument", "value", "from"])


def _release_target(args: argparse.Namespace) -> tuple[str | None, str]:
    """``release``'s queue (None: every queue) and consumer: ``release [QUEUE] --consumer
    C``, or the old ``release CONSUMER [--queue QUEUE]`` with a deprecation line."""
    if args.consumer is None:
        if args.queue is None:
            raise UsageError("release needs --consumer (see spark-queue release --help)")
        warn_deprecated(
            "'release CONSUMER [--queue QUEUE]' is deprecated: use 'release [QUEUE] "
            "--consumer CONSUMER'"
        )
        return args.old_queue, args.queue
    if args.old_queue is None:
        return args.queue, args.consumer
    if args.queue is not None:
        raise UsageError("release takes its queue once: 'release QUEUE --consumer CONSUMER'")
    warn_deprecated("'release --queue QUEUE' is deprecated: use 'release QUEUE --consumer ...'")
    return args.old_queue, args.consumer


def _json_lines(path: str | None) -> list[dict[str, Any]]:
    """Messages as JSON objects, one per line (blank lines skipped), each checked as
    publish checks a row; times parsed. Errors name the line (from 1).

    Raises:
        InvalidOptionError: ``--file`` cannot be read.
        InvalidInputError: a line that is not a JSON object of a message's columns.
    """
    try:
        source = open(path, "rb") if path else sys.stdin.buffer  # noqa: SIM115
    except OSError as error:
        raise InvalidOptionError(f"--file {path}: cannot read it: {error.strerror}") from None
    rows = []
    with source:
        for number, raw in enumerate(source, start=1):
            where = f"{path or 'stdin'} line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInputError(f"{where} is not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise InvalidInputError(f"{where} is not JSON: {error}") from None
            if not isinstance(row, dict):
                raise InvalidInputError(f"{where} is not a JSON object")
            for name in ("deliver_at", "expires_at"):
                if row.get(name) is not None:
                    row[name] = _utc_time(row[name], f"{where}: {name}")
            try:
                check_message(row)
            except InvalidInputError as error:
                raise InvalidInputError(f"{where}: {error}") from None
            rows.append(row)
    return rows


def _utc_time(value: object, what: str) -> datetime:
    """A JSON line's time: an ISO 8601 string (without a zone, UTC)."""
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInputError(f"{what} is {shown(value)}, not an ISO 8601 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _shown(argument: str, value: Any) -> str:
    if value is not None:
        return str(value)
    return "unlimited" if argument in ("max_length", "max_length_bytes") else "none"


def _metrics(flag: str) -> Any:
    """:mod:`spark_queue.server.metrics`, which needs the ``metrics`` extra.

    Raises:
        InvalidOptionError: prometheus-client is not installed (naming ``flag``).
    """
    try:
        from spark_queue.server import metrics
    except ModuleNotFoundError as error:
        raise InvalidOptionError(
            f"{flag} needs {error.name}: pip install 'spark-queue[metrics]'"
        ) from None
    return metrics


def _run_broker(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """``broker``: serve until SIGTERM. A missing token beyond loopback is bad usage."""
    from spark_queue.server.flight import check_token_text, run_broker
    from spark_queue.server.listening import check_sqs_keys, check_token, parse_listen

    # An empty variable is no token; a flag given empty is a blank token.
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV_VAR) or None
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together: give both or neither")
    try:
        if token is not None:
            check_token_text(token, "--token" if args.token is not None else f"${TOKEN_ENV_VAR}")
        check_token(parse_listen(args.listen)[0], token, args.tls_cert is not None)
        if args.advertise is not None:
            parse_listen(args.advertise, "--advertise")
    except InvalidOptionError as error:
        parser.error(str(error))
    sqs_keys = None
    if args.sqs is not None:
        from spark_queue.server.sqs.signing import keys_from_environment

        try:
            sqs_keys = keys_from_environment(os.environ)
            check_sqs_keys(parse_listen(args.sqs, "--sqs")[0], sqs_keys)
        except InvalidOptionError as error:
            parser.error(str(error))
    metrics_token = None
    if args.metrics is not None:
        metrics = _metrics("--metrics")
        metrics_token = os.environ.get(metrics.TOKEN_ENV_VAR) or None
        try:
            if metrics_token is not None:
                check_token_text(metrics_token, f"${metrics.TOKEN_ENV_VAR}")
            metrics.check_metrics_token(
                parse_listen(args.metrics, "--metrics")[0], metrics_token, args.tls_cert is not None
            )
        except InvalidOptionError as error:
            parser.error(str(error))
    logging.basicConfig(level=logging.INFO, format="spark-queue broker: %(message)s")
    run_broker(
        args.broker_path,
        listen=args.listen,
        advertise=args.advertise,
        storage_options=parse_storage_flags(
            (args.storage_options or []) + (args.broker_storage_options or [])
        ),
        policies=args.policies,
        token=token,
        max_request_bytes=args.max_request_bytes,
        tls_files=None if args.tls_cert is None else (args.tls_cert, args.tls_key),
        stop_timeout_seconds=args.stop_timeout / 1000,
        announce=lambda line: print(line, flush=True),
        sqs_listen=args.sqs,
        sqs_keys=sqs_keys,
        sqs_limits=HttpLimits(
            max_connections=args.sqs_max_connections, timeout_seconds=args.sqs_timeout / 1000
        ),
        metrics_listen=args.metrics,
        metrics_token=metrics_token,
        proof_lifetime_seconds=args.proof_lifetime / 1000,
    )
    return ""


def run_command(args: argparse.Namespace) -> str:
    if args.command == "policies":
        return _check_policies(args)
    command = args.command
    # Only DECLARING_COMMANDS read the policies file, so a broken $SPARK_QUEUE_POLICIES does
    # not stop `stats` or `peek`.
    policies = args.policies if command in DECLARING_COMMANDS else Policies([], "<unused>")
    storage = parse_storage_flags(args.storage_options)
    if command == "check-storage":
        took = check_exclusive_commits(Location.of(args.path, storage))
        return (
            f"{args.path}: two racing commits of one version: one won, one was refused ({took} ms)"
        )
    table = QueueTable(args.path, policies=policies, storage_options=storage, broker=args.broker)
    if command == "queues":
        return "\n".join(table.queues())
    if command in ("declare", "alter"):
        arguments = getattr(table, command)(args.queue, **_given(args))
        return json.dumps({"queue": args.queue, **arguments.__dict__})
    if command == "publish":
        rows = _json_lines(args.file)
        result = table.publish(
            args.queue,
            rows,
            producer=args.producer,
            sequence=args.sequence,
            on_reject=args.on_reject,
            **_given(args),
        )
        if args.json:
            return json.dumps(asdict(result))
        if result.duplicate:
            return f"duplicate: {args.producer!r} committed sequence {args.sequence} before"
        if not rows:
            return f"published 0: no messages in {args.file or 'stdin'}"
        seqs = f" (seqs {result.seqs[0]}..{result.seqs[-1]})" if result.seqs else ""
        return (
            f"published {len(result.seqs)}{seqs}, rejected {result.rejected}, "
            f"evicted {result.evicted}, dead-lettered {result.dead_lettered}"
        )
    if command == "stats":
        if args.queue is None and table.store.open() is None:
            raise TableNotFoundError(args.path)
        if args.format == "prometheus":
            if args.per_partition:
                raise InvalidOptionError(
                    "--per-partition shows --format table or json; the Prometheus format "
                    "sums a partitioned queue's partitions"
                )
            exposition = _metrics("--format prometheus").queue_exposition(table, args.queue)
            return str(exposition).rstrip("\n")
        names = [args.queue] if args.queue else table.queues()
        columns = ["queue", "ready", "ready_bytes", "leased", "scheduled", *COUNTERS]
        if args.per_partition:
            rows = [
                {"queue": n, "partition": k, **part}
                for n in names
                for k, part in enumerate(table.partition_stats(n))
            ]
            columns.insert(1, "partition")
        else:
            rows = [{"queue": n, **table.stats(n)} for n in names]
        if args.format == "json":
            return "\n".join(json.dumps(row) for row in rows)
        return _table(rows, columns)
    if command == "peek":
        peeked = table.peek(args.queue, args.limit)
        rows = peeked.to_pylist()
        partitions = partition_of(peeked["seq"].to_numpy()).tolist()
        for row, partition in zip(rows, partitions, strict=True):
            row["body"] = _escaped(bytes(row["body"]).decode("utf-8", errors="surrogateescape"))
            if row["message_id"] is not None:
                row["message_id"] = _escaped(row["message_id"])
            row["partition"] = partition
        columns = ["seq", "priority", "enqueued_at", "message_id", "body"]
        return _table(rows, ["partition", *columns] if args.per_partition else columns)
    if command == "purge":
        purged = table.purge(args.queue, progress=_progress(args))
        return (
            json.dumps({"queue": args.queue, "purged": purged}) if args.json else f"purged {purged}"
        )
    if command == "ack":
        return f"acked {table.ack(args.queue, args.seqs, args.consumer)}"
    if command == "cancel":
        return f"cancelled {table.cancel(args.queue, args.seqs, args.consumer, delay=args.delay)}"
    if command == "extend":
        extended = table.extend(args.queue, args.seqs, args.consumer, args.period)
        return f"extended {extended}"
    if command == "release":
        queue, consumer = _release_target(args)
        return f"released {table.release(queue, consumer=consumer)}"
    if command == "compact":
        counts = table.compact(progress=_progress(args))
        if args.json:
            return json.dumps(counts)
        return (
            f"compacted: {counts['dropped']} files dropped, {counts['rewritten']} rewritten "
            f"into {counts['written']}"
        )
    if args.dry_run is None:
        warn_deprecated(
            "vacuum without --dry-run or --no-dry-run is a dry run, as delta-rs's vacuum: it "
            "lists the files and deletes none; --no-dry-run deletes them"
        )
        args.dry_run = True
    removed = table.vacuum(
        args.retention_hours, args.dry_run, force=args.force, progress=_progress(args)
    )
    if args.json:
        return json.dumps(
            {
                "retention_hours": args.retention_hours,
                "dry_run": args.dry_run,
                "count": len(removed),
                "files": removed,
            }
        )
    verb = "would remove" if args.dry_run else "removed"
    return "\n".join([*removed, f"{verb} {len(removed)} files"])


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (0 done, 1 refused, 2 bad usage). Errors are
    one line on stderr, whatever raised them; so is each old spelling used (a
    :class:`SparkQueueDeprecationWarning`), as ``spark-queue: warning: ...``."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", SparkQueueDeprecationWarning)
        show = warnings.showwarning

        def one_line_each(message: Any, category: type[Warning], *where: Any, **more: Any) -> None:
            if issubclass(category, SparkQueueDeprecationWarning):
                print(f"spark-queue: warning: {one_line(str(message))}", file=sys.stderr)
            else:
                show(message, category, *where, **more)

        warnings.showwarning = one_line_each
        return _run(argv)


def _run(argv: Sequence[str] | None) -> int:
    # gRPC (under Arrow Flight) logs through absl from INFO up unless told otherwise: a TLS
    # handshake that fails, say, as raw lines before spark-queue's own. Errors only, unless
    # the user chose; gRPC reads it when it starts, at this process's first Flight call.
    os.environ.setdefault(GRPC_VERBOSITY_ENV_VAR, "ERROR")
    storage: dict[str, str] = {}
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        args.storage_options = (args.storage_options or []) + getattr(
            args, "storage_options_after", []
        )
        try:
            storage = parse_storage_flags(
                args.storage_options + (getattr(args, "broker_storage_options", None) or [])
            )
        except InvalidOptionError as error:
            raise UsageError(str(error)) from None
        if getattr(args, "broker", None) is not None:
            try:
                parse_mode(args.broker)
            except InvalidOptionError:
                parser.error("--broker must be 'auto', 'off', 'host:port' or 'tls://host:port'")
        if args.path is None and args.command not in ("policies", "broker"):
            parser.error(f"--path is required by {args.command!r}")
        if args.command == "policies" and not (args.policies or os.environ.get(ENV_VAR)):
            parser.error(f"policies check needs a policies file: --policies FILE or ${ENV_VAR}")
        output = _run_broker(args, parser) if args.command == "broker" else run_command(args)
    except UsageError as error:
        _say(str(error), storage)
        return EXIT_USAGE
    except QueueError as error:
        _say(str(error), storage)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        _say("interrupted", storage)
        return 130
    except Exception as error:  # not ours: its type and its message's first line (some
        # libraries add a backtrace), never a traceback
        first = next((line for line in str(error).splitlines() if line.strip()), "")
        _say(f"unexpected {type(error).__name__}: {first}", storage)
        return EXIT_REFUSED
    if output:
        try:
            print(output, flush=True)
        except BrokenPipeError:  # the reader left (`| head -1`): the rest goes nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_REFUSED
    return 0


def _say(message: str, storage: dict[str, str]) -> None:
    """An error on stderr as one line, with no colour codes and no storage option secret."""
    print(f"spark-queue: {one_line(scrubbed(message, storage))}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
