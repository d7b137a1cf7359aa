"""The plots of docs/BENCHMARKS.md.

The figures live in ``docs/benchmarks/figures.json`` (one key per plot); a new measurement
changes that file (the page states what the plots do not), then this script draws the PNGs into
``docs/benchmarks/``::

    .venv/bin/python benchmarks/plots.py            # every plot
    .venv/bin/python benchmarks/plots.py --check    # fail if a PNG is missing or stale

matplotlib is in the ``dev`` extra. The PNGs are committed, so the docs build needs neither
this script nor matplotlib.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "docs" / "benchmarks"
FIGURES = FOLDER / "figures.json"
# No creation time or version in the files, so the same figures draw the same bytes.
METADATA = {"Software": None, "Creation Time": None}
THOUSANDS = FuncFormatter(lambda value, _: f"{value:,.0f}")


def clients(figures: dict, figure: Figure) -> None:
    """Consumer-client workers and raw lease/ack loops against the number of processes."""
    data = figures["clients"]
    workers = data["workers"]
    left, right = figure.subplots(1, 2)
    for measure, style in (("drain", "-"), ("steady", "--")):
        for via, colour in (("direct", "tab:blue"), ("broker", "tab:orange")):
            left.plot(
                workers, data[measure][via], style, color=colour, marker="o",
                label=f"{via}, {measure}",
            )  # fmt: skip
    left.set_title("consumer client, handler doing nothing")
    raw = data["raw lease(10) + ack"]
    for via, colour in (("direct", "tab:blue"), ("broker", "tab:orange")):
        right.plot(workers, raw[via], color=colour, marker="o", label=via)
    right.set_title("raw lease(max_messages=10) + ack loops")
    for axes in (left, right):
        processes_axis(axes, workers)
        axes.set_ylabel("messages / s")
        axes.legend()


def scale(figures: dict, figure: Figure) -> None:
    """Competing consumers of one queue table: workers and streaming queries, two batches."""
    data = figures["scale"]
    consumers = data["consumers"]
    left, right = figure.subplots(1, 2)
    for axes, batch in ((left, "1,000"), (right, "10,000")):
        for kind, colour in (("workers", "tab:blue"), ("queries", "tab:green")):
            axes.plot(
                consumers, data[f"{kind}, batch {batch}"], color=colour, marker="o", label=kind
            )
        axes.set_title(f"batches of {batch} messages")
        processes_axis(axes, consumers, label="competing consumers")
        axes.set_ylabel("messages / s")
        axes.legend()


def latency(figures: dict, figure: Figure) -> None:
    """Percentiles of end-to-end latency, two producers, three pipelines."""
    left, right = figure.subplots(1, 2)
    percentile_bars(left, figures["latency"])
    left.set_title("a process publishes 100 messages every 0.5 s\n(from the commit's return)")
    percentile_bars(right, figures["latency_spark_write"])
    right.set_title("df.write of one row every 0.5 s\n(from the write call's start)")


def sustained(figures: dict, figure: Figure) -> None:
    """32 threads' one-message publishes over 3 minutes, the log bounded and not."""
    data = figures["sustained"]
    rate, files = figure.subplots(1, 2)
    for name, colour in (("500 versions (default)", "tab:blue"), ("time only (7 days)", "tab:red")):
        rate.plot(data["seconds"], data[name], color=colour, marker="o", label=name)
        files.plot(data["seconds"], data[f"{name}, log files"], color=colour, marker="o")
    rate.set_title("32 threads' one-message publishes")
    rate.set_ylabel("messages / s")
    rate.set_ylim(bottom=0)
    rate.legend()
    files.set_title("files in _delta_log")
    for axes in (rate, files):
        axes.set_xlabel("seconds since the start")
        axes.yaxis.set_major_formatter(THOUSANDS)
        axes.grid(alpha=0.3)


def tombstones(figures: dict, figure: Figure) -> None:
    """32 threads' one-message publishes against the removals each checkpoint keeps."""
    data = figures["tombstones"]
    axes = figure.subplots()
    for run in ("run A", "run B"):
        axes.plot(data["removals"], data[run], marker="o", label=run)
    axes.set_xlabel("removals kept in each checkpoint")
    axes.set_ylabel("messages / s")
    axes.set_ylim(bottom=0)
    axes.xaxis.set_major_formatter(THOUSANDS)
    axes.yaxis.set_major_formatter(THOUSANDS)
    axes.grid(alpha=0.3)
    axes.legend()


def round_trips(figures: dict, figure: Figure) -> None:
    """p50 of each operation, and 32 threads' publishes, against each request's delay."""
    data = figures["round_trips"]
    delays = data["delays_ms"]
    latency, rate = figure.subplots(1, 2)
    for name, values in data["p50_ms"].items():
        latency.plot(delays, values, marker="o", label=name)
    latency.plot(
        delays, [2 * d for d in delays], ":", color="grey", label="two round trips (the limit)"
    )
    latency.set_title("p50 of one call")
    latency.set_ylabel("ms")
    latency.legend(fontsize="small")
    for name, values in data["threads"].items():
        if name.startswith("msg_per_s"):
            rate.plot(delays, values, marker="o", label=name.split(", ")[1])
    rate.set_title("32 threads' one-message publishes, one table")
    rate.set_ylabel("messages / s")
    rate.legend()
    for axes in (latency, rate):
        axes.set_xlabel("delay added to each request (ms)")
        axes.set_xticks(delays)
        axes.set_ylim(bottom=0)
        axes.yaxis.set_major_formatter(THOUSANDS)
        axes.grid(alpha=0.3)


def partitions(figures: dict, figure: Figure) -> None:
    """Each measure's rate over one partition's, the Spark source's msg/s, and one broker
    against two, by the queue's partitions."""
    data = figures["partitions"]
    counts = data["partitions"]
    speed, source, brokers = figure.subplots(1, 3, width_ratios=[2, 2, 1])
    for name, rates in data["msg_per_s"].items():
        if name.startswith("Spark"):
            continue
        style = "--" if name.endswith("local disk") else "-"
        speed.plot(counts, [r / rates[0] for r in rates], style, marker="o", label=name)
    speed.plot(counts, counts, ":", color="grey", label="partitions (linear)")
    speed.axhline(6, color="tab:red", linewidth=0.8, label="goal at 8 partitions, 20 ms")
    speed.set_title("rate over one partition's")
    speed.set_ylabel("times one partition's rate")
    for name, rates in data.get("batch_msg_per_s", {}).items():
        style = "--" if name.endswith("local disk") else "-"
        source.plot(counts, rates, style, marker="o", label=name.removeprefix("Spark source, "))
    source.set_title("Spark source, p50 of a batch (1: one queue table)")
    source.set_ylabel("messages / s")
    for axes in (speed, source):
        processes_axis(axes, counts, label="partitions")
        axes.legend(fontsize="x-small")
    stores = list(data.get("brokers", {}))
    width = 0.8 / max(1, len(stores))
    for index, store in enumerate(stores):
        positions = [p + (index - (len(stores) - 1) / 2) * width for p in (0, 1)]
        brokers.bar(positions, data["brokers"][store], width, label=store)
    brokers.set_xticks([0, 1], ["1 broker", "2 brokers"])
    brokers.set_title("small clients' publishes")
    brokers.set_ylabel("messages / s")
    brokers.yaxis.set_major_formatter(THOUSANDS)
    brokers.grid(axis="y", alpha=0.3)
    brokers.legend(fontsize="x-small")


def processes_axis(axes: Axes, ticks: list[int], label: str = "processes (W)") -> None:
    axes.set_xscale("log", base=2)
    axes.set_xticks(ticks, [str(tick) for tick in ticks])
    axes.minorticks_off()
    axes.set_xlabel(label)
    axes.set_ylim(bottom=0)
    axes.yaxis.set_major_formatter(THOUSANDS)
    axes.grid(alpha=0.3)


def percentile_bars(axes: Axes, data: dict) -> None:
    percentiles = data["percentiles"]
    pipelines = [name for name in data if name not in ("source", "percentiles")]
    width = 0.8 / len(pipelines)
    for index, name in enumerate(pipelines):
        positions = [
            p + (index - (len(pipelines) - 1) / 2) * width for p in range(len(percentiles))
        ]
        axes.bar(positions, data[name], width, label=name)
    axes.set_xticks(range(len(percentiles)), percentiles)
    axes.set_ylabel("seconds")
    axes.grid(axis="y", alpha=0.3)
    axes.legend()


PLOTS: dict[str, tuple[Callable[[dict, Figure], None], tuple[float, float]]] = {
    "clients.png": (clients, (11, 4.2)),
    "scale.png": (scale, (11, 4.2)),
    "latency.png": (latency, (11, 4.4)),
    "sustained.png": (sustained, (11, 4.2)),
    "tombstones.png": (tombstones, (6, 4.2)),
    "round_trips.png": (round_trips, (11, 4.4)),
    "partitions.png": (partitions, (13, 4.4)),
}


def draw(name: str, figures: dict) -> bytes:
    plot, size = PLOTS[name]
    figure = plt.figure(figsize=size, dpi=80, layout="constrained")
    plot(figures, figure)
    target = FOLDER / f".{name}.tmp"
    figure.savefig(target, format="png", metadata=METADATA)
    plt.close(figure)
    data = target.read_bytes()
    target.unlink()
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="fail if a PNG is missing or differs from its figures"
    )
    args = parser.parse_args(argv)
    figures = json.loads(FIGURES.read_text())
    stale = []
    for name in PLOTS:
        data = draw(name, figures)
        path = FOLDER / name
        if args.check:
            if not path.exists() or path.read_bytes() != data:
                stale.append(name)
        else:
            path.write_bytes(data)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"stale: {', '.join(stale)} (run benchmarks/plots.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
