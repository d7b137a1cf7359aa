"""Maintain a queue table: expire, compact, vacuum, then print every queue's stats.

Steps (``--steps``, run in this order; all by default):

- ``expire``: settle each queue now. Leases whose ``leasePeriod`` ran out go back to their
  queue (``delivery_count`` + 1; killed and dead-lettered at ``maxDeliveries``), scheduled
  messages that fell due join the ready messages (under ``ring``, one that does not fit is
  replaced), and a ``drop-head`` queue over its limits is trimmed. A queue with nothing due
  is not touched (no commit). Ready messages past their ``expires_at`` or the queue's
  ``expiration`` are not swept here: they are removed as ``expired`` when a consumer reaches
  them, and are never delivered.
- ``compact``: rewrite small message and removal files (``QueueTable.compact``).
- ``vacuum``: delete the table's files no version within ``--retention-hours`` references
  (``QueueTable.vacuum(dry_run=False)``: never another file in its folder); ``--dry-run``
  lists them without deleting. Time travel to versions older than the retention stops working.
- ``stats``: one row per queue (gauges and counters), or with ``--json`` everything this run
  did as one JSON document.

The table is changed only through spark-queue (delta-rs), never by a Spark ``OPTIMIZE`` or
``VACUUM``; each step is safe while producers and consumers run (a producer that commits
first makes the step try again or wait for the next run). No SparkSession is started, so it
runs as ``python jobs/maintain.py`` or as a spark-submit job's driver alike.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import common  # puts spark_queue on the path when run from a checkout

from spark_queue import COUNTERS, GAUGES, QueueError, QueueTable

STEPS = ("expire", "compact", "vacuum", "stats")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maintain.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--path",
        type=common.table_location,
        required=True,
        help="queue table location (path or URI)",
    )
    common.add_storage_options(parser)
    parser.add_argument(
        "--queue",
        action="append",
        help="a queue to expire and show (repeat for more; default: every queue). Compact "
        "and vacuum always cover the whole table",
    )
    parser.add_argument(
        "--steps",
        default=",".join(STEPS),
        help=f"comma-separated steps, from {', '.join(STEPS)} (default: %(default)s)",
    )
    parser.add_argument(
        "--retention-hours",
        type=float,
        default=168.0,
        help="vacuum keeps files referenced by versions younger than this (default: "
        "%(default)s, a week)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="vacuum only lists the files it would delete"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the flags; a bad value exits with status 2 naming the flag."""
    parser = build_parser()
    args = parser.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown or not steps:
        parser.error(f"--steps: unknown {unknown or 'empty list'}; valid: {', '.join(STEPS)}")
    args.steps = [s for s in STEPS if s in steps]
    if args.retention_hours < 0:
        parser.error(f"--retention-hours must be >= 0, got {args.retention_hours}")
    return args


def expire(table: QueueTable, name: str) -> dict[str, int]:
    """Settle ``name`` if a lease ran out or a scheduled message fell due; returns how many.

    QueueTable has no settle call of its own: ``alter`` with no arguments changes none and
    commits the queue settled (the path a limit change takes; every partition of a
    partitioned queue), so it is used for that.
    """
    snapshot = table.store.snapshot()
    state = snapshot.states.get(name) if snapshot is not None else None
    if state is None:
        raise QueueError(f"queue {name!r} does not exist in {table.path}")
    now = time.time_ns() // 1000  # microseconds since the epoch, as the table's times
    states = [state]  # a partitioned queue's: every partition table's
    for partition in range(1, state.arguments.partitions):
        found = table.partitioned.store_of(name, partition).snapshot()
        states += [found.states[name]] if found is not None and name in found.states else []
    leases = sum(int((s.leases.until <= now).sum()) for s in states)
    scheduled = sum(1 for s in states for message in s.scheduled if message.deliver_at <= now)
    if leases or scheduled:
        table.alter(name)
    return {"leases_returned": leases, "scheduled_due": scheduled}


def run(args: argparse.Namespace) -> dict[str, Any]:
    table = QueueTable(args.path, storage_options=common.storage_options(args))
    names = args.queue or table.queues()
    if not names:
        raise QueueError(f"no queues in {table.path}")
    report: dict[str, Any] = {"path": table.path, "steps": args.steps}
    if "expire" in args.steps:
        report["expire"] = {name: expire(table, name) for name in names}
    if "compact" in args.steps:
        report["compact"] = table.compact()
    if "vacuum" in args.steps:
        # The job deletes unless --dry-run: explicit, as QueueTable.vacuum lists by default.
        removed = table.vacuum(retention_hours=args.retention_hours, dry_run=args.dry_run)
        report["vacuum"] = {"dry_run": args.dry_run, "files": removed}
    if "stats" in args.steps:
        report["stats"] = {name: table.stats(name) for name in names}
    return report


def render(report: dict[str, Any]) -> str:
    """The report as text: a line per step, then a table of the queues' stats."""
    lines = [f"queue table {report['path']}"]
    for name, done in report.get("expire", {}).items():
        lines.append(
            f"expire {name}: {done['leases_returned']} leases returned, "
            f"{done['scheduled_due']} scheduled messages due"
        )
    if "compact" in report:
        lines.append("compact: " + ", ".join(f"{k} {v}" for k, v in report["compact"].items()))
    if "vacuum" in report:
        verb = "would delete" if report["vacuum"]["dry_run"] else "deleted"
        lines.append(f"vacuum: {verb} {len(report['vacuum']['files'])} files")
    if "stats" in report:
        columns = ["queue", *GAUGES, *COUNTERS]
        rows = [[name, *(f"{s[c]:,}" for c in columns[1:])] for name, s in report["stats"].items()]
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        for row in [columns, *rows]:
            cells = [
                v.ljust(w) if i == 0 else v.rjust(w)
                for i, (v, w) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except QueueError as error:
        print(f"maintain.py: {error}", file=sys.stderr)
        return 1
    print(json.dumps(report) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
