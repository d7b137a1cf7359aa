"""The `spark-queue` command on a real queue table: output, exit codes, messages."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from spark_queue import InvalidOptionError, QueueTable
from spark_queue.broker.discovery import read_records
from spark_queue.cli import main
from spark_queue.storage.location import Location
from tests.helpers import messages, set_table_property, write_batch


def cli(path: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spark_queue.cli", "--path", path, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def refused(result: subprocess.CompletedProcess, text: str) -> bool:
    """Exit 1, nothing on stdout, one ``spark-queue: ...`` line naming the problem."""
    lines = result.stderr.strip().splitlines()
    return (
        result.returncode == 1
        and result.stdout == ""
        and len(lines) == 1
        and lines[0].startswith("spark-queue: ")
        and text in lines[0]
    )


def usage(result: subprocess.CompletedProcess, text: str) -> bool:
    """Exit 2 (argparse), the usage and a message naming the problem on stderr."""
    return result.returncode == 2 and result.stdout == "" and text in result.stderr


def test_cli_commands_on_a_real_queue(spark, queue_path):
    declared = cli(queue_path, "declare", "orders", "--ring-size", "3")
    assert declared.returncode == 0
    assert json.loads(declared.stdout)["overflow"] == "ring"
    write_batch(messages(spark, list("abcd")), queue_path, queue="orders")
    assert cli(queue_path, "queues").stdout.split() == ["orders"]
    stats = json.loads(cli(queue_path, "stats", "orders", "--json").stdout)
    assert (stats["ready"], stats["replaced"]) == (3, 1)
    table = cli(queue_path, "stats").stdout
    assert table.splitlines()[0].split()[:3] == ["queue", "ready", "ready_bytes"]
    peeked = cli(queue_path, "peek", "orders", "--limit", "2").stdout.splitlines()
    assert [line.split()[-1] for line in peeked[1:]] == ["b", "c"]
    held = QueueTable(queue_path).lease("orders", "c", max_messages=2)["seq"].to_pylist()
    extended = cli(
        queue_path, "extend", "orders", *map(str, held), "--consumer", "c", "--period", "5m"
    )
    assert extended.stdout.strip() == "extended 2"
    assert cli(queue_path, "cancel", "orders", str(held[0])).stdout.strip() == "cancelled 1"
    assert cli(queue_path, "ack", "orders", str(held[1])).stdout.strip() == "acked 1"
    assert cli(queue_path, "release", "--consumer", "c").stdout.strip() == "released 0"
    assert cli(queue_path, "alter", "orders", "--max-length", "1").returncode == 0
    assert cli(queue_path, "purge", "orders").stdout.strip() == "purged 2"
    compacted = json.loads(cli(queue_path, "compact", "--json").stdout)
    assert set(compacted) == {"dropped", "rewritten", "written"}
    assert cli(queue_path, "compact").stdout.startswith("compacted: ")
    vacuumed = json.loads(cli(queue_path, "vacuum", "--no-dry-run", "--json").stdout)
    assert vacuumed == {"retention_hours": 168.0, "dry_run": False, "count": 0, "files": []}
    assert cli(queue_path, "vacuum", "--dry-run").stdout.strip() == "would remove 0 files"


def test_cli_long_operations_report_progress_on_stderr(spark, queue_path):
    for i in range(3):  # three small message files
        write_batch(messages(spark, [f"m{i}"]), queue_path, queue="jobs")
    quiet = cli(queue_path, "compact", "--json")  # stderr is not a terminal: no progress
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert json.loads(quiet.stdout) == {"dropped": 0, "rewritten": 3, "written": 1}
    write_batch(messages(spark, ["m3", "m4"]), queue_path, queue="jobs")
    write_batch(messages(spark, ["m5"]), queue_path, queue="jobs")
    shown = cli(queue_path, "compact", "--progress")
    assert shown.returncode == 0
    steps = shown.stderr.splitlines()
    assert steps[:3] == [
        "spark-queue: compacting queue jobs: 1/3 files",
        "spark-queue: compacting queue jobs: 2/3 files",
        "spark-queue: compacting queue jobs: 3/3 files",
    ]
    assert steps[-1].startswith("spark-queue: committing: ")
    assert shown.stdout.strip() == "compacted: 0 files dropped, 3 rewritten into 1"
    vacuum = cli(
        queue_path, "vacuum", "--retention-hours", "1", "--force", "--no-dry-run", "--progress"
    )
    assert vacuum.returncode == 0 and vacuum.stdout.strip() == "removed 0 files"
    assert vacuum.stderr.splitlines()[-1].endswith(": 0 files removed")
    purge = cli(queue_path, "purge", "jobs", "--progress", "--json")
    assert json.loads(purge.stdout) == {"queue": "jobs", "purged": 6}
    assert "spark-queue: purging queue jobs: 1/1 file runs read" in purge.stderr
    assert cli(queue_path, "purge", "jobs", "--quiet").stderr == ""
    assert QueueTable(queue_path).stats("jobs")["purged"] == 6


def test_cli_errors_exit_non_zero_and_name_the_problem(queue_path):
    QueueTable(queue_path).declare("orders", max_length=5)
    missing = cli(queue_path, "stats", "nope")
    assert missing.returncode == 1 and "queue 'nope' does not exist" in missing.stderr
    mismatch = cli(queue_path, "declare", "orders", "--max-length", "6")
    assert mismatch.returncode == 1 and "maxLength: queue has 5, given 6" in mismatch.stderr
    bad = cli(queue_path, "declare", "other", "--overflow", "sideways")
    assert bad.returncode == 1 and "overflow must be one of" in bad.stderr
    assert usage(cli(queue_path, "frobnicate"), "invalid choice: 'frobnicate'")


def test_every_command_refuses_bad_arguments(queue_path, tmp_path):
    table = QueueTable(queue_path)
    table.declare("orders", max_length=5)
    # Removed files kept for a day (new queue tables keep an hour): a floor above the hard one.
    set_table_property(queue_path, "delta.deletedFileRetentionDuration", "interval 1 days")
    files = sorted(p.name for p in Path(queue_path).rglob("*") if p.is_file())
    missing = "queue 'nope' does not exist"
    # Refused by the queue table: exit 1, one line naming what is wrong.
    for args, text in (
        (("declare", "bad name!"), "bad name!"),
        (("declare", "other", "--max-length", "-2"), "--max-length must be a whole number >= 0"),
        (("alter", "nope", "--max-length", "1"), missing),
        (("alter", "orders", "--overflow", "sideways"), "overflow must be one of"),
        (("stats", "nope", "--json"), missing),
        (("peek", "nope"), missing),
        (("purge", "nope"), missing),
        (("ack", "nope", "1"), missing),
        (("cancel", "nope", "1"), missing),
        (("extend", "nope", "1", "--consumer", "c", "--period", "1m"), missing),
        (("release", "nope", "--consumer", "c"), missing),
        (("vacuum", "--retention-hours", "0", "--force", "--no-dry-run"), "below 1 hour"),
        (("vacuum", "--retention-hours", "12", "--no-dry-run"), "below the safe floor of 24"),
    ):
        assert refused(cli(queue_path, *args), text), (args, cli(queue_path, *args).stderr)
    # A queue argument's flag is refused by the table's rules, its value never quoted.
    quoted = cli(queue_path, "declare", "other", "--max-length", "SECRET1", "--ring-size", "4")
    assert refused(quoted, "--max-length must be") and "SECRET" not in quoted.stderr
    nowhere = str(tmp_path / "nowhere")
    for command in (["compact"], ["vacuum", "--dry-run"]):
        assert refused(cli(nowhere, *command), f"no queue table at {nowhere}")
    # Bad usage: exit 2, argparse names the argument.
    for args, text in (
        (("peek", "orders", "--limit", "-1"), "argument --limit: must be a whole number >= 0"),
        (("peek", "orders", "--limit", "ten"), "argument --limit"),
        (("ack", "orders"), "the following arguments are required: seqs"),
        (("ack", "orders", "first"), "argument seqs: must be a seq: a whole number from 0"),
        (("cancel", "orders", "1.5"), "argument seqs: must be a seq"),
        (("release",), "release needs --consumer"),
        (("declare",), "the following arguments are required: queue"),
        (("stats", "orders", "--format", "csv"), "argument --format: must be one of table, json"),
        (("purge",), "required: queue"),
        (("vacuum", "--retention-hours", "-1"), "argument --retention-hours: must be a number"),
        (("vacuum", "--retention-hours", "a week"), "argument --retention-hours"),
        (("compact", "--progress", "--quiet"), "not allowed with argument --progress"),
        (("compact", "now"), "unrecognized arguments: now"),
        (("extend", "orders", "1", "--consumer", "c", "--period", "0"), "--period: must be"),
        (("cancel", "orders", "1", "--delay", "soon"), "argument --delay: must be a duration"),
        (("broker", "--max-request-bytes", "0"), "argument --max-request-bytes: must be a"),
    ):
        assert usage(cli(queue_path, *args), text), (args, cli(queue_path, *args).stderr)
    missing_path = subprocess.run(
        [sys.executable, "-m", "spark_queue.cli", "queues"], capture_output=True, text=True
    )
    assert usage(missing_path, "--path is required by 'queues'")
    # Nothing was written by any of them.
    assert sorted(p.name for p in Path(queue_path).rglob("*") if p.is_file()) == files
    assert table.queues() == ["orders"]


def test_publish_from_json_lines_idempotently(tmp_path):
    path = str(tmp_path / "queues")
    lines = tmp_path / "messages.jsonl"
    lines.write_text(
        '{"body": "a", "priority": 2, "headers": {"h": "v"}}\n'
        "\n"
        '{"body": "b", "deliver_at": "2020-01-01T00:00:00Z", "message_id": "m2"}\n'
    )
    flags = ["publish", "orders", "--file", str(lines), "--producer", "svc", "--sequence", "1"]
    first = cli(path, *flags, "--ring-size", "10")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == (
        "published 2 (seqs 0..1), rejected 0, evicted 0, dead-lettered 0"
    )
    again = cli(path, *flags, "--json")
    assert json.loads(again.stdout)["duplicate"] is True
    table = QueueTable(path)
    assert table.stats("orders")["added"] == 2
    assert table.arguments("orders").max_length == 10
    piped = subprocess.run(
        [sys.executable, "-m", "spark_queue.cli", "--path", path, "publish", "orders"],
        input='{"body": "c"}\n',
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 0 and "published 1 (seqs 2..2)" in piped.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "x"}\nnot json\n')
    assert refused(cli(path, "publish", "orders", "--file", str(bad)), "line 2 is not JSON")
    bad.write_text('{"body": "x", "deliver_at": "soon"}\n')
    assert refused(cli(path, "publish", "orders", "--file", str(bad)), "deliver_at")
    bad.write_text('{"text": "x"}\n')
    assert refused(cli(path, "publish", "orders", "--file", str(bad)), "'text'")
    assert table.stats("orders")["added"] == 3  # nothing of the refused ones


def in_process(
    capsys: pytest.CaptureFixture[str], *argv: str, stdin: bytes = b""
) -> subprocess.CompletedProcess:
    """``main(argv)`` in this process (seconds faster than a new one), with ``stdin``, its
    exit code and output as :func:`cli` returns a process's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        code = main(list(argv))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)


def test_publish_names_the_line_of_a_bad_message_and_publishes_none(tmp_path, capsys):
    path = str(tmp_path / "queues")
    QueueTable(path).publish("orders", ["first"])
    ok = '{"body": "ok"}'
    lines_file = tmp_path / "messages.jsonl"
    for lines, text in (
        ([ok, '{"body": 5}'], "stdin line 2: column 'body' takes bytes or UTF-8 strings; got 5"),
        ([ok, '{"key": "k"}'], "stdin line 2: the message has no 'body'"),
        ([ok, '{"body": null}'], "stdin line 2: the message has no 'body'"),
        ([ok, "", '{"body": "x", "priority": "high"}'], "stdin line 3: column 'priority'"),
        ([ok, ok, '{"body": "x", "headers": {"h": 1}}'], "stdin line 3: column 'headers'"),
        ([ok, '{"body": "\\ud800"}'], "stdin line 2: column 'body' takes bytes or UTF-8"),
        ([ok, '{"body": "x", "deliver_at": 5}'], "stdin line 2: deliver_at is 5, not an ISO"),
        ([ok, '{"body": "x", "colour": 1}'], "stdin line 2: unknown column 'colour'"),
    ):
        text_in = "\n".join(lines) + "\n"
        piped = in_process(capsys, "--path", path, "publish", "orders", stdin=text_in.encode())
        assert refused(piped, text), (lines, piped.stderr)
        lines_file.write_text(text_in)
        from_file = in_process(
            capsys, "--path", path, "publish", "orders", "--file", str(lines_file)
        )
        assert refused(from_file, text.replace("stdin", str(lines_file))), from_file.stderr
    latin1 = b'{"body": "ok"}\n{"body": "caf\xe9"}\n'
    not_utf8 = in_process(capsys, "--path", path, "publish", "orders", stdin=latin1)
    assert refused(not_utf8, "stdin line 2 is not UTF-8 text")
    assert QueueTable(path).stats("orders")["added"] == 1


def test_publish_from_a_file_that_cannot_be_read_names_the_flag_and_the_path(tmp_path):
    path = str(tmp_path / "queues")
    missing = str(tmp_path / "nonexistent.jsonl")
    result = cli(path, "publish", "orders", "--file", missing)
    assert refused(result, f"--file {missing}: cannot read it: No such file or directory")
    folder = cli(path, "publish", "orders", "--file", str(tmp_path))
    assert refused(folder, f"--file {tmp_path}: cannot read it: Is a directory")
    assert not (tmp_path / "queues").exists()


def test_a_path_of_a_scheme_no_table_lives_at_is_refused_by_scheme(tmp_path, capsys):
    uri = "ftp://user:SECRET@host/q"
    for command in (["declare", "x"], ["stats"], ["queues"], ["publish", "x"]):
        result = in_process(capsys, "--path", uri, *command, stdin=b'{"body": "a"}\n')
        assert refused(result, "path 'ftp://host/q' has the URI scheme 'ftp', where no queue"), (
            command,
            result.stderr,
        )
        assert "a local path or a URI of file, " in result.stderr and ", s3, s3a" in result.stderr
        assert "SECRET" not in result.stderr
    with pytest.raises(InvalidOptionError, match="URI scheme 'memory'"):
        QueueTable("memory://queues")
    # Schemes are case-insensitive (RFC 3986): the table is the same one.
    QueueTable(tmp_path / "queues").declare("orders")
    assert QueueTable(f"FILE://{tmp_path}/queues").queues() == ["orders"]


def test_a_seq_beyond_int64_is_bad_usage_naming_the_argument_and_its_range(tmp_path, capsys):
    path = str(tmp_path / "queues")
    QueueTable(path).declare("orders")
    for argv in (
        ["ack", "orders", "99999999999999999999999"],
        ["cancel", "orders", "1", str(2**63)],
        ["extend", "orders", "-1", "--consumer", "c", "--period", "1m"],
        ["ack", "orders", "first"],
    ):
        result = in_process(capsys, "--path", path, *argv)
        assert result.returncode == 2 and result.stdout == "", (argv, result.stderr)
        assert result.stderr.splitlines() == [
            "spark-queue: argument seqs: must be a seq: a whole number from 0 to 2**63-1 "
            "(see spark-queue ack --help)".replace("ack", argv[0])
        ], argv
    assert in_process(capsys, "--path", path, "ack", "orders", str(2**63 - 1)).returncode == 0


def test_version_prints_the_installed_package_version(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"spark-queue {metadata.version('spark-queue')}\n"


def test_a_bad_address_flag_of_the_broker_gives_an_example_of_its_own(tmp_path, capsys):
    path = str(tmp_path / "queues")
    for flag, example in (
        ("--sqs", "say 127.0.0.1:9324, or port 0"),
        ("--metrics", "say 127.0.0.1:9464, or port 0"),
        ("--listen", "say 127.0.0.1:8815, or port 0"),
        ("--advertise", "say broker.internal:8815)"),
    ):
        result = in_process(capsys, "broker", path, flag, "nowhere")
        assert result.returncode == 2 and f"{flag} takes HOST:PORT ({example}" in result.stderr
        assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "queues").exists()


def test_peek_escapes_what_would_break_a_row_or_reach_the_terminal(tmp_path, capsys):
    path = str(tmp_path / "queues")
    bodies = {
        b"two\nlines\r": "two\\nlines\\r",
        b"\x1b[2J\x1b]0;title\x07": "\\x1b[2J\\x1b]0;title\\x07",
        b"nul\x00tab\t": "nul\\x00tab\\t",
        "caf\u00e9 \u202eevil".encode(): "caf\u00e9 \\u202eevil",
        b"not utf-8 \xff, a backslash \\": "not utf-8 \\xff, a backslash \\\\",
        b"plain": "plain",
    }
    QueueTable(path).publish("p", list(bodies))
    QueueTable(path).publish("p", [{"body": "x", "message_id": "id\n\x1b"}])
    result = in_process(capsys, "--path", path, "peek", "p")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 + len(bodies) + 1  # the header, then one line per message
    assert [line.rstrip().split("  ")[-1] for line in lines[1:-1]] == list(bodies.values())
    assert "id\\n\\x1b" in lines[-1]
    assert not any(c < " " and c not in "\n" for c in result.stdout)


def test_the_docs_name_exactly_the_commands_that_read_the_policies_file(tmp_path, capsys):
    """Every command, run with an invalid policies file: those that fail naming it are the
    ones docs/CLI.md and docs/POLICIES.md list."""
    from spark_queue.cli import build_parser

    path = str(tmp_path / "queues")
    QueueTable(path).declare("orders")
    broken = tmp_path / "policies.toml"
    broken.write_text("not [valid")
    arguments = {
        "queues": [],
        "declare": ["orders"],
        "alter": ["orders"],
        "publish": ["orders"],
        "stats": [],
        "peek": ["orders"],
        "purge": ["orders"],
        "ack": ["orders", "0"],
        "cancel": ["orders", "0"],
        "extend": ["orders", "0", "--consumer", "c", "--period", "1s"],
        "release": ["--consumer", "c"],
        "compact": [],
        "check-storage": [],
        "vacuum": ["--dry-run"],
        "policies check": ["orders"],
    }
    commands = next(
        action.choices
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    assert set(commands) == {*(c.split()[0] for c in arguments), "broker"}
    reading = set()
    for command, args in arguments.items():
        argv = ["--path", path, "--policies", str(broken), *command.split(), *args]
        result = in_process(capsys, *argv)
        if str(broken) in result.stderr:
            reading.add(command)
    broker = subprocess.run(
        [sys.executable, "-m", "spark_queue.cli", "--policies", str(broken), "broker", path],
        capture_output=True,
        text=True,
        timeout=60,  # a broker that did not read the file would serve until then
    )
    if broker.returncode == 1 and str(broken) in broker.stderr:
        reading.add("broker")
    docs = Path(__file__).resolve().parent.parent / "docs"
    cli_doc = (docs / "CLI.md").read_text()
    bullet = cli_doc[cli_doc.index("- `--policies FILE`") :].split("\n- ")[0]
    policies_doc = (docs / "POLICIES.md").read_text()
    sentence = policies_doc[policies_doc.index("Of the CLI's commands") :].split(";")[0]
    for listed in (bullet.split(" read it")[0], sentence):
        named = set(re.findall(r"`([a-z -]+)`", listed)) & {*arguments, "broker"}
        assert named == reading, listed


def without_grpc_verbosity() -> dict[str, str]:
    """This environment without a gRPC log level, as a user's shell has none."""
    return {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}


def test_a_broker_that_cannot_listen_says_so_in_one_line_naming_the_flag(tmp_path):
    from tests.test_broker import self_signed

    cert, key = self_signed(tmp_path)  # beyond loopback a broker needs TLS before it binds
    path = str(tmp_path / "queues")
    QueueTable(path).declare("orders")
    env = {**without_grpc_verbosity(), "SPARK_QUEUE_BROKER_TOKEN": "t" * 32}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for listen, reason in (
            (f"127.0.0.1:{port}", "Address already in use"),
            ("192.0.2.123:0", "Cannot assign requested address"),  # TEST-NET-1: not ours
        ):
            result = subprocess.run(
                [
                    *(sys.executable, "-m", "spark_queue.cli", "broker", path, "--listen", listen),
                    *("--tls-cert", str(cert), "--tls-key", str(key)),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            assert result.returncode == 1 and result.stdout == "", result.stderr
            assert result.stderr.splitlines() == [
                f"spark-queue: the broker cannot listen on {listen} (--listen): {reason}"
            ]
    assert read_records(Location.of(path)) == []  # no broker recorded itself


def test_a_tls_client_of_a_plain_broker_warns_without_grpc_log_lines(tmp_path):
    from tests.brokers import BrokerProcess

    path = str(tmp_path / "queues")
    QueueTable(path).declare("orders")
    env = without_grpc_verbosity()
    broker = BrokerProcess(path, log_path=tmp_path / "broker.log", env=env)
    try:
        result = subprocess.run(
            [
                *(sys.executable, "-m", "spark_queue.cli", "--path", path),
                *("--broker", f"tls://{broker.address}", "stats", "orders", "--json"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    finally:
        broker.stop()
    assert result.returncode == 0 and json.loads(result.stdout)["ready"] == 0
    warnings = result.stderr.splitlines()
    assert warnings and all(
        w.startswith(f"the broker at tls://{broker.address}: ") for w in warnings
    )
    assert "committing directly" in warnings[0], warnings
    assert "absl" not in (tmp_path / "broker.log").read_text()
