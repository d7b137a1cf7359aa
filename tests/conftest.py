"""Fixtures: one real local SparkSession (Delta + ringqueue) for the whole test session.

The session is classic unless ``SPARK_QUEUE_TEST_SESSION=connect``: then ``spark`` is a Spark
Connect session of one local Connect server (``connect_server``), and only the tests marked
``connect`` (a representative subset, run in both passes) and ``connect_only`` run. PySpark
runs one kind of session per process (a Connect session turns the process's functions to
Connect mode), so ``make test`` runs the two passes as two pytest processes.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import core as hypothesis_core
from hypothesis import settings

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import jvm, processes  # noqa: E402
from tests.latency_proxy import LatencyProxy, RoundTrips  # noqa: E402
from tests.object_store import RequestLog  # noqa: E402
from tests.seeds import ENV_VAR, RANDOM, SEED_LIMIT, replay_command, seed_for, seed_mode  # noqa: E402

# Loaded before any test module is imported, so each ``@settings(...)`` inherits it. "ci":
# every run draws the same examples and needs no example database (CI has none to keep);
# otherwise the run's seed decides them (tests/seeds.py).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("seeded", derandomize=False, database=None, print_blob=True)
SEED_MODE = seed_mode()
if SEED_MODE is None:
    settings.load_profile("ci")
else:
    settings.load_profile("seeded")
    hypothesis_core.global_force_seed = (
        random.SystemRandom().randrange(SEED_LIMIT) if SEED_MODE == RANDOM else SEED_MODE
    )
REPLAY = pytest.StashKey[str]()
# Every Spark driver of the test run (this process's, and those of the processes it starts)
# starts with C1 only and the shared class archive (tests/jvm.py).
# (Added once: a pytest started by a test inherits them.)
JVM_OPTIONS = jvm.submit_opts()
if JVM_OPTIONS not in os.environ.get("SPARK_SUBMIT_OPTS", ""):
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(
        filter(None, [os.environ.get("SPARK_SUBMIT_OPTS"), JVM_OPTIONS])
    )


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """This test's seed (tests/seeds.py), printed; a failure prints how to replay it."""
    value = seed_for(request.node.nodeid)
    request.node.stash[REPLAY] = replay_command(value, request.node.nodeid)
    print(f"\nseed {value} (replay: {request.node.stash[REPLAY]})")
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    if report.failed and REPLAY in item.stash:
        report.sections.append(("replay", item.stash[REPLAY]))
    return report


SESSION_ENV = "SPARK_QUEUE_TEST_SESSION"
CONNECT_PASS = os.environ.get(SESSION_ENV, "classic") == "connect"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every randomised test (a ``seed`` user, or a Hypothesis test) ``randomised``
    (``make stress`` selects them), every user of the ``spark`` fixture ``spark``, so that
    ``-m "not spark"`` never starts a SparkSession, and every test that starts a process
    ``integration`` (tests/processes.py). Then keep this pass's tests: the Connect pass runs
    the ``connect`` and ``connect_only`` tests, the classic pass all but ``connect_only``."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "seed" in fixtures or getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.randomised)
        if "spark" in fixtures:
            item.add_marker(pytest.mark.spark)
        if processes.starts_processes(item):
            item.add_marker(pytest.mark.integration)

    def selected(item: pytest.Item) -> bool:
        if item.get_closest_marker("connect_only"):
            return CONNECT_PASS
        return not CONNECT_PASS or item.get_closest_marker("connect") is not None

    kept = [item for item in items if selected(item)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if not selected(item)])
        items[:] = kept


# Every way this interpreter starts a process is watched: a test not marked integration that
# starts one fails (tests/processes.py).
processes.install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    with processes.guarded(item, "setup"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    with processes.guarded(item, "call"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    with processes.guarded(item, "teardown"):
        return (yield)


def pytest_report_header() -> list[str]:
    session = f"session: {'connect' if CONNECT_PASS else 'classic'} ({SESSION_ENV})"
    drivers = f"Spark drivers' JVM options (SPARK_SUBMIT_OPTS): {os.environ['SPARK_SUBMIT_OPTS']}"
    if SEED_MODE is None:
        return [
            session,
            drivers,
            f"seeds: fixed per test ({ENV_VAR} unset); hypothesis profile 'ci'",
        ]
    seed = hypothesis_core.global_force_seed
    return [
        session,
        drivers,
        f"seeds: {ENV_VAR}={os.environ[ENV_VAR]}; hypothesis seed {seed} (replay: "
        f"{ENV_VAR}={seed})",
    ]


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest):
    from spark_queue import local_session, register
    from spark_queue.spark.session import connect_session

    if CONNECT_PASS:
        session = register(connect_session(request.getfixturevalue("connect_server").url))
    else:
        session = local_session(app_name="spark-queue-tests")
    yield session
    session.stop()


def interpreter_without_the_package(folder: Path) -> str:
    """A Python of this environment's packages but not of ``spark_queue``: a venv whose one
    ``.pth`` line adds this environment's site-packages as a plain path, so the editable
    install's own ``.pth`` hook there never runs."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = str(folder / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory):
    """The test session's local Spark Connect server (``local_conf``'s settings), started by
    the first test that needs it. Its Python workers cannot import ``spark_queue`` unless a
    session ships it, as on a server where it is not installed: every Connect session's
    ``register`` ships it."""
    from spark_queue.spark.session import local_conf, start_connect_server

    python = interpreter_without_the_package(tmp_path_factory.mktemp("python"))
    server = start_connect_server(local_conf("spark-queue-connect-tests"), python=python)
    yield server
    server.stop()


@pytest.fixture
def queue_path(tmp_path: Path) -> str:
    return str(tmp_path / "queues")


@pytest.fixture(scope="session")
def s3_server_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A local S3-compatible server (moto's, installed by ``make setup``) on 127.0.0.1 for the
    whole session, logging each request; yields its endpoint URL and its log's path. It
    honours conditional puts (``If-None-Match``), which delta-rs's commits rely on."""
    from tests.object_store import start_s3_server

    log_path = str(tmp_path_factory.mktemp("s3-server") / "requests.log")
    process, endpoint = start_s3_server(log_path)
    yield endpoint, log_path
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="session")
def s3_server(s3_server_log: tuple[str, str]) -> str:
    """The session's S3 server's endpoint URL (:func:`s3_server_log`)."""
    return s3_server_log[0]


@pytest.fixture
def s3_requests(s3_server_log: tuple[str, str]) -> RequestLog:
    """The session's S3 server's request log, marked now."""
    log = RequestLog(s3_server_log[1])
    log.mark()
    return log


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


# What the proxy in front of the S3 server holds each request: large next to what a client
# does between requests it sends together, so that those overlap (tests/latency_proxy.py).
ROUND_TRIP_MS = 50


@pytest.fixture(scope="session")
def latency_proxy(s3_server: str) -> Iterator[LatencyProxy]:
    """The session's S3 server behind a proxy that holds each request :data:`ROUND_TRIP_MS`
    and records when each started and ended (tests/latency_proxy.py)."""
    with LatencyProxy(s3_server, ROUND_TRIP_MS) as proxy:
        yield proxy


@pytest.fixture
def proxied_s3_options(s3_options: dict[str, str], latency_proxy: LatencyProxy) -> dict[str, str]:
    """:func:`s3_options` reaching the server through :func:`latency_proxy`."""
    return {**s3_options, "AWS_ENDPOINT_URL": latency_proxy.endpoint}


@pytest.fixture
def proxied_s3_table(s3_options: dict[str, str], request: pytest.FixtureRequest) -> str:
    """A queue table URI in a new bucket of its own (made without the proxy): with
    :func:`proxied_s3_options`, every request to it goes through the proxy."""
    from tests.object_store import new_bucket

    return f"s3://{new_bucket(s3_options, request.node.name)}/lake/queues"


@pytest.fixture
def round_trips(
    latency_proxy: LatencyProxy, proxied_s3_table: str
) -> Callable[[], AbstractContextManager[RoundTrips]]:
    """``with round_trips() as trips: ...``: the requests to :func:`proxied_s3_table`'s bucket
    that started in the block; ``trips.in_all``, ``trips.in_a_row``, ``trips.by_method``,
    ``trips.after_return`` (left running when the block ended); ``str(trips)`` lists them.
    ``latency_proxy.quiet(bucket, seconds)`` first waits for what an earlier call left
    running (upkeep in a thread), which would otherwise count in the block."""
    bucket = urlsplit(proxied_s3_table).netloc
    return lambda: latency_proxy.counting(bucket)
