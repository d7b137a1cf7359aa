"""Redelivery backoff and nacks with a delay, as the brokers document them:
Artemis's ``redelivery-delay``, ``redelivery-delay-multiplier`` and ``max-redelivery-delay``
address settings (the maximum defaults to 10 x the delay), JetStream's ``NakWithDelay``. A
message waiting out its delay is ``scheduled``: not leased, not counted ready.

Time here is the wall clock, and no check relies on the code being fast: "not yet" is checked
against delays of minutes, and short delays are only waited out (lower bounds: "not before
its time").
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable

from spark_queue import InvalidOptionError, QueueTable
from spark_queue.cli import main as cli_main
from spark_queue.model.policies import load_policies
from spark_queue.rules import identity_holds
from spark_queue.storage.browse import plan_browse, read_partition
from spark_queue.storage.location import Location
from spark_queue.storage.store import QueueStore
from tests.clock import now_micros, wait_past
from tests.helpers import consume, output_columns


def _due_of(table: QueueTable, queue: str) -> dict[int, int]:
    """Scheduled index of ``queue``: seq -> when it is due (microseconds)."""
    waiting = QueueStore(table.path).snapshot().states[queue].scheduled
    return dict(zip(waiting.seq.tolist(), waiting.deliver_at.tolist(), strict=True))


def _browse_states(path: str, queue: str) -> list[str]:
    """The ``state`` column of the browse read (what ``format("ringqueue")`` returns)."""
    partitions = plan_browse(Location.of(path), queue)
    return [s for p in partitions for s in read_partition(p).column("state").to_pylist()]


def _lease_when_due(table: QueueTable, queue: str, consumer: str = "worker", timeout: float = 120):
    """Poll ``lease`` until it delivers; returns the leased rows and the time it did (read
    after the call: a lease that delivered before its time returns before it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leased = table.lease(queue, consumer, max_messages=10)
        if leased.num_rows:
            return leased, now_micros()
        time.sleep(0.02)
    raise AssertionError(f"nothing leased from {queue!r} within {timeout} s")


def test_artemis_redelivery_delay_grows_by_its_multiplier_up_to_the_maximum(tmp_path):
    """Artemis: each redelivery waits the previous delay x redelivery-delay-multiplier,
    never more than max-redelivery-delay.

    Delays of minutes, so "not before its time" holds however slow the machine: message k
    is first returned k - 1 times by nacks that wait for nothing (the backoff follows the
    delivery count, whatever the earlier returns waited), then cancelled with the backoff."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare(
        "jobs", redelivery_delay="1 minute", redelivery_multiplier=2, max_redelivery_delay="150s"
    )
    table.publish("jobs", ["m1", "m2", "m3", "m4"])
    steps = ((1, 60_000), (2, 120_000), (3, 150_000), (4, 150_000))
    for waiting, (deliveries, expected_ms) in enumerate(steps):
        leased = table.lease("jobs", "worker", max_messages=1)
        for _ in range(deliveries - 1):
            table.cancel("jobs", leased.column("seq").to_pylist(), "worker", delay=0)
            leased = table.lease("jobs", "worker", max_messages=1)
        # The earlier messages wait out their delays: never leased before their time.
        assert leased.column("body").to_pylist() == [f"m{deliveries}".encode()]
        assert leased.column("delivery_count").to_pylist() == [deliveries]
        seq = leased.column("seq")[0].as_py()
        before = now_micros()
        assert table.cancel("jobs", [seq], "worker") == 1
        after = now_micros()
        due = _due_of(table, "jobs")[seq]
        assert before + expected_ms * 1000 <= due <= after + expected_ms * 1000
        stats = table.stats("jobs")
        gauges = (stats["ready"], stats["scheduled"], stats["leased"])
        assert gauges == (3 - waiting, 1 + waiting, 0)
        assert identity_holds(stats)
        states = _browse_states(table.path, "jobs")
        assert sorted(states) == ["ready"] * (3 - waiting) + ["scheduled"] * (1 + waiting)
    assert table.lease("jobs", "worker").num_rows == 0  # all four wait minutes yet
    assert table.stats("jobs")["added"] == 4


def test_artemis_max_redelivery_delay_defaults_to_ten_times_the_delay(tmp_path):
    table = QueueTable(str(tmp_path / "q"))
    table.declare("jobs", redelivery_delay="1s", redelivery_multiplier=100)
    table.publish("jobs", ["a"])
    for _ in range(2):  # the third return would wait 10,000 s without the default maximum
        seq = table.lease("jobs", "w", lease_period="1 minute")["seq"][0].as_py()
        table.cancel("jobs", [seq], "w", delay=0)  # a nack that waits for nothing
    table.lease("jobs", "w")
    before = now_micros()
    table.cancel("jobs", [seq], "w")
    after = now_micros()
    assert before + 10 * 1_000_000 <= _due_of(table, "jobs")[seq] <= after + 10 * 1_000_000


def test_a_lease_that_runs_out_waits_its_backoff_before_it_is_leased_again(tmp_path):
    """A consumer that died holding a message: its lease runs out, then the message waits
    the queue's delay (Artemis applies the delay to every cancelled delivery)."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare("jobs", redelivery_delay=300)
    table.publish("jobs", ["a", "b"])
    # A lease of minutes, so the other consumer's first lease finds it still held however
    # slow the machine; then it is made to run out now (extend: ``period`` from now).
    first = table.lease("jobs", "dies", max_messages=1, lease_period="10 minutes")
    assert table.lease("jobs", "other", max_messages=10).column("body").to_pylist() == [b"b"]
    assert table.extend("jobs", first.column("seq").to_pylist(), "dies", 1) == 1
    until = QueueStore(table.path).snapshot().states["jobs"].leases.until[0]
    again, at = _lease_when_due(table, "jobs", "other")
    assert again.column("seq").to_pylist() == first.column("seq").to_pylist()
    assert again.column("delivery_count").to_pylist() == [2]
    assert at >= until + 300_000


def test_jetstream_nak_with_delay_overrides_the_queue_backoff(tmp_path):
    """JetStream ``NakWithDelay``: this message comes back after the given delay; a delay
    of 0 returns it at once even where the queue has a backoff."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare("plain")
    table.declare("slow", redelivery_delay="1 hour")
    table.publish("plain", ["a"])
    table.publish("slow", ["b"])
    seq = table.lease("plain", "w")["seq"][0].as_py()
    before = now_micros()
    table.cancel("plain", [seq], "w", delay="250ms")
    after = now_micros()
    due = _due_of(table, "plain")[seq]
    assert before + 250_000 <= due <= after + 250_000
    # Polled from at once: a lease that delivered before ``due`` would end before it (no
    # "not yet" check of its own, which a slow machine could overrun).
    _, at = _lease_when_due(table, "plain")
    assert at >= due
    seq = table.lease("slow", "w")["seq"][0].as_py()
    table.cancel("slow", [seq], "w", delay=0)
    assert table.lease("slow", "w").column("delivery_count").to_pylist() == [2]


def test_a_release_hands_work_over_at_once(tmp_path):
    """A consumer that closes returns its messages ready (Artemis consumer close); the
    backoff is for failures."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare("jobs", redelivery_delay="1 hour")
    table.publish("jobs", ["a", "b"])
    table.lease("jobs", "closing")
    assert table.release("jobs", consumer="closing") == 2
    assert table.lease("jobs", "next").column("body").to_pylist() == [b"a", b"b"]


def test_delivery_limit_kills_without_waiting_out_a_delay(tmp_path):
    table = QueueTable(str(tmp_path / "q"))
    table.declare("jobs", redelivery_delay="1 hour", max_deliveries=1, dead_letter_queue="dlq")
    table.publish("jobs", ["poison"])
    seq = table.lease("jobs", "w")["seq"][0].as_py()
    table.cancel("jobs", [seq], "w")
    stats = table.stats("jobs")
    assert (stats["killed"], stats["scheduled"], stats["dead_lettered"]) == (1, 0, 1)
    assert table.peek("dlq").column("death_reason").to_pylist() == ["delivery_limit"]


def test_a_waiting_message_that_falls_due_in_a_full_ring_replaces_itself(tmp_path):
    """Artemis: a scheduled message that falls due into a full ring is removed itself."""
    table = QueueTable(str(tmp_path / "q"))
    table.declare("ring", ring_size=1, redelivery_delay=100)
    table.publish("ring", ["a"])
    seq = table.lease("ring", "w")["seq"][0].as_py()
    table.cancel("ring", [seq], "w")
    table.publish("ring", ["b"])  # the ring's one place is taken meanwhile
    time.sleep(0.15)
    assert table.peek("ring").column("body").to_pylist() == [b"b"]
    stats = table.stats("ring")
    assert (stats["replaced"], stats["ready"], stats["scheduled"]) == (1, 1, 0)
    assert identity_holds(stats)


def test_backoff_arguments_come_from_policies(tmp_path):
    policies_file = tmp_path / "policies.toml"
    policies_file.write_text(
        '[policy.slow]\nmatch = "jobs.#"\ndefault-redelivery-delay = "2s"\n'
        'default-redelivery-multiplier = 3\ndefault-max-redelivery-delay = "1 minute"\n'
    )
    table = QueueTable(str(tmp_path / "q"), policies=load_policies(str(policies_file)))
    table.declare("jobs.a")
    arguments = table.arguments("jobs.a")
    assert (
        arguments.redelivery_delay,
        arguments.redelivery_multiplier,
        arguments.max_redelivery_delay,
    ) == (2000, 3.0, 60_000)


@pytest.mark.parametrize(
    ("argument", "value", "named"),
    [
        ("redelivery_delay", "soon", "redelivery_delay"),
        ("redelivery_delay", -5, "redelivery_delay"),
        ("redelivery_multiplier", 0.5, "redelivery_multiplier"),
        ("redelivery_multiplier", "fast", "redelivery_multiplier"),
        ("max_redelivery_delay", "later", "max_redelivery_delay"),
    ],
)
def test_bad_backoff_arguments_name_the_argument_and_write_nothing(
    tmp_path, argument, value, named
):
    table = QueueTable(str(tmp_path / "q"))
    table.declare("other")
    version = DeltaTable(table.path).version()
    with pytest.raises(InvalidOptionError, match=named):
        table.declare("jobs", **{argument: value})
    assert DeltaTable(table.path).version() == version
    assert table.queues() == ["other"]


def test_a_bad_nack_delay_names_it_and_writes_nothing(tmp_path):
    table = QueueTable(str(tmp_path / "q"))
    table.declare("jobs")
    table.publish("jobs", ["a"])
    seq = table.lease("jobs", "w")["seq"][0].as_py()
    version = DeltaTable(table.path).version()
    with pytest.raises(InvalidOptionError, match="delay"):
        table.cancel("jobs", [seq], "w", delay="whenever")
    assert DeltaTable(table.path).version() == version


def test_cli_declares_a_backoff_and_nacks_with_a_delay(tmp_path, capsys):
    path = str(tmp_path / "q")
    assert cli_main(["--path", path, "declare", "jobs", "--redelivery-delay", "5s"]) == 0
    table = QueueTable(path)
    assert table.arguments("jobs").redelivery_delay == 5000
    table.publish("jobs", ["a"])
    seq = table.lease("jobs", "w")["seq"][0].as_py()
    before = now_micros()
    assert cli_main(["--path", path, "cancel", "jobs", str(seq), "--delay", "1 minute"]) == 0
    assert "cancelled 1" in capsys.readouterr().out
    assert _due_of(table, "jobs")[seq] >= before + 60_000_000
    assert cli_main(["--path", path, "declare", "bad", "--redelivery-multiplier", "0"]) != 0
    assert "--redelivery-multiplier must be a finite number >= 1" in capsys.readouterr().err
    assert table.queues() == ["jobs"]


def test_a_streaming_consumer_gets_the_queue_backoff_without_options(spark, tmp_path: Path):
    """A message a streaming consumer leased and then cancelled (``ackMode=manual``) comes
    back after the queue's delay, no earlier, with its delivery count; so does one whose
    lease ran out. The consumer sets no option for it.

    "No earlier" is checked on a queue whose delay is minutes (a Spark query on a loaded
    machine can take seconds), "comes back" on one whose delay is half a second, waited out
    by the clock."""
    path = str(tmp_path / "q")
    table = QueueTable(path)
    table.declare("slow", redelivery_delay="10 minutes")
    table.declare("fast", redelivery_delay="500ms")
    table.publish("slow", ["a", "b"])
    table.publish("fast", ["c"])

    def run(queue: str) -> list[tuple[int, int]]:
        out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"
        consume(
            spark,
            path,
            out,
            Path(f"{out}-checkpoint"),
            queue,
            columns=("seq", "delivery_count"),
            consumer="stream",
            ackMode="manual",
            leasePeriod="10 minutes",  # still held whenever the test ends the lease
        )
        seqs, counts = output_columns(out, "seq", "delivery_count")
        return sorted(zip(seqs, counts, strict=True))

    (a, first_a), (b, first_b) = run("slow")
    assert (first_a, first_b) == (1, 1)
    before = now_micros()
    assert table.cancel("slow", [a], "stream") == 1  # cancelled: waits the queue's delay
    after = now_micros()
    assert table.extend("slow", [b], "stream", 1) == 1  # b's lease runs out now
    until = QueueStore(path).snapshot().states["slow"].leases.until[0]
    wait_past(until)
    assert run("slow") == []  # neither is delivered before its time
    due = _due_of(table, "slow")  # the stored state: scheduled until then
    assert before + 600_000_000 <= due[a] <= after + 600_000_000
    assert due[b] >= until + 600_000_000  # the lease ran out: it waits the delay too
    stats = table.stats("slow")
    assert (stats["scheduled"], stats["leased"], stats["ready"]) == (2, 0, 0)

    ((c, first_c),) = run("fast")
    assert first_c == 1
    before = now_micros()
    assert table.cancel("fast", [c], "stream") == 1
    due_c = _due_of(table, "fast")[c]
    assert due_c >= before + 500_000
    wait_past(due_c)
    second = run("fast")
    assert second == [(c, 2)]
    expected = spark.createDataFrame([(c, 2)], "seq long, delivery_count int")
    actual = spark.createDataFrame(second, "seq long, delivery_count int")
    assert_df_equality(actual, expected)
