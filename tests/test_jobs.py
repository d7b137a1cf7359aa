"""The demo job runs end to end as its own process, as `make demo` runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.spark


def test_produce_job_fills_a_ring_queue_and_prints_stats(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "jobs" / "produce.py"),
            "--path",
            str(tmp_path / "q"),
            "--messages",
            "300",
            "--files",
            "3",
            "--ring-size",
            "100",
        ],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert (stats["added"], stats["replaced"], stats["ready"]) == (300, 200, 100)
    assert "after 3 micro-batches" in result.stdout


def test_produce_job_help():
    result = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "produce.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "--ring-size" in result.stdout
