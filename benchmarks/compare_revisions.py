"""One benchmark's short configuration on two checkouts of spark-queue, side by side in one run.

Runs alternate between the checkouts (old, new, old, new, ...), so that what else loads the
machine weighs on both alike. Each run is a subprocess of this Python with ``PYTHONPATH`` set
to its checkout and that checkout's own copy of the benchmark script (the scripts follow the
API they measure), started in the checkout. The figures of each run are read from the
script's JSON results (``--out``) or from the Markdown rows it prints; reported are each
figure's median per checkout, the ratio new / old of the medians, and the range of the
ratios of the pairs (run i of new against run i of old), with the load average (1 minute)
before each run.

    .venv/bin/python benchmarks/compare_revisions.py OLD_CHECKOUT [--new NEW_CHECKOUT]
        [--runs 3] [--lock /tmp/spark-tests.lock] sink consumer clients ...

``OLD_CHECKOUT`` is a git worktree of the older commit (``git worktree add /tmp/old
f21ac44``) with the ``jars`` the Spark benchmarks need; ``--new`` defaults to this checkout.
``--lock`` names a file locked (``flock``) for the span of each run of a Spark benchmark, so
that only one Spark job runs at a time on a shared machine. Results go to
``benchmarks/out/compare-<benchmark>.json``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from common import ROOT, median, progress, write_results

Figures = dict[str, float]
Table = tuple[list[str], list[list[str]]]  # a Markdown table's header cells and rows


@dataclass(frozen=True)
class Benchmark:
    """A benchmark's short configuration: its script, arguments, whether it starts Spark,
    whether it takes ``--out`` (a JSON results file), and how to read its figures from its
    printed output and that JSON."""

    script: str
    arguments: tuple[str, ...]
    spark: bool
    takes_out: bool
    figures: Callable[[str, dict[str, Any]], Figures]


# -- reading a run's figures --------------------------------------------------------------------


def markdown_tables(text: str) -> list[Table]:
    """The Markdown tables in ``text``: each header's cells and its rows' cells."""
    tables: list[Table] = []
    lines = [line.strip() for line in text.splitlines()]
    for index, line in enumerate(lines[:-1]):
        if line.startswith("|") and lines[index + 1].startswith("|---"):
            rows = []
            for row in lines[index + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(cells(row))
            tables.append((cells(line), rows))
    return tables


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def number(cell: str) -> float:
    """``"12,345"`` -> 12345.0; the first number of a cell such as ``"0.88 (5)"``."""
    found = re.search(r"-?[\d,]*\.?\d+", cell)
    if found is None:
        raise ValueError(f"no number in table cell {cell!r}")
    return float(found.group().replace(",", ""))


def rows_of(text: str, header_start: str) -> list[list[str]]:
    """The rows of every table whose first header cell starts with ``header_start``."""
    found = [rows for header, rows in markdown_tables(text) if header[0].startswith(header_start)]
    if not found:
        raise ValueError(f"no table headed {header_start!r} in the benchmark's output")
    return [row for rows in found for row in rows]


def sink_figures(_: str, out: dict[str, Any]) -> Figures:
    throughput = out["throughput"][0]
    rate = throughput["messages_per_second"]
    figures = {
        "ringqueue sink msg/s": rate["ringqueue"],
        "delta sink msg/s": rate["delta"],
        "ringqueue / delta": throughput["ratio_ringqueue_to_delta"],
    }
    if "creep" in out:
        figures["batch write ms (median)"] = median(out["creep"]["batch_seconds"]) * 1000
    return figures


def consumer_figures(_: str, out: dict[str, Any]) -> Figures:
    (measured,) = out["throughput"]["sizes"].values()
    best = measured["best"]
    return {
        "ringqueue read s": best["ringqueue"],
        "delta read s": best["delta"],
        "parquet-rows read s": best["parquet-rows"],
        "ringqueue / delta": measured["ratio"],
        "ringqueue / delta inside micro-batches": measured["ratio_in_batches"],
    }


def clients_figures(text: str, _: dict[str, Any]) -> Figures:
    figures = {
        f"workers {row[0]} drain, {row[1]} msg/s": number(row[4])
        for row in rows_of(text, "workers W, drain")
    }
    for row in rows_of(text, "raw `lease"):
        figures[f"raw lease+ack {row[0]}, {row[1]} msg/s"] = number(row[2])
    return figures


def publishers_figures(text: str, _: dict[str, Any]) -> Figures:
    return {
        f"{row[0].split(' (')[0]} x{row[1]}, {row[2]} msg/s": number(row[3])
        for row in rows_of(text, "single-message publish calls")
    }


def producers_figures(text: str, _: dict[str, Any]) -> Figures:
    return {
        f"{row[0]} producers, {row[1]} msg/s": number(row[2])
        for row in rows_of(text, "producers")
        if not row[1].startswith("ratio")
    }


def sqs_figures(text: str, _: dict[str, Any]) -> Figures:
    figures: Figures = {}
    for row in rows_of(text, "shape"):
        figures[f"{row[0]}, Flight msg/s"] = number(row[2])
        figures[f"{row[0]}, SQS msg/s"] = number(row[3])
    wake = re.search(r"wake p50 ([\d.]+) ms", text)
    if wake is None:
        raise ValueError("no long poll line in bench_sqs.py's output")
    figures["long poll wake p50 ms"] = float(wake.group(1))
    return figures


def latency_figures(text: str, _: dict[str, Any]) -> Figures:
    since_return = text.split("latency from the write call's return", 1)[1]
    header, rows = markdown_tables(since_return)[0]
    assert header[0] == "pipeline", header
    figures: Figures = {}
    for row in rows:
        if not row[0].startswith("ratio"):
            figures[f"{row[0]} p50 s"] = number(row[3])
            figures[f"{row[0]} p90 s"] = number(row[4])
    return figures


def source_steps_figures(text: str, _: dict[str, Any]) -> Figures:
    return {f"{row[0].split(' (')[0]} p50 ms": number(row[1]) for row in rows_of(text, "step")}


# Short configurations: each run a few minutes at most on two cores.
BENCHMARKS: dict[str, Benchmark] = {
    "sink": Benchmark(
        "bench_sink.py",
        (
            *("--sections", "throughput,creep", "--body-sizes", "200", "--messages", "500000"),
            *("--repeats", "2", "--creep-batches", "100", "--creep-window", "20"),
        ),
        spark=True,
        takes_out=True,
        figures=sink_figures,
    ),
    "consumer": Benchmark(
        "bench_consumer.py",
        ("--sections", "throughput", "--messages", "1000000", "--repeats", "2"),
        spark=True,
        takes_out=True,
        figures=consumer_figures,
    ),
    "clients": Benchmark(
        "bench_clients.py",
        ("--only", "workers", "raw", "--workers", "4", "--messages", "20000", "--seconds", "5"),
        spark=False,
        takes_out=False,
        figures=clients_figures,
    ),
    "publishers": Benchmark(
        "bench_clients.py",
        ("--only", "publishers", "--publishers", "32", "--seconds", "5"),
        spark=False,
        takes_out=False,
        figures=publishers_figures,
    ),
    "producers": Benchmark(
        "bench_producers.py",
        ("--producers", "4", "--batches", "10", "--messages", "1000", "--repeats", "1"),
        spark=False,
        takes_out=False,
        figures=producers_figures,
    ),
    "sqs": Benchmark(
        "bench_sqs.py",
        ("--workers", "4", "--seconds", "5", "--messages", "20000", "--polls", "5"),
        spark=False,
        takes_out=False,
        figures=sqs_figures,
    ),
    "latency": Benchmark(
        "bench_latency.py",
        ("--seconds", "15", "--turns", "1"),
        spark=True,
        takes_out=False,
        figures=latency_figures,
    ),
    "source-steps": Benchmark(
        "bench_latency.py",
        ("--source-steps",),
        spark=False,
        takes_out=False,
        figures=source_steps_figures,
    ),
}


# -- running ------------------------------------------------------------------------------------


def revision(checkout: Path) -> str:
    """The checkout's short commit, with ``+changes`` if its tracked files differ from it."""
    commit = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return f"{commit}+changes" if changed else commit


def check_imports(checkout: Path) -> None:
    """Fail unless ``PYTHONPATH=checkout`` imports that checkout's ``spark_queue``."""
    found = subprocess.run(
        [sys.executable, "-c", "import spark_queue; print(spark_queue.__file__)"],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(checkout):
        raise SystemExit(f"PYTHONPATH={checkout} imports spark_queue from {found}")


@contextmanager
def locked(path: str | None) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for the block (none for ``None``)."""
    if path is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_once(benchmark: Benchmark, checkout: Path, lock: str | None) -> dict[str, Any]:
    """One run of ``benchmark`` on ``checkout``: its figures, seconds and load averages."""
    with tempfile.TemporaryDirectory(prefix="compare-revisions-") as folder:
        out = Path(folder) / "results.json"
        command = [sys.executable, str(checkout / "benchmarks" / benchmark.script)]
        command += [*benchmark.arguments, *(["--out", str(out)] if benchmark.takes_out else [])]
        with locked(lock if benchmark.spark else None):
            load_before = os.getloadavg()[0]
            started = time.perf_counter()
            finished = subprocess.run(
                command,
                cwd=checkout,
                env={**os.environ, "PYTHONPATH": str(checkout)},
                capture_output=True,
                text=True,
            )
            seconds = time.perf_counter() - started
            load_after = os.getloadavg()[0]
        if finished.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} exited {finished.returncode}:\n{finished.stderr[-4000:]}"
            )
        results = json.loads(out.read_text()) if benchmark.takes_out else {}
    return {
        "figures": benchmark.figures(finished.stdout, results),
        "seconds": round(seconds, 1),
        "load": [round(load_before, 2), round(load_after, 2)],
        "output": finished.stdout,
    }


def compare(
    name: str, benchmark: Benchmark, checkouts: dict[str, Path], runs: int, lock: str | None
) -> dict[str, Any]:
    """``runs`` runs of ``benchmark`` on each checkout, alternating, and their summary."""
    measured: dict[str, list[dict[str, Any]]] = {side: [] for side in checkouts}
    for index in range(runs):
        for side, checkout in checkouts.items():
            run = run_once(benchmark, checkout, lock)
            measured[side].append(run)
            progress(
                f"{name} {side} run {index + 1}/{runs}: {run['seconds']:.0f} s, "
                f"load {run['load'][0]:.1f}"
            )
    old, new = (measured[side] for side in checkouts)
    summary = {}
    for figure in old[0]["figures"]:
        olds = [run["figures"][figure] for run in old]
        news = [run["figures"][figure] for run in new]
        pairs = [n / o for o, n in zip(olds, news, strict=True) if o]
        summary[figure] = {
            "old": olds,
            "new": news,
            "old_median": median(olds),
            "new_median": median(news),
            "ratio": median(news) / median(olds) if median(olds) else float("nan"),
            "ratio_range": [min(pairs), max(pairs)] if pairs else [],
        }
    loads = [load for runs_ in measured.values() for run in runs_ for load in run["load"]]
    return {
        "benchmark": name,
        "script": benchmark.script,
        "arguments": list(benchmark.arguments),
        "revisions": {side: revision(checkout) for side, checkout in checkouts.items()},
        "runs": measured,
        "figures": summary,
        "load_range": [min(loads), max(loads)],
    }


def shown(value: float) -> str:
    """A figure for a table: whole above 100 (``12,345``), else three significant digits."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def markdown(result: dict[str, Any]) -> str:
    old, new = result["revisions"]["old"], result["revisions"]["new"]
    low, high = result["load_range"]
    lines = [
        f"\n{result['benchmark']}: {result['script']} {' '.join(result['arguments'])}",
        f"| figure | old {old} | new {new} | new / old | pairs | load |",
        "|---|---|---|---|---|---|",
    ]
    for figure, value in result["figures"].items():
        pairs = "-".join(f"{ratio:.2f}" for ratio in value["ratio_range"])
        lines.append(
            f"| {figure} | {shown(value['old_median'])} | {shown(value['new_median'])} | "
            f"{value['ratio']:.2f} | {pairs} | {low:.1f}-{high:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="checkout of the older commit")
    parser.add_argument("--new", type=Path, default=ROOT, help="default: this checkout")
    parser.add_argument("--runs", type=int, default=3, help="runs of each checkout")
    parser.add_argument("--lock", help="a file to flock for the span of each Spark run")
    parser.add_argument(
        "--arguments",
        type=shlex.split,
        help="the script's arguments instead of the benchmark's own, as one string "
        "(with one benchmark)",
    )
    parser.add_argument("benchmarks", nargs="+", choices=sorted(BENCHMARKS))
    args = parser.parse_args()
    if args.arguments is not None and len(args.benchmarks) != 1:
        parser.error("--arguments goes with one benchmark")
    checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
    for checkout in checkouts.values():
        check_imports(checkout)
    for name in args.benchmarks:
        benchmark = BENCHMARKS[name]
        if args.arguments is not None:
            benchmark = replace(benchmark, arguments=tuple(args.arguments))
        result = compare(name, benchmark, checkouts, args.runs, args.lock)
        write_results(f"compare-{name}.json", result, show=False)
        print(markdown(result), flush=True)


if __name__ == "__main__":
    main()
