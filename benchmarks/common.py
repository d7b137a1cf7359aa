"""What the benchmarks share: filling a queue, percentiles and medians, timing, results files,
the environment a run was measured in, and the command-line types of sizes and counts.

Importing it puts this checkout first on ``sys.path``, so a benchmark measures the
``spark_queue`` beside it (``python benchmarks/bench_x.py`` runs from any folder). It imports
no PySpark: the benchmarks without Spark use it too.

Percentiles are **nearest-rank** (:func:`percentile`): the pN of n values is the
``ceil(N/100 * n)``-th smallest, a value that was measured, never one interpolated between
two; with a few values the p99 is their maximum. Medians are :func:`statistics.median`'s
(the mean of the two middle values of an even count): a benchmark's "median of R runs" and
a latency table's p50 column are both :func:`median`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "out"  # results files (git-ignored)
if str(ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(ROOT))

T = TypeVar("T")


# -- a queue to work on -------------------------------------------------------------------------


def fill(
    path: str,
    messages: int,
    *,
    queue: str = "q",
    body_bytes: int = 200,
    storage_options: dict[str, str] | None = None,
    batch: int = 10_000,
) -> None:
    """Publish ``messages`` random bodies of ``body_bytes`` into ``queue`` at ``path``
    (declared first, with no limit), ``batch`` a commit, committing directly (no broker)."""
    from spark_queue import QueueTable

    table = QueueTable(path, storage_options=storage_options, broker="off")
    table.declare(queue)
    for start in range(0, messages, batch):
        table.publish(queue, [os.urandom(body_bytes) for _ in range(min(batch, messages - start))])


def fill_with_spark(spark: Any, bodies: Path, path: Path, queue: str = "bench") -> None:
    """Enqueue the Parquet folder ``bodies`` (a ``body`` column) into ``queue`` at ``path``
    with one Spark batch write of ``format("ringqueue")``: millions of messages in seconds."""
    spark.read.parquet(str(bodies)).write.format("ringqueue").option("queue", queue).mode(
        "append"
    ).save(str(path))


def attempts_by_operation(path: str) -> dict[str, list[int]]:
    """Attempts of each connector commit of the queue table at ``path``, by its operation's
    first word (PUBLISH, CONSUME, ...): what conflicts between writers cost."""
    from deltalake import DeltaTable

    attempts: dict[str, list[int]] = {}
    for commit in DeltaTable(path).history():
        if "spark_queue" in commit:
            info = json.loads(commit["spark_queue"])
            attempts.setdefault(info["operation"].split()[0], []).append(info.get("attempt", 1))
    return attempts


# -- statistics ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile ``fraction`` (0.99 for p99) of ``values``: the smallest
    value with at least that share of ``values`` at or below it (NaN for none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def median(values: Sequence[float]) -> float:
    """:func:`statistics.median` (NaN for none)."""
    return statistics.median(values) if values else float("nan")


# -- timing -------------------------------------------------------------------------------------


def timed(action: Callable[[], T]) -> tuple[float, T]:
    """Seconds ``action`` took (``time.perf_counter``), and what it returned."""
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def median_ms(action: Callable[[], Any], repeats: int) -> float:
    """The median milliseconds of ``repeats`` calls of ``action``, to 0.01 ms."""
    return round(median([timed(action)[0] for _ in range(repeats)]) * 1000, 2)


def progress(message: str) -> None:
    """A timestamped line on stderr: where a long run is."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- results ------------------------------------------------------------------------------------


def write_results(name: str | Path, results: Any, *, show: bool = True) -> Path:
    """Write ``results`` as indented JSON to ``name`` (a file name in :data:`OUT`, or a path),
    print them unless ``show`` is false, and return the file's path."""
    target = Path(name) if isinstance(name, Path) else OUT / name
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=2, default=str)
    target.write_text(text + "\n")
    if show:
        print(text)
    return target


def environment() -> dict[str, Any]:
    """What a run was measured on: versions, the platform, cores, this checkout's commit and
    whether it has uncommitted changes."""
    import deltalake
    import pyarrow

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "deltalake": deltalake.__version__,
        "pyarrow": pyarrow.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        import pyspark

        info["pyspark"] = pyspark.__version__
    except ImportError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        info["git_commit"] = commit
        info["git_dirty"] = bool(dirty)
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


# -- command-line types -------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    """``"200,10240"`` -> ``[200, 10240]`` (positive whole numbers, ``_`` allowed)."""
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers separated by commas: {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive whole numbers: {text!r}")
    return values


def positive_int(text: str) -> int:
    """One positive whole number (``_`` allowed)."""
    values = int_list(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one whole number: {text!r}")
    return values[0]


def fraction(text: str) -> float:
    """A number strictly between 0 and 1."""
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1): {text!r}")
    return value
