"""The ``integration`` marker: which tests start a process (a broker, the S3 server, a CLI or
Spark driver, a killed worker, a JVM), given at collection by what a test and its fixtures
reach, and checked while each test runs.

At collection, :func:`starts_processes` reads the code of the test and of its fixtures, and
of every function and class of the suite or the package they name, down to the standard
library's ways of starting a process (``subprocess``, ``multiprocessing``, ``os.fork``, ...).
A test using the ``spark`` fixture, or marked ``spark``, starts a JVM. What that reading
cannot see (a call through a value it cannot name) the test carries by hand
(``@pytest.mark.integration``).

While a test that is not marked runs (its fixtures' setup, the test, their teardown),
:func:`guarded` records every process started in this interpreter, and the phase fails
naming what it started: a test the reading missed fails at once, on every run, rather than
running among the fast tests unseen. Processes a native library starts (delta-rs, the JVM
itself) are out of its sight; they are the package's, not the suite's.
"""

from __future__ import annotations

import inspect
import multiprocessing.process
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

# Modules whose every use counts as starting a process, and names that start one whatever
# module they are read from (``os.fork``, ``asyncio.create_subprocess_exec``, ...).
PROCESS_MODULES = ("subprocess", "multiprocessing")
PROCESS_CALLS = {
    "Popen",
    "fork",
    "forkpty",
    "posix_spawn",
    "posix_spawnp",
    "spawnv",
    "spawnve",
    "spawnvp",
    "spawnvpe",
    "ProcessPoolExecutor",
    "create_subprocess_exec",
    "create_subprocess_shell",
}
# Whose code is read: the suite's and the package's (what the standard library and other
# packages do is known by PROCESS_MODULES and PROCESS_CALLS).
READ = ("tests", "spark_queue", "conftest")
# Fixtures that start a process through code not read here (PySpark starts the JVM).
PROCESS_FIXTURES = {"spark", "connect_server"}


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _codes(constant)


def _read(module: str) -> bool:
    return module.split(".")[0] in READ


def _functions(value: object) -> list[types.FunctionType]:
    """The functions of ``value``: itself, or a class's methods and properties."""
    value = inspect.unwrap(value) if callable(value) else value
    if isinstance(value, types.FunctionType):
        return [value]
    if not isinstance(value, type):
        return []
    found = []
    for member in vars(value).values():
        if isinstance(member, staticmethod | classmethod):
            member = member.__func__
        elif isinstance(member, property):
            member = member.fget
        if isinstance(member, types.FunctionType):
            found.append(member)
    return found


_KNOWN: dict[int, bool] = {}


def _reaches_a_process(value: object) -> bool:
    """Whether calling ``value`` (a function or class of the suite or the package) may start
    a process, as far as the names its code uses tell."""
    key = id(value)
    if key not in _KNOWN:
        _KNOWN[key] = False  # a function that reaches itself adds nothing
        _KNOWN[key] = any(_function_reaches(f) for f in _functions(value))
    return _KNOWN[key]


def _function_reaches(function: types.FunctionType) -> bool:
    names = {name for code in _codes(function.__code__) for name in code.co_names}
    if names & PROCESS_CALLS:
        return True
    for name in names:
        value = function.__globals__.get(name, sys.modules.get(name))
        if isinstance(value, types.ModuleType):
            if value.__name__.split(".")[0] in PROCESS_MODULES:
                return True
            if _read(value.__name__) and any(
                _reaches_a_process(getattr(value, attribute)) for attribute in names
                if _read(getattr(getattr(value, attribute, None), "__module__", None) or "")
            ):  # fmt: skip
                return True
        elif _read(getattr(value, "__module__", None) or "") and _reaches_a_process(value):
            return True
    return False


def starts_processes(item: pytest.Item) -> bool:
    """Whether ``item``, through its own code or its fixtures', starts a process: the
    fixtures it takes, and those its parameters name where it asks for one by name
    (``request.getfixturevalue(kind)``)."""
    if item.get_closest_marker("spark") is not None:
        return True
    fixtures = set(getattr(item, "fixturenames", ()))
    test = getattr(item, "obj", None)
    test = getattr(getattr(test, "hypothesis", None), "inner_test", test)
    if isinstance(test, types.FunctionType) and any(
        "getfixturevalue" in code.co_names for code in _codes(test.__code__)
    ):
        params = getattr(getattr(item, "callspec", None), "params", {})
        fixtures |= {value for value in params.values() if isinstance(value, str)}
    if PROCESS_FIXTURES & fixtures:
        return True
    manager = item.session._fixturemanager
    for name in fixtures:
        for definition in manager.getfixturedefs(name, item) or ():
            if _read(definition.func.__module__) and _reaches_a_process(definition.func):
                return True
    return test is not None and _reaches_a_process(test)


# -- while a test runs ----------------------------------------------------------------------

_started: list[str] | None = None  # what the running unmarked test started; None: not watched


def _watched(what: Callable[..., Any], describe: Callable[..., str]) -> Callable[..., Any]:
    def start(*args: Any, **kwargs: Any) -> Any:
        if _started is not None:
            _started.append(describe(*args, **kwargs))
        return what(*args, **kwargs)

    return start


def _command(popen: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> str:
    words = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
    return "subprocess " + " ".join(str(word) for word in words)[:200]


def install() -> None:
    """Watch every way this interpreter starts a process (once, at the suite's start)."""
    subprocess.Popen._execute_child = _watched(  # type: ignore[attr-defined]
        subprocess.Popen._execute_child,  # type: ignore[attr-defined]
        _command,
    )
    multiprocessing.process.BaseProcess.start = _watched(
        multiprocessing.process.BaseProcess.start,
        lambda process: f"multiprocessing process {process.name}",
    )
    os.fork = _watched(os.fork, lambda: "os.fork()")
    os.system = _watched(os.system, lambda command: f"os.system {command}")


@contextmanager
def guarded(item: pytest.Item, phase: str) -> Iterator[None]:
    """Run one phase of ``item``; if it is not marked ``integration`` and started a process,
    fail the phase naming it."""
    global _started
    if item.get_closest_marker("integration") is not None:
        yield
        return
    _started = started = []
    try:
        yield
    finally:
        _started = None
    if started:
        pytest.fail(
            f"{item.nodeid} started a process in its {phase} ({started[0]}"
            f"{f', and {len(started) - 1} more' if len(started) > 1 else ''}) but is not "
            "marked integration: mark it (@pytest.mark.integration), see tests/processes.py",
            pytrace=False,
        )
