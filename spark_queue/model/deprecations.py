"""Old spellings of the API that keep working for one release, each with a
:class:`SparkQueueDeprecationWarning` naming the new spelling (``CHANGELOG.md``,
"Migration").

:func:`renamed` maps a function's old keyword names to the new ones; :func:`warn_deprecated`
warns where the caller's code made the call, not inside the package, so that Python's
default filter shows it in a script and a test run names the line to change.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from spark_queue.errors import InvalidOptionError

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

# The old names of renamed arguments, old -> new, by where they are taken.
QUEUE_RENAMES = {"name": "queue"}  # QueueTable's calls that named their queue ``name``
CONSUMER_RENAMES = {
    "name": "consumer",
    "ack_interval_ms": "ack_interval",
    "max_poll_interval_ms": "idle_check_interval",
    "idle_lease_interval_ms": "idle_lease_interval",
}
PUBLISHER_RENAMES = {"linger_ms": "linger"}
# Arguments that moved: what a call in the old order is told.
RELEASE_ORDER = (
    "release(consumer, queue) is deprecated: the queue comes first and the consumer is a "
    "keyword, release(queue, consumer=consumer)"
)
# Defaults that changed: what a call that leaves the argument out is told, for one release.
VACUUM_REDEFAULTED = (
    "vacuum() without dry_run is a dry run, as delta-rs's vacuum: it lists the files and "
    "deletes none; pass dry_run=False to delete them (dry_run=True to keep listing)"
)

Params = ParamSpec("Params")
Result = TypeVar("Result")


class SparkQueueDeprecationWarning(DeprecationWarning):
    """An old spelling of spark-queue's API (a renamed argument, an old order, an old
    "no limit" value): it works for one release more; the message names the new spelling.
    ``warnings.filterwarnings("error", category=SparkQueueDeprecationWarning)`` finds
    every use."""


def warn_deprecated(message: str) -> None:
    """A :class:`SparkQueueDeprecationWarning` with ``message``, attributed to the first
    caller outside the package."""
    frame = sys._getframe(1)
    level = 2  # warnings.warn's level of the frame above: the caller of this function
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    warnings.warn(message, SparkQueueDeprecationWarning, stacklevel=level)


def renamed(
    where: str, renames: Mapping[str, str]
) -> Callable[[Callable[Params, Result]], Callable[Params, Result]]:
    """A decorator: the old keyword names in ``renames`` (old -> new) of a function called
    ``where`` in messages keep working, each with a warning naming the new name; a call
    giving both the old and the new name is refused. The signature stays the new one."""

    def decorate(function: Callable[Params, Result]) -> Callable[Params, Result]:
        @functools.wraps(function)
        def call(*args: Params.args, **kwargs: Params.kwargs) -> Result:
            if renames.keys() & kwargs.keys():
                kwargs = _new_names(where, renames, kwargs)  # type: ignore[assignment]
            return function(*args, **kwargs)

        return call

    return decorate


def first_is_now_keyword(
    parameter: str, message: str
) -> Callable[[Callable[Params, Result]], Callable[Params, Result]]:
    """A decorator: ``parameter``, now keyword-only, came first in the old order; a call
    that does not name it, and gives positional arguments, gave it first. Kept for one
    release, telling such a call ``message``."""

    def decorate(function: Callable[Params, Result]) -> Callable[Params, Result]:
        @functools.wraps(function)
        def call(*args: Params.args, **kwargs: Params.kwargs) -> Result:
            if parameter in kwargs or len(args) < 2:  # args[0] is self
                return function(*args, **kwargs)
            warn_deprecated(message)
            self, first, *rest = args
            return function(self, *rest, **{parameter: first}, **kwargs)  # type: ignore[arg-type]

        return call

    return decorate


def redefaulted(
    parameter: str, position: int, message: str
) -> Callable[[Callable[Params, Result]], Callable[Params, Result]]:
    """A decorator: a call that leaves out ``parameter`` (a keyword, or the positional
    argument at ``position``, counting ``self``), whose default changed, is told ``message``
    for one release."""

    def decorate(function: Callable[Params, Result]) -> Callable[Params, Result]:
        @functools.wraps(function)
        def call(*args: Params.args, **kwargs: Params.kwargs) -> Result:
            if parameter not in kwargs and len(args) <= position:
                warn_deprecated(message)
            return function(*args, **kwargs)

        return call

    return decorate


def _new_names(where: str, renames: Mapping[str, str], given: dict[str, Any]) -> dict[str, Any]:
    named = dict(given)
    for old, new in renames.items():
        if old not in named:
            continue
        if new in named:
            raise InvalidOptionError(
                f"{where}: {old} is the old name of {new}; give {new} only, not both"
            )
        warn_deprecated(f"{where}({old}=...) is deprecated: use {new}=...")
        named[new] = named.pop(old)
    return named
