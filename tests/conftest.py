"""Fixtures: one real local SparkSession (Delta + ringqueue) for the whole test session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
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


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A local S3-compatible server (moto's, installed by ``make setup``) on 127.0.0.1 for the
    whole session; yields its endpoint URL. It honours conditional puts (``If-None-Match``),
    which delta-rs's commits rely on."""
    from tests.object_store import start_s3_server

    process, endpoint = start_s3_server()
    yield endpoint
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture
def s3_options(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Storage options that reach the local server; the ``AWS_*`` environment is cleared, so
    nothing a test does can reach it through the environment instead."""
    from tests.object_store import clear_aws_environment, server_options

    clear_aws_environment(monkeypatch)
    return server_options(s3_server)


@pytest.fixture
def s3_table(s3_options: dict[str, str], request: pytest.FixtureRequest) -> str:
    """A queue table URI in a new bucket of its own."""
    from tests.object_store import new_bucket

    return f"s3://{new_bucket(s3_options, request.node.name)}/lake/queues"
