"""The ``integration`` marker (tests/processes.py): given to what reaches a process through
the suite's helpers, and enforced while a test runs."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import types

import pytest

from tests import processes
from tests.brokers import BrokerProcess


def runs_the_cli() -> int:
    return subprocess.run([sys.executable, "-c", "pass"], check=True).returncode


def opens_a_broker(path: str) -> BrokerProcess:
    return BrokerProcess(path, log_path=None)  # type: ignore[arg-type]


def through_a_helper(path: str) -> str:
    return opens_a_broker(path).address


def reads_a_file(path: str) -> str:
    with open(path) as file:
        return file.read()


def imports_where_it_runs() -> None:
    from tests.object_store import start_s3_server

    start_s3_server()


@pytest.mark.parametrize(
    ("function", "starts"),
    [
        (runs_the_cli, True),
        (opens_a_broker, True),
        (through_a_helper, True),
        (imports_where_it_runs, True),
        (lambda: [multiprocessing.get_context("spawn")], True),
        (reads_a_file, False),
        (lambda: sorted([3, 1]), False),
    ],
    ids=lambda value: getattr(value, "__name__", repr(value)),
)
def test_what_reaches_a_process_through_the_suites_helpers_is_found(function, starts):
    assert processes._reaches_a_process(function) is starts


def unmarked(name: str) -> types.SimpleNamespace:
    """A stand-in for a collected test without the integration marker."""
    return types.SimpleNamespace(nodeid=name, get_closest_marker=lambda marker: None)


def test_a_test_not_marked_integration_that_starts_a_process_fails_naming_it(request):
    # This test starts processes through runs_the_cli and multiprocessing: marked for it.
    assert request.node.get_closest_marker("integration") is not None
    with (
        pytest.raises(pytest.fail.Exception) as failed,
        processes.guarded(unmarked("tests/x.py::test_cli"), "call"),
    ):
        runs_the_cli()
    assert "tests/x.py::test_cli started a process in its call" in str(failed.value)
    assert f"subprocess {sys.executable} -c pass" in str(failed.value)
    with (
        pytest.raises(pytest.fail.Exception, match="multiprocessing process"),
        processes.guarded(unmarked("tests/x.py::test_worker"), "setup"),
    ):
        worker = multiprocessing.get_context("spawn").Process(target=sorted, args=([],))
        worker.start()
        worker.join(timeout=60)
    with processes.guarded(unmarked("tests/x.py::test_pure"), "call"):
        assert sorted([3, 1]) == [1, 3]  # starts nothing: passes


def test_a_test_that_starts_nothing_runs_unmarked(request):
    assert request.node.get_closest_marker("integration") is None
