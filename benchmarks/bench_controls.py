"""What the consumer controls cost (docs/BENCHMARKS.md, "Consumer controls").

Two measurements, each side by side in one run:

- **groups**: leasing (and acknowledging) batches of 200,000 from a queue whose 1,200,000
  messages fall in 100,000 message groups (``message_groups=true``), against the same messages in a
  queue without groups, in one table, alternating. Goal: at most 1.5x.
- **untouched**: a queue that uses neither redelivery backoff nor exclusivity, published to,
  leased and acknowledged by this build and by the build before both existed (commit
  ``1e927f9``, exported with ``git archive``), in alternating subprocesses. Goal: nothing
  measurable, that is a ratio within the run-to-run spread.

    .venv/bin/python benchmarks/bench_controls.py [--depth 1000000] [--groups 100000]
        [--batch 200000] [--repeats 5] [--baseline 1e927f9]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from common import ROOT, median, write_results


def keyed_rows(count: int, groups: int) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([f"group-{i % groups}" for i in range(count)], pa.string()),
            "body": pa.array([os.urandom(100) for _ in range(count)], pa.binary()),
        }
    )


def lease_and_ack(table: Any, queue: str, batch: int) -> tuple[float, float]:
    started = time.perf_counter()
    leased = table.lease(queue, "bench", max_messages=batch)
    leased_at = time.perf_counter()
    table.ack(queue, leased.column("seq").to_pylist(), "bench")
    assert leased.num_rows == batch, leased.num_rows
    return leased_at - started, time.perf_counter() - leased_at


def groups_run(depth: int, groups: int, batch: int, repeats: int) -> dict:
    from spark_queue import QueueTable

    folder = tempfile.mkdtemp(prefix="bench-groups-")
    table = QueueTable(f"{folder}/queues")
    table.declare("plain")
    table.declare("grouped", message_groups=True)
    for queue in ("plain", "grouped"):
        table.publish(queue, keyed_rows(depth, groups))
    times: dict[str, list[tuple[float, float]]] = {"plain": [], "grouped": []}
    lease_and_ack(table, "plain", batch)  # warm: caches, first reads
    lease_and_ack(table, "grouped", batch)
    for round_ in range(repeats):
        order = ("plain", "grouped") if round_ % 2 == 0 else ("grouped", "plain")
        for queue in order:
            times[queue].append(lease_and_ack(table, queue, batch))
    held = table.stats("grouped")
    result = {
        queue: {
            "lease_s": median([t[0] for t in runs]),
            "ack_s": median([t[1] for t in runs]),
            "leases_s": [round(t[0], 3) for t in runs],
        }
        for queue, runs in times.items()
    }
    result["lease_ratio"] = result["grouped"]["lease_s"] / result["plain"]["lease_s"]
    result["lease_and_ack_ratio"] = (result["grouped"]["lease_s"] + result["grouped"]["ack_s"]) / (
        result["plain"]["lease_s"] + result["plain"]["ack_s"]
    )
    result["identity_holds_after"] = held["acked"] == batch * (repeats + 1)
    return result


def untouched_worker(build: str, batch: int) -> None:
    """One cycle of a queue without backoff or exclusivity, on ``build``'s package."""
    sys.path.insert(0, build)
    from spark_queue import QueueTable

    assert Path(sys.modules["spark_queue"].__file__).is_relative_to(build)
    folder = tempfile.mkdtemp(prefix="bench-untouched-")
    table = QueueTable(f"{folder}/queues")
    table.declare("q")
    body = pa.table({"body": pa.array([os.urandom(100) for _ in range(batch)], pa.binary())})
    table.publish("q", body)  # warm
    lease_and_ack(table, "q", batch)
    started = time.perf_counter()
    table.publish("q", body)
    published = time.perf_counter() - started
    leased, acked = lease_and_ack(table, "q", batch)
    print(json.dumps({"publish_s": published, "lease_s": leased, "ack_s": acked}))


def untouched_run(baseline: str, batch: int, repeats: int) -> dict:
    export = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", baseline, "spark_queue"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(export)], input=archive, check=True)
    builds = {"this build": str(ROOT), f"before ({baseline})": str(export)}
    runs: dict[str, list[dict]] = {name: [] for name in builds}
    for round_ in range(repeats):
        names = list(builds) if round_ % 2 == 0 else list(reversed(builds))
        for name in names:
            output = subprocess.run(
                [sys.executable, __file__, "--worker", builds[name], "--batch", str(batch)],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": builds[name]},
            ).stdout
            runs[name].append(json.loads(output.strip().splitlines()[-1]))
    result: dict = {}
    for name, measured in runs.items():
        result[name] = {
            key: median([m[key] for m in measured]) for key in ("publish_s", "lease_s", "ack_s")
        }
        result[name]["cycle_s"] = [
            round(m["publish_s"] + m["lease_s"] + m["ack_s"], 3) for m in measured
        ]
    this, before = (result[name] for name in builds)
    result["ratios"] = {k: this[k] / before[k] for k in ("publish_s", "lease_s", "ack_s")}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, help="default: enough for every batch")
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", default="1e927f9")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        untouched_worker(args.worker, args.batch)
        return
    depth = args.depth or args.batch * (args.repeats + 1)
    results = {
        "groups": groups_run(depth, args.groups, args.batch, args.repeats),
        "untouched": untouched_run(args.baseline, args.batch, args.repeats),
    }
    write_results("controls.json", results)


if __name__ == "__main__":
    main()
