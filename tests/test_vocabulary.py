"""One vocabulary: the queue is ``queue`` and the consumer ``consumer`` on every call, the
queue first; old spellings work for one release, each with a warning naming the new one
(CHANGELOG.md, "Migration"). No Spark."""

from __future__ import annotations

import inspect
import os
import time
import typing
import warnings
from datetime import timedelta
from pathlib import Path

import pytest

import spark_queue
from spark_queue import ClientClosedError, InvalidOptionError, PublishResult, QueueTable, Rows, cli
from spark_queue.model.arguments import SPECIFICATION
from spark_queue.model.deprecations import (
    CONSUMER_RENAMES,
    PUBLISHER_RENAMES,
    QUEUE_RENAMES,
    SparkQueueDeprecationWarning,
)
from spark_queue.model.policies import Policies
from spark_queue.spark.options import parse_sink_options

POLICIES = '[policy.all]\nmatch = "#"\nmax-length = 50\n'


@pytest.fixture
def table(tmp_path: Path) -> QueueTable:
    policies = tmp_path / "policies.toml"
    policies.write_text(POLICIES)
    table = QueueTable(str(tmp_path / "queues"), policies=str(policies), broker="off")
    table.declare("orders", max_length=10)
    table.publish("orders", [b"a", b"b", b"c"])
    return table


# Each call that named its queue ``name``, with what it needs beside the queue.
QUEUE_CALLS = {
    "declare": {"max_length": 10},
    "alter": {"max_length": 10},
    "arguments": {},
    "resolve": {},
    "stats": {},
    "peek": {"limit": 2},
}


def same(left: object, right: object) -> bool:
    """Results compare equal, a pyarrow table by its rows."""
    if hasattr(left, "to_pylist"):
        return left.to_pylist() == right.to_pylist()  # type: ignore[attr-defined]
    return left == right


@pytest.mark.parametrize("method", sorted(QUEUE_CALLS))
def test_a_call_that_named_its_queue_name_takes_queue_and_the_old_name_warns(
    table: QueueTable, method: str
):
    call = getattr(table, method)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparkQueueDeprecationWarning)
        new = call(queue="orders", **QUEUE_CALLS[method])
    with pytest.warns(SparkQueueDeprecationWarning) as warned:
        old = call(name="orders", **QUEUE_CALLS[method])
    assert same(old, new)
    assert [str(w.message) for w in warned] == [f"{method}(name=...) is deprecated: use queue=..."]
    # Attributed to the caller's line, where Python's default filter shows it.
    assert {w.filename for w in warned} == {__file__}


def test_purge_takes_queue_and_the_old_name_warns(table: QueueTable):
    with pytest.warns(SparkQueueDeprecationWarning, match=r"purge\(name=...\).*queue="):
        assert table.purge(name="orders") == 3
    table.publish("orders", [b"d"])
    assert table.purge(queue="orders") == 1


def test_an_old_and_a_new_name_at_once_are_refused(table: QueueTable):
    version = table.store.open().version()
    with pytest.raises(InvalidOptionError, match=r"^alter: name is the old name of queue; give"):
        table.alter(name="orders", queue="orders", max_length=5)
    assert table.store.open().version() == version
    with pytest.raises(InvalidOptionError, match="consumer: name is the old name of consumer"):
        table.consumer("orders", name="a", consumer="b")


def test_release_takes_the_queue_first_and_the_consumer_by_keyword(table: QueueTable):
    table.declare("other")
    table.publish("other", [b"x"])
    for queue in ("orders", "other"):
        table.lease(queue, "c")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparkQueueDeprecationWarning)
        assert table.release("orders", consumer="c") == 3
        assert table.release(consumer="c") == 1  # every queue
    assert table.stats("orders")["ready"] == 3
    # Without consumer=, one name is the old release(consumer), for one release.
    with pytest.warns(SparkQueueDeprecationWarning):
        assert table.release("orders") == 0  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "old_call",
    [
        pytest.param(lambda t: t.release("c", "orders"), id="release(consumer, queue)"),
        pytest.param(lambda t: t.release("c", queue="orders"), id="release(consumer, queue=)"),
        pytest.param(lambda t: t.release("c"), id="release(consumer)"),
    ],
)
def test_the_old_release_order_still_releases_and_warns(table: QueueTable, old_call):
    leased = table.lease("orders", "c", max_messages=2)["seq"].to_pylist()
    with pytest.warns(SparkQueueDeprecationWarning, match=r"release\(queue, consumer=consumer\)"):
        assert old_call(table) == len(leased)
    assert table.stats("orders")["leased"] == 0


def test_the_consumer_is_named_consumer_and_the_old_name_warns(table: QueueTable):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparkQueueDeprecationWarning)
        with table.consumer("orders", consumer="worker") as consumer:
            assert consumer.name == "worker"
            assert consumer.receive(1, wait_time="10s")[0].body == b"a"
    with (
        pytest.warns(SparkQueueDeprecationWarning, match=r"consumer\(name=...\).*consumer="),
        table.consumer("orders", name="other") as consumer,
    ):
        assert consumer.name == "other"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_cli_releases_queue_first_and_says_the_old_order_is_deprecated(
    table: QueueTable, capsys: pytest.CaptureFixture[str]
):
    path = table.path
    table.lease("orders", "c", max_messages=1)
    assert run_cli(capsys, "--path", path, "release", "orders", "--consumer", "c") == (
        0,
        "released 1\n",
        "",
    )
    table.lease("orders", "c", max_messages=2)
    code, out, err = run_cli(capsys, "--path", path, "release", "c", "--queue", "orders")
    assert (code, out) == (0, "released 2\n")
    assert err == (
        "spark-queue: warning: 'release CONSUMER [--queue QUEUE]' is deprecated: use "
        "'release [QUEUE] --consumer CONSUMER'\n"
    )
    code, out, err = run_cli(
        capsys, "--path", path, "release", "--queue", "orders", "--consumer", "c"
    )
    assert (code, out) == (0, "released 0\n")
    assert err.startswith("spark-queue: warning: 'release --queue QUEUE' is deprecated")
    code, _, err = run_cli(
        capsys, "--path", path, "release", "orders", "--queue", "x", "--consumer", "c"
    )
    assert code == 2 and "takes its queue once" in err


# -- units: a duration is one type, and no name carries a unit it does not take ------------


@pytest.mark.parametrize(
    ("old", "new", "value", "kept"),
    [
        ("ack_interval_ms", "ack_interval", 250, lambda c: c._acks.interval_seconds),
        (
            "max_poll_interval_ms",
            "idle_check_interval",
            "1s",
            lambda c: c._long_poll.max_interval_seconds,
        ),
        (
            "idle_lease_interval_ms",
            "idle_lease_interval",
            "1h",
            lambda c: c._long_poll.idle_lease_interval_seconds,
        ),
    ],
)
def test_a_consumer_option_that_named_its_unit_is_a_duration_and_the_old_name_warns(
    table: QueueTable, old: str, new: str, value: object, kept
):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparkQueueDeprecationWarning)
        with table.consumer("orders", "c", **{new: value}) as consumer:
            taken = kept(consumer)
    with (
        pytest.warns(SparkQueueDeprecationWarning, match=rf"consumer\({old}=...\).*use {new}="),
        table.consumer("orders", "c", **{old: value}) as consumer,
    ):
        assert kept(consumer) == taken
    assert taken == {250: 0.25, "1s": 1.0, "1h": 3600.0}[value]


def test_the_publishers_linger_is_a_duration_and_linger_ms_warns(table: QueueTable):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparkQueueDeprecationWarning)
        with table.publisher("orders", linger=timedelta(milliseconds=20)) as publisher:
            assert publisher.linger_s == 0.02
    with (
        pytest.warns(SparkQueueDeprecationWarning, match=r"publisher\(linger_ms=...\)"),
        table.publisher("orders", linger_ms="1s") as publisher,
    ):
        assert publisher.linger_s == 1.0


def test_receive_waits_a_duration_and_the_old_timeout_in_seconds_warns(table: QueueTable):
    with table.consumer("orders", "c") as consumer:
        with warnings.catch_warnings():
            warnings.simplefilter("error", SparkQueueDeprecationWarning)
            assert [m.body for m in consumer.receive(1, wait_time="30s")] == [b"a"]
            assert [m.body for m in consumer.receive(1, wait_time=timedelta(seconds=30))] == [b"b"]
        with pytest.warns(SparkQueueDeprecationWarning, match=r"receive\(timeout=seconds\)"):
            assert [m.body for m in consumer.receive(1, 30)] == [b"c"]  # seconds, as before
        started = time.monotonic()
        with pytest.warns(SparkQueueDeprecationWarning):
            assert consumer.receive(1, timeout=0.2) == []
        assert 0.2 <= time.monotonic() - started < 10
        with (
            pytest.warns(SparkQueueDeprecationWarning),
            pytest.raises(InvalidOptionError, match=r"^timeout must be None .* seconds >= 0"),
        ):
            consumer.receive(1, timeout=-1)
        with pytest.raises(InvalidOptionError, match="timeout is the old name of wait_time"):
            consumer.receive(1, timeout=1, wait_time="1s")


def test_receiving_zero_messages_receives_none_at_once_as_leasing_zero_leases_none(
    table: QueueTable,
):
    assert table.lease("orders", "other", max_messages=0).num_rows == 0
    with table.consumer("orders", "c") as consumer:
        started = time.monotonic()
        assert consumer.receive(0) == []
        assert consumer.receive(0, wait_time="1h") == []
        assert time.monotonic() - started < 5
        with pytest.raises(InvalidOptionError, match=r"^max_messages must be a whole number >= 1"):
            next(consumer.batches(0))
    with pytest.raises(ClientClosedError):
        consumer.receive(0)


def test_a_nack_delay_is_any_duration(table: QueueTable):
    with table.consumer("orders", "c") as consumer:
        (message,) = consumer.receive(1, wait_time="30s")
        message.nack(delay=timedelta(hours=1))
    stats = table.stats("orders")
    assert (stats["scheduled"], stats["ready"]) == (1, 2)


# -- one spelling of "no limit": None (as text, none) ------------------------------------


def test_none_is_no_limit_on_every_surface_and_minus_one_is_its_old_spelling(
    table: QueueTable, capsys: pytest.CaptureFixture[str]
):
    table = QueueTable(table.path, broker="off")  # no policies: no cap
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparkQueueDeprecationWarning)
        assert table.alter("orders", max_length=None, max_deliveries=None).max_length is None
        assert run_cli(capsys, "--path", table.path, "alter", "orders", "--max-length", "5")[0] == 0
        code, out, err = run_cli(
            capsys, "--path", table.path, "alter", "orders", "--max-length", "none"
        )
        assert (code, err) == (0, "") and '"max_length": null' in out
        options = parse_sink_options(
            {"path": "/queues", "maxlength": "None", "maxdeliveries": "none"}
        )
        assert options.arguments == {"max_length": None, "max_deliveries": None}
    table.alter("orders", max_length=5)
    with pytest.warns(SparkQueueDeprecationWarning, match=r"^max_length=-1 for none is deprecated"):
        assert table.alter("orders", max_length=-1).max_length is None
    code, _, err = run_cli(capsys, "--path", table.path, "alter", "orders", "--max-length=-1")
    assert code == 0
    assert err == (
        "spark-queue: warning: --max-length='-1' for none is deprecated: use None (as text: none)\n"
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.lease("orders", "c", max_deliveries=0), "max_deliveries=0 for none"),
        (lambda t: t.lease("orders", "c", max_cancels=-1), "max_cancels=-1 for none"),
        (lambda t: t.consumer("orders", "c", max_deliveries=0).close(), "max_deliveries=0"),
        (lambda t: t.declare("d", max_cancels=0), "max_cancels=0 for none"),
        (lambda t: t.declare("d", max_redelivery_delay=0), "max_redelivery_delay=0 for none"),
    ],
)
def test_zero_where_it_meant_no_limit_still_means_none_and_warns(table: QueueTable, call, message):
    with pytest.warns(SparkQueueDeprecationWarning, match=message):
        call(table)


def test_a_duration_of_zero_that_is_no_time_at_all_is_no_old_spelling(table: QueueTable):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparkQueueDeprecationWarning)
        declared = table.declare("d", redelivery_delay=0, duplicate_window="0s")
        assert (declared.redelivery_delay, declared.duplicate_window) == (None, None)
        assert table.declare("e", max_redelivery_delay="none").max_redelivery_delay is None


@pytest.mark.parametrize("old", ["-1", "0", '"-1"'])
def test_a_policy_cap_of_none_is_no_cap_and_its_old_spellings_warn(old: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparkQueueDeprecationWarning)
        policy = Policies.parse(
            '[policy.p]\nmatch = "#"\nmax-deliveries = "none"\nduplicate-window = "none"\n'
        ).policies[0]
    assert policy.caps == {"max_deliveries": None, "duplicate_window": None}
    with pytest.warns(SparkQueueDeprecationWarning, match="duplicate-window="):
        old_policy = Policies.parse(f'[policy.p]\nmatch = "#"\nduplicate-window = {old}\n')
    assert old_policy.policies[0].caps == {"duplicate_window": None}


# -- vacuum: a dry run unless told otherwise, as delta-rs's ---------------------------------

ORPHAN = f"record=message/part-{'f' * 32}.parquet"


def orphan_file(table: QueueTable) -> Path:
    """A file no commit mentions, named as spark-queue names its staged files, a month old:
    what a full vacuum deletes."""
    orphan = Path(table.path) / ORPHAN
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"never committed")
    old = time.time() - 30 * 86_400
    os.utime(orphan, (old, old))
    return orphan


def test_vacuum_lists_unless_told_to_delete_and_says_so_where_dry_run_is_left_out(
    table: QueueTable,
):
    orphan = orphan_file(table)
    with pytest.warns(SparkQueueDeprecationWarning, match=r"pass dry_run=False to delete them"):
        assert table.vacuum() == [ORPHAN]
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparkQueueDeprecationWarning)
        assert table.vacuum(dry_run=True) == [ORPHAN]
    assert orphan.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparkQueueDeprecationWarning)
        assert table.vacuum(168, False) == [ORPHAN]
    assert not orphan.exists()


def test_the_cli_vacuum_is_a_dry_run_unless_no_dry_run(
    table: QueueTable, capsys: pytest.CaptureFixture[str]
):
    orphan = orphan_file(table)
    code, out, err = run_cli(capsys, "--path", table.path, "vacuum")
    assert (code, out) == (0, f"{ORPHAN}\nwould remove 1 files\n")
    assert err.startswith("spark-queue: warning: vacuum without --dry-run or --no-dry-run")
    assert run_cli(capsys, "--path", table.path, "vacuum", "--dry-run") == (
        0,
        f"{ORPHAN}\nwould remove 1 files\n",
        "",
    )
    assert orphan.exists()
    assert run_cli(capsys, "--path", table.path, "vacuum", "--no-dry-run") == (
        0,
        f"{ORPHAN}\nremoved 1 files\n",
        "",
    )
    assert not orphan.exists()


# -- publish and publish_outcome: one signature, declared once -----------------------------


def test_publish_takes_publish_outcomes_signature_and_answers_its_result(table: QueueTable):
    publish = inspect.signature(QueueTable.publish)
    outcome = inspect.signature(QueueTable.publish_outcome)
    assert publish.parameters == outcome.parameters
    assert (publish.return_annotation, outcome.return_annotation) == (
        "PublishResult",
        "PublishOutcome",
    )
    assert typing.get_type_hints(QueueTable.publish)["rows"] == Rows
    assert QueueTable.publish.__doc__.startswith("Enqueue ``rows`` to ``queue``")
    result = table.publish("orders", [b"d"], on_reject="fail")
    assert isinstance(result, PublishResult) and result.seqs == [3]
    outcome_of = table.publish_outcome("orders", [b"e"])
    assert outcome_of.result.seqs == [4] and outcome_of.accepted.tolist() == [True]


# -- the changelog ---------------------------------------------------------------------------


def test_the_changelogs_migration_lists_every_old_spelling_and_its_new_one():
    text = (Path(__file__).resolve().parents[1] / "CHANGELOG.md").read_text(encoding="utf-8")
    unreleased = text[text.index("## Unreleased") :]
    rows = [
        row
        for row in unreleased[unreleased.index("### Migration") :].splitlines()
        if row[:1] == "|"
    ]

    def listed(old: str, new: str) -> bool:
        return any(old in row and new in row.split(old, 1)[1] for row in rows)

    for renames in (QUEUE_RENAMES, CONSUMER_RENAMES, PUBLISHER_RENAMES):
        for old, new in renames.items():
            assert listed(f"`{old}=", f"`{new}="), (old, new)
    assert listed("`timeout=", "`wait_time=")
    assert listed("`release(consumer, queue=None", "`release(queue=None, *, consumer")
    assert listed("`spark-queue release CONSUMER", "`spark-queue release [QUEUE] --consumer")
    assert listed("`dry_run=False`: deletes", "`dry_run=True`")
    for name, module in spark_queue._MOVED.items():
        assert listed(f"`spark_queue.{name}`", f"`{module}.{name}`"), name
    # Each argument whose kind takes an old spelling of "no limit", from the specification.
    for argument in SPECIFICATION:
        kind = argument.kind
        old = [v for v in (-1, 0) if kind.old_spelling(v)] if hasattr(kind, "old_spelling") else []
        for value in old:
            assert any(f"`{argument.name}`" in row and f"`{value}`" in row for row in rows), (
                argument.name,
                value,
            )
