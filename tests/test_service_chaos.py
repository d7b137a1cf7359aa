"""Chaos for the service clients and the broker, without Spark.

Two ``Publisher`` processes and two ``Consumer`` processes (tests/drivers/service_client.py)
share queue ``jobs`` through the table's broker, and one process at a time is killed at
random moments (drawn from the test's seed) and started again: a client with SIGKILL, the
broker with SIGKILL or SIGTERM; a broker that is gone is started again at the next draw, so
the clients also run stretches with no broker (committing directly) and move from one
broker to the next.

Phases, so that each guarantee is checked on work that happened by construction:

1. no kills until the broker has served requests and both kinds of client have done work;
2. chaos;
3. the kills stop, a broker runs, the publishers finish, the consumers drain and exit.

Then: nothing a publisher was told had landed is lost, and every message enqueued was
delivered and acknowledged; a message is delivered again only with a higher delivery count
(its lease ran out) and only as often as the consumer kills explain (each holds at most
``MAX_PREFETCH`` messages and ``2 * ACK_BATCH`` acknowledgements not yet flushed) and the
SIGKILLs of the broker (a lease it committed without answering); a message is enqueued
twice only as the publisher kills (one window each) and the broker's SIGKILLs (a publish it
committed without answering, run again directly: at-least-once, docs/BROKER.md) explain;
the counter identity holds. It prints one summary line.

A long run, by hand::

    SPARK_QUEUE_CHAOS_SECONDS=600 SPARK_QUEUE_TEST_SEED=random \
        .venv/bin/python -m pytest -s tests/test_service_chaos.py
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from spark_queue import QueueTable
from spark_queue.rules import identity_holds
from tests.brokers import BrokerProcess, wait_until
from tests.drivers.service_client import ACK_BATCH, MAX_PREFETCH, QUEUE, WINDOW

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "drivers" / "service_client.py"
SECONDS = float(os.environ.get("SPARK_QUEUE_CHAOS_SECONDS", "20"))
PUBLISHERS, CONSUMERS, COUNT = 2, 2, 600
DRAIN_TIMEOUT = 600.0  # seconds: phase 3 on a loaded machine, generously


def start(tmp_path: Path, *args: object) -> subprocess.Popen:
    """The driver with ``args``, in a session of its own, logging to a file of its own."""
    log = open(tmp_path / f"client-{time.monotonic_ns()}.log", "w")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, str(DRIVER), *map(str, args)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def lines(path: Path, kind: str) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split()[1:] for line in path.read_text().splitlines() if line.startswith(kind)]


def test_service_clients_and_brokers_killed_at_random_lose_nothing(tmp_path, seed):
    rng = random.Random(seed)
    path = str(tmp_path / "queues")
    QueueTable(path, broker="off").declare(QUEUE)
    stop = tmp_path / "stop"
    roles: dict[str, tuple] = {}
    for n in range(PUBLISHERS):
        roles[f"publisher {n}"] = ("publish", path, tmp_path / f"p{n}.txt", f"p{n}", COUNT)
    for n in range(CONSUMERS):
        roles[f"consumer {n}"] = ("consume", path, tmp_path / f"c{n}.txt", f"c{n}", stop)
    running: dict[str, subprocess.Popen] = {}
    finished: set[str] = set()
    kills: Counter[str] = Counter()
    brokers = [BrokerProcess(path, log_path=tmp_path / "broker-0.log")]

    def tend(kill_now: str | None = None) -> None:
        """Kill ``kill_now`` if it runs; start again every client that is not running,
        except a publisher that finished (exit 0)."""
        for role, args in roles.items():
            process = running.get(role)
            if process is not None and process.poll() is None:
                if role != kill_now:
                    continue
                kill(process)
                kills[role.split()[0]] += 1
            elif process is not None:
                assert process.returncode in (0, -signal.SIGKILL), f"{role} failed"
                if process.returncode == 0 and role.startswith("publisher"):
                    finished.add(role)
            if role not in finished:
                running[role] = start(tmp_path, *args)

    def broker_running() -> BrokerProcess | None:
        last = brokers[-1]
        return last if last.process.poll() is None else None

    def start_broker() -> BrokerProcess:
        broker = BrokerProcess(path, log_path=tmp_path / f"broker-{len(brokers)}.log")
        brokers.append(broker)
        return broker

    def delivered() -> list[list[str]]:
        return [d for n in range(CONSUMERS) for d in lines(tmp_path / f"c{n}.txt", "D ")]

    try:
        # Phase 1: no kills until the broker served and both kinds of client did work.
        tend()
        wait_until(
            lambda: (
                brokers[0].status()["served"] > 0
                and lines(tmp_path / "p0.txt", "P ")
                and delivered()
            ),
            timeout=DRAIN_TIMEOUT,
            what="the broker and both kinds of client at work",
        )
        # Phase 2: chaos.
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(1, 4))
            victim = rng.choice([*roles, "broker"])
            if victim != "broker":
                tend(kill_now=victim)
                continue
            broker = broker_running()
            if broker is None:
                start_broker()
            elif rng.random() < 0.5:
                broker.kill()
                kills["broker kill -9"] += 1
            else:
                assert broker.stop() == 0
                kills["broker SIGTERM"] += 1
            tend()
        # Phase 3: no more kills; a broker runs; the publishers finish, the consumers drain.
        broker = broker_running() or start_broker()
        give_up = time.monotonic() + DRAIN_TIMEOUT
        while len(finished) < PUBLISHERS:
            assert time.monotonic() < give_up, "the publishers did not finish"
            time.sleep(0.5)
            tend()
        stop.touch()
        for n in range(CONSUMERS):
            assert running[f"consumer {n}"].wait(timeout=DRAIN_TIMEOUT) == 0
        served = broker.status()["served"]
        assert broker.stop() == 0
    finally:
        for process in running.values():
            if process.poll() is None:
                kill(process)
        for broker in brokers:
            if broker.process.poll() is None:
                broker.kill()

    published = {body for n in range(PUBLISHERS) for (body,) in lines(tmp_path / f"p{n}.txt", "P ")}
    deliveries: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for body, seq, count in delivered():
        deliveries[int(seq)].append((body, int(count)))
    seqs_of: dict[str, set[int]] = defaultdict(set)
    for seq, seen in deliveries.items():
        assert len({body for body, _ in seen}) == 1, f"seq {seq} carried two bodies"
        counts = [count for _, count in seen]
        assert len(counts) == len(set(counts)), f"seq {seq} delivered twice with one count"
        seqs_of[seen[0][0]].add(seq)
    lost = published - set(seqs_of)
    repeats = sum(len(seen) - 1 for seen in deliveries.values())
    enqueued_twice = sum(len(seqs) - 1 for seqs in seqs_of.values())
    stats = QueueTable(path, broker="off").stats(QUEUE)
    print(
        f"\nservice chaos: seed {seed}, {SECONDS:g} s, published {len(published)}, "
        f"delivered {sum(len(s) for s in deliveries.values())}, lost {len(lost)}, repeats "
        f"{repeats}, enqueued twice {enqueued_twice}, kills {sum(kills.values())} "
        f"({dict(kills)}), brokers {len(brokers)}, the last served {served}, identity "
        f"{'holds' if identity_holds(stats) else 'broken'}"
    )
    assert published == {f"p{n}-{i:05d}" for n in range(PUBLISHERS) for i in range(COUNT)}
    assert not lost, f"lost {len(lost)}: {sorted(lost)[:10]}"
    assert stats["added"] == len(deliveries) == stats["acked"]  # each enqueued one delivered
    assert (stats["ready"], stats["leased"], stats["scheduled"]) == (0, 0, 0)
    assert identity_holds(stats)
    broker_kills = kills["broker kill -9"]
    assert repeats <= (
        kills["consumer"] * (MAX_PREFETCH + 2 * ACK_BATCH) + broker_kills * CONSUMERS * MAX_PREFETCH
    )
    assert enqueued_twice <= (kills["publisher"] + broker_kills * PUBLISHERS) * WINDOW
