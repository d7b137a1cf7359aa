"""``wire.bind_arguments``: the same binding as ``inspect.Signature.bind`` (arguments, their
order, ``args`` and ``kwargs``), or the same ``TypeError``, for every shape of call a
client or a broker binds, on the methods a broker serves and on signatures with
positional-only and ``*`` parameters (left to ``bind``)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from spark_queue import QueueTable
from spark_queue.broker.wire import bind_arguments


def keywords(a, b=2, *, c, d=4, **rest):
    return a


def positional_only(a, /, b=2):
    return a


def starred(a, *more, b=2):
    return a


def plain(a, b=2, c=3):
    return a


CALLS: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = [
    (keywords, (1,), {"c": 3}),
    (keywords, (), {"a": 1, "c": 3, "d": 5}),
    (keywords, (1, 2), {"c": 3, "z": 9, "y": 8}),  # extras to **rest, in their order
    (keywords, (1,), {"c": 3, "a": 1}),  # a given twice
    (keywords, (1,), {}),  # c missing
    (keywords, (1, 2, 3), {"c": 3}),  # too many positionals
    (plain, (1,), {"c": 5}),
    (plain, (1,), {"q": 5}),  # an unknown keyword
    (plain, (), {"c": 5, "a": 1}),  # keywords out of order
    (positional_only, (1,), {"b": 3}),
    (positional_only, (), {"a": 1}),
    (starred, (1, 2, 3), {"b": 4}),
    (QueueTable.publish_outcome, (None, "q", ["m"]), {"producer": "p", "max_length": 5}),
    (QueueTable.publish_outcome, (None,), {"queue": "q", "rows": ["m"]}),
    (QueueTable.publish_outcome, (None, "q"), {}),  # rows missing
    (QueueTable.ack, (None, "q", [1, 2], "c"), {}),
    (QueueTable.lease, (None, "q", "c"), {"max_messages": 10}),
]


@pytest.mark.parametrize(("method", "args", "kwargs"), CALLS)
def test_bind_arguments_binds_as_signature_bind(method, args, kwargs):
    try:
        expected = inspect.signature(method).bind(*args, **kwargs)
    except TypeError as error:
        with pytest.raises(TypeError) as raised:
            bind_arguments(method, *args, **kwargs)
        assert str(raised.value) == str(error)
        return
    got = bind_arguments(method, *args, **kwargs)
    assert list(got.arguments.items()) == list(expected.arguments.items())
    assert (got.args, got.kwargs) == (expected.args, expected.kwargs)
