"""The wheel, installed as a cluster would install it: into an environment whose runtime
already has PySpark, Delta's Python side and pyarrow (here: this test environment's packages,
seen through a ``.pth`` file, as a Databricks or EMR image shows its own). The install must
keep them, add only spark-queue, and the jobs and CLI must run from the installed package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.spark


def run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=600, **kwargs
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def runtime_site(tmp_path: Path) -> Path:
    """A copy-free view of this environment's packages without spark-queue itself: what a
    cluster image holds before the user installs anything."""
    site = Path(sysconfig.get_paths()["purelib"])
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    for entry in site.iterdir():
        name = entry.name.lower()
        if "spark_queue" in name or name.endswith(".pth"):
            continue
        (runtime / entry.name).symlink_to(entry)
    return runtime


def test_the_wheel_installs_beside_a_runtime_spark_and_runs_a_job(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
        "-w", wheels, ROOT,
    )  # fmt: skip
    (wheel,) = wheels.glob("spark_queue-*.whl")
    # The package alone: not the repository's tools (the docs generator), tests or jobs.
    shipped = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {name for name in shipped if not name.startswith("spark_queue-")} == {"spark_queue"}

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    venv_site = Path(
        run(
            python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        ).stdout.strip()
    )
    runtime = runtime_site(tmp_path)
    (venv_site / "runtime.pth").write_text(f"{runtime}\n")

    # No index: every dependency must already be satisfied by the runtime's packages.
    run(python, "-m", "pip", "install", "--no-index", wheel)
    run(python, "-m", "pip", "install", "--no-index", "--dry-run", f"{wheel}[spark]")
    own = sorted(p.name for p in venv_site.iterdir())
    assert any(name.startswith("spark_queue-") for name in own)
    assert not [n for n in own if n.split("-")[0].lower() in ("pyspark", "deltalake", "pyarrow")]
    where = json.loads(
        run(
            python, "-c",
            "import json, pyspark, deltalake, spark_queue; print(json.dumps("
            "[pyspark.__file__, deltalake.__file__, spark_queue.__file__, pyspark.__version__]))",
            cwd=tmp_path,
        ).stdout
    )  # fmt: skip
    assert where[0].startswith(str(runtime)) and where[1].startswith(str(runtime))
    assert where[2].startswith(str(venv_site)) and where[3] == "4.2.0"

    # A job run from outside the checkout imports the installed package.
    jobs = tmp_path / "jobs"
    shutil.copytree(ROOT / "jobs", jobs, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "SPARK_QUEUE_JARS": str(ROOT / "jars"), "PYSPARK_PYTHON": str(python)}
    env.pop("PYTHONPATH", None)
    table = tmp_path / "queues"
    run(python, jobs / "produce.py", "--path", table, "--messages", "500", cwd=tmp_path, env=env)
    # ... and so does the console script: the demo queue is a ring of 1,000.
    stats = run(venv / "bin" / "spark-queue", "--path", table, "stats", "demo", "--json", env=env)
    counts = json.loads(stats.stdout)
    assert counts["added"] == 500 and counts["ready"] == 500
