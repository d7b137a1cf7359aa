"""The arguments of ``QueueTable``'s operations that are not in the specification (an
operation's consumer or any, its deliveries, an idempotent publish's producer and sequence),
each parsed once; and :func:`results_only`, which makes ``publish`` from ``publish_outcome``
so that both take one signature, declared once."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

import numpy as np

from spark_queue.errors import InvalidOptionError
from spark_queue.model.arguments import parse_consumer_name, parse_count, parse_seqs
from spark_queue.model.results import PublishOutcome, PublishResult

Table = TypeVar("Table")
Params = ParamSpec("Params")


def consumer_or_any(consumer: object) -> str | None:
    """An operation's ``consumer``: None (any consumer's leases), or a consumer name."""
    if consumer is None:
        return None
    return parse_consumer_name("consumer", consumer)


def deliveries_of(seqs: np.ndarray, deliveries: object) -> np.ndarray | None:
    """An operation's ``deliveries``: None, or one delivery count per seq."""
    if deliveries is None:
        return None
    parsed = parse_seqs("deliveries", deliveries)
    if len(parsed) != len(seqs):
        raise InvalidOptionError(
            f"deliveries must give one delivery count per seq: {len(parsed)} for {len(seqs)} seqs"
        )
    return parsed


def idempotence(producer: object, sequence: object) -> int | None:
    """An idempotent publish's ``sequence`` (None: not idempotent), checked with its
    ``producer``: both or neither, a non-empty producer id, a whole number."""
    if (producer is None) != (sequence is None):
        raise InvalidOptionError("producer and sequence go together: give both or neither")
    if producer is not None and (not isinstance(producer, str) or not producer):
        raise InvalidOptionError(f"producer must be a non-empty string; got {producer!r}")
    return None if sequence is None else parse_count("sequence", sequence)


def results_only(
    publish_outcome: Callable[Concatenate[Table, Params], PublishOutcome], doc: str
) -> Callable[Concatenate[Table, Params], PublishResult]:
    """``QueueTable.publish`` made from ``publish_outcome``, which declares the signature
    both take: the same call, answering its :class:`PublishResult` only; ``doc`` is its
    docstring (the docs site reads it too: ``conf/griffe_results_only.py``)."""

    @functools.wraps(publish_outcome)
    def publish(table: Table, /, *args: Params.args, **kwargs: Params.kwargs) -> PublishResult:
        return publish_outcome(table, *args, **kwargs).result

    publish.__name__ = "publish"
    publish.__qualname__ = "QueueTable.publish"
    publish.__doc__ = doc
    publish.__annotations__ = {**publish_outcome.__annotations__, "return": "PublishResult"}
    declared = inspect.signature(publish_outcome)
    publish.__signature__ = declared.replace(  # type: ignore[attr-defined]
        return_annotation="PublishResult"
    )
    return publish
