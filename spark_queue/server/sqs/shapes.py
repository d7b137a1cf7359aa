"""SQS request bodies read and checked against SQS's own service model (docs/SQS.md).

botocore ships the model every AWS SDK is generated from
(``botocore/data/sqs/<version>/service-2.json``): each action's input shape names its
members, their JSON types (string, integer, boolean, list, map, structure, blob) and which
are required. A body is checked against it before any action reads it, so a wrong-typed
member anywhere (a batch entry's, a message attribute's) gets SQS's
``InvalidParameterValue`` naming it, a missing required one ``MissingParameter``, and the
code that acts on a request only ever sees the members and types the model promises: no
action checks a member's type or presence again. What the model leaves open (a value's
range, its characters) the actions check (:mod:`spark_queue.server.sqs`), with the checks
several share here (:func:`bounded`, :func:`batch_entries`).

A body is read as strict JSON: a member given twice, ``NaN`` and ``Infinity`` are refused
(``SerializationException``) rather than resolved to one of them, and a string holding a
lone surrogate (valid JSON, but no Unicode text: it cannot be stored) is refused as an
invalid value of its member.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_queue.server.sqs.errors import SqsError, invalid
from spark_queue.server.sqs.limits import MAX_BATCH

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


class _Duplicate(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _Duplicate(name)
            seen.add(name)
    return members


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@dataclass(frozen=True)
class Shape:
    """A shape of the model, as much of it as a check reads (botocore's ``Shape`` computes
    its members and metadata on each access: several times slower to walk)."""

    kind: str  # structure, list, map, string, blob, integer, long, boolean, timestamp
    members: dict[str, Shape] = field(default_factory=dict)  # a structure's
    required: tuple[str, ...] = ()  # a structure's required members
    element: Shape | None = None  # a list's member, a map's value


def _compiled(shape: Any) -> Shape:
    kind = shape.type_name
    if kind == "structure":
        members = {name: _compiled(member) for name, member in shape.members.items()}
        return Shape(kind, members, tuple(shape.required_members))
    if kind in ("list", "map"):
        return Shape(kind, element=_compiled(shape.member if kind == "list" else shape.value))
    return Shape(kind)


@functools.cache
def input_shapes() -> dict[str, Shape]:
    """Each SQS action's input shape, by action name: from the newest version of the model
    botocore ships."""
    from botocore.loaders import Loader
    from botocore.model import ServiceModel

    model = ServiceModel(Loader().load_service_model("sqs", "service-2"))
    return {n: _compiled(model.operation_model(n).input_shape) for n in model.operation_names}


def parse_request(action: str, body: bytes) -> dict[str, Any]:
    """The members of ``action``'s request ``body`` (``action``: one of the model's),
    checked against the action's shape.

    Raises:
        SqsError: ``SerializationException`` (not a JSON object, or a member given twice in
            one object), ``MissingParameter`` or ``InvalidParameterValue`` (a member of the
            wrong type, an integer beyond its range, a string that is not Unicode text).
    """
    try:
        members = json.loads(body or b"{}", object_pairs_hook=_unique, parse_constant=_no_constant)
    except _Duplicate as duplicate:
        raise SqsError(
            "SerializationException",
            f"The request body gives the member {duplicate.name[:100]!r} twice in one object.",
        ) from None
    except (ValueError, RecursionError):
        raise SqsError("SerializationException", "The request body is not JSON.") from None
    if not isinstance(members, dict):
        raise SqsError("SerializationException", "The request body is not a JSON object.")
    check(input_shapes()[action], members, "")
    return members


def check(shape: Shape, value: Any, path: str) -> None:
    """``value`` as ``shape`` says, at ``path`` (``Entries[2].MessageBody``); a member that
    is null counts as absent, as in every AWS JSON protocol.

    Raises:
        SqsError: ``MissingParameter`` or ``InvalidParameterValue``, naming the member.
    """
    kind = shape.kind
    if kind == "structure":
        if not isinstance(value, dict):
            raise invalid(path, value, "must be an object")
        prefix = f"{path}." if path else ""
        for name in shape.required:
            if value.get(name) is None:
                raise SqsError(
                    "MissingParameter", f"The request must contain the parameter {prefix}{name}."
                )
        for name, member in value.items():
            if member is not None and name in shape.members:
                check(shape.members[name], member, f"{prefix}{name}")
        return
    element = shape.element  # a list's and a map's, never None
    if kind == "list" and element is not None:
        if not isinstance(value, list):
            raise invalid(path, value, "must be a list")
        for at, item in enumerate(value):
            _present(item, f"{path}[{at}]")
            check(element, item, f"{path}[{at}]")
    elif kind == "map" and element is not None:
        if not isinstance(value, dict):
            raise invalid(path, value, "must be a map (an object)")
        for key, item in value.items():
            _text(key, f"{path} key")
            _present(item, f"{path}.{key}")
            check(element, item, f"{path}.{key}")
    elif kind in ("string", "blob"):
        if not isinstance(value, str):
            raise invalid(path, value, "must be a string")
        _text(value, path)
    elif kind in ("integer", "long"):
        low, high = INT32 if kind == "integer" else INT64
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(path, value, "must be an integer")
        if not low <= value <= high:
            raise invalid(path, value, f"must be an integer from {low} to {high}")
    elif kind == "boolean":
        if not isinstance(value, bool):
            raise invalid(path, value, "must be true or false")
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(path, value, f"must be a {kind}")  # a timestamp: seconds


def _present(item: Any, path: str) -> None:
    if item is None:
        raise invalid(path, item, "an element of a list or map may not be null")


def _text(value: str, path: str) -> None:
    try:
        value.encode()
    except UnicodeEncodeError:
        raise invalid(path, value, "not Unicode text: it holds a lone surrogate") from None


# -- what the model leaves open -----------------------------------------------------------
# An action reads a request checked against its shape: each member the model requires is
# there and every member has the model's type. What the actions check is values; these are
# the value checks several share.


def bounded(request: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    """An integer member, from ``low`` to ``high`` (None where absent)."""
    value: int | None = request.get(name)
    if value is not None and not low <= value <= high:
        raise invalid(name, value, f"must be between {low} and {high}")
    return value


def batch_entries(request: Mapping[str, Any], name: str = "Entries") -> list[dict[str, Any]]:
    """A batch's entries, with distinct valid ids, 1 to 10 of them.

    Raises:
        SqsError: ``EmptyBatchRequest``, ``TooManyEntriesInBatchRequest``,
            ``InvalidBatchEntryId``, ``BatchEntryIdsNotDistinct``.
    """
    entries: list[dict[str, Any]] = request[name]
    if not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one entry in the request.")
    if len(entries) > MAX_BATCH:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH}. You have sent {len(entries)}.",
        )
    seen: set[str] = set()
    for entry in entries:
        entry_id = entry["Id"]
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,80}", entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
            )
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries
