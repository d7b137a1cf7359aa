"""Fixtures: one real local SparkSession (Delta + ringqueue) for the whole test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def spark():
    from spark_queue import local_session

    session = local_session(app_name="spark-queue-tests")
    yield session
    session.stop()


@pytest.fixture
def queue_path(tmp_path: Path) -> str:
    return str(tmp_path / "queues")
