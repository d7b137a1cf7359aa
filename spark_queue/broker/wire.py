"""How a :class:`~spark_queue.QueueTable` call travels to a queue broker and back, over
Arrow Flight (docs/BROKER.md "Wire format").

- A request is one JSON object: ``{"protocol": 5, "table": <uri>, "method": <name>,
  "arguments": {...}}``, the call's arguments by name. A ``publish`` or ``lease`` of a
  partitioned queue may add ``"partition": <k>``: the call then runs on that partition
  only (every row published to it; leased from it alone), as a client sends each
  partition's share to the broker that serves it (:mod:`spark_queue.broker.spread`).
  ``publish`` sends it as the ``do_put`` descriptor's command, with ``"upload": {"rows":
  <n>, "bytes": <n>}`` (what follows it), and its messages as Arrow record batches; every
  other method sends it as the body of a ``do_action`` whose type is the method's name, and
  so does a ``publish`` of bodies only, all strings, of at most :data:`INLINE_BODY_CHARS`
  (one message, say): its bodies in its arguments (``"bodies": [<str>, ...]``), no upload.
- A result: ``lease`` answers with its messages as one Arrow IPC stream; ``publish`` with
  the :class:`PublishResult` as JSON (``do_put``'s metadata), plus ``"rows"`` (how many
  came) and ``"not_stored"`` (the indices of those not stored: refused by a reject policy,
  duplicate ids, or all of an idempotent publish found committed); the rest with
  ``{"result": ...}`` as JSON.
- With a token, a client's first call is a hello and every other call carries its own
  proof of the token in its ``authorization`` header (:data:`TOKEN_HEADER`), both described
  in :mod:`spark_queue.broker.sessions`; a ``do_put`` and a stream of calls also open with
  a proof of their own, for their opening (:data:`PUT_OPENING`, ``broker.streams``'s
  ``STREAM_OPENING``) with no body, in :data:`OPENING_HEADER`, which the broker checks as
  the call starts, before any message of it arrives.
- An error raised by the table travels as a Flight error whose ``extra_info`` is
  ``{"error": <class name>, "message": <str(error)>, ...}``, so the client raises the same
  named class with the same message (cut to :data:`MAX_ERROR_BYTES`).

Pure functions, no I/O; safe from any thread.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
import pyarrow as pa

from spark_queue import errors
from spark_queue.errors import BrokerRequestError, QueueError
from spark_queue.model.partitions import MAX_PARTITIONS
from spark_queue.model.results import PublishOutcome, PublishResult

# 2: publish declares its upload; calls carry a proof of the token, never the token.
# 3: a hello binds the address dialed and the broker's challenge; each call its own proof.
# 4: stats names its queue ``queue``, as every other call does (it was ``name``).
# 5: publish and lease may name one partition of a partitioned queue (``partition``).
# 6: a publish of a few string bodies may go by do_action, its bodies in its arguments.
PROTOCOL = 6
# A publish whose rows are a list of strings adding up to at most this many characters goes
# by do_action with its bodies in the request: one message on the way and one back, where a
# do_put sends a schema, a record batch and an end of stream (~1.2x the calls a second, 0.1
# ms less of a client's CPU a call: docs/decisions/broker-publish-wire.md).
INLINE_BODY_CHARS = 16 * 1024
# The argument that carries such a publish's bodies.
BODIES = "bodies"
# The methods whose request may name one partition of its queue.
PARTITION_METHODS = ("publish", "lease")
# The Flight header that carries a call's proof of the token (broker.sessions).
TOKEN_HEADER = "authorization"
# The Flight header that carries a do_put's or a stream's proof of its opening: checked as
# the call starts, so that no peer without the token holds one of the broker's threads
# waiting for the call's first message.
OPENING_HEADER = "spark-queue-opening"
# What a do_put's opening proof is for, with an empty body (its descriptor, publish's
# request, carries a proof of its own in TOKEN_HEADER).
PUT_OPENING = "put"
# A ``do_action`` type that reports on the broker itself (id, table, requests served).
STATUS_ACTION = "broker-status"
# How the message of a request for another table starts: the client then commits directly
# (its record of the broker was stale, and another broker now has that address).
WRONG_TABLE = "wrong table"
# The QueueTable methods a broker runs. A request names its arguments as the method takes
# them (publish's queue arguments, its ``**arguments``, under "arguments"); the broker binds
# them to the method's signature, so a request fits whatever version of the method it runs.
ROUTED_METHODS = ("publish", "lease", "ack", "cancel", "expire", "extend", "release", "stats")
# QueueTable methods that travel as another: ``publish`` returns ``publish_outcome``'s result.
WIRE_NAMES = {"publish_outcome": "publish"}
# An error travels in gRPC's headers, which a client refuses above 16 KiB and may refuse
# above 8 KiB (it then takes the broker for unreachable): its extra_info (base64 in a
# trailer) carries the message cut to MAX_ERROR_BYTES UTF-8 bytes, the status's own message
# (percent-encoded, for clients that read no extra_info) the message cut to
# MAX_STATUS_MESSAGE_BYTES.
MAX_ERROR_BYTES = 4096
MAX_STATUS_MESSAGE_BYTES = 512
# Errors of the standard library a call raises for a value no parser of ours refused
# first, carried back as themselves: the caller gets what it would get without a broker.
_BUILTIN_ERRORS: dict[str, type[Exception]] = {"ValueError": ValueError, "TypeError": TypeError}


def same_table(first: str, second: str) -> bool:
    """Whether two table URIs name one table (local paths compared with links resolved)."""
    if "://" in first or "://" in second:
        return first.rstrip("/") == second.rstrip("/")
    return _resolved(first) == _resolved(second)


@functools.lru_cache(maxsize=256)
def _resolved(path: str) -> str:
    """A local path with its links resolved; cached, as a broker checks every request's
    table (a few system calls each) and its clients name the same few paths."""
    return os.path.realpath(path)


def encode_request(
    table: str,
    method: str,
    arguments: Mapping[str, Any],
    upload: Mapping[str, int] | None = None,
    partition: int | None = None,
) -> bytes:
    """The request for ``method`` with ``arguments`` (JSON values, numpy scalars taken as
    Python ones) on ``table``; ``upload``: publish's ``{"rows": n, "bytes": n}``;
    ``partition``: the one partition of the queue the call runs on (publish and lease).

    Raises:
        TypeError, ValueError: an argument is not a JSON value, or not a finite number (the
            caller then commits directly, so the table judges the value as it would
            without a broker).
    """
    request = {"protocol": PROTOCOL, "table": table, "method": method, "arguments": dict(arguments)}
    if upload is not None:
        request["upload"] = dict(upload)
    if partition is not None:
        request["partition"] = partition
    return json.dumps(
        request,
        default=_json_value,
        allow_nan=False,
    ).encode()


def _json_value(value: Any) -> Any:
    """numpy scalars as Python ones, for the request's JSON."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def decode_request(body: bytes, table: str) -> tuple[str, dict[str, Any], Any, int | None]:
    """The method, arguments, upload (what a publish declares of its messages, checked by
    :func:`checked_upload`; None where not given) and partition (None: the whole queue) of a
    request to the broker of ``table``.

    Raises:
        BrokerRequestError: the body is not a request of this protocol for this table, or
            names a method the broker does not serve (its arguments are checked by binding
            them to the method, :class:`~spark_queue.server.flight.QueueBroker`).
    """
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        # Beyond JSONDecodeError, Python's decoder refuses valid JSON nested too deeply
        # (RecursionError) or with a number of over 4300 digits (ValueError).
        raise BrokerRequestError(f"malformed request: not a JSON object ({error})") from None
    if not isinstance(request, dict):
        raise BrokerRequestError("malformed request: not a JSON object")
    if request.get("protocol") != PROTOCOL:
        raise BrokerRequestError(
            f"malformed request: protocol {request.get('protocol')!r}, this broker speaks "
            f"{PROTOCOL}"
        )
    given_table = request.get("table")
    if not isinstance(given_table, str) or not same_table(given_table, table):
        raise BrokerRequestError(
            f"{WRONG_TABLE}: this broker serves {table}, the request is for {given_table!r}"
        )
    method = request.get("method")
    if method not in ROUTED_METHODS:
        raise BrokerRequestError(
            f"malformed request: method {method!r} is not one of {', '.join(ROUTED_METHODS)}"
        )
    arguments = request.get("arguments")
    if not isinstance(arguments, dict):
        raise BrokerRequestError("malformed request: 'arguments' is not a JSON object")
    if "rows" in arguments or "self" in arguments:
        raise BrokerRequestError(f"malformed request: {method} takes no argument 'rows'/'self'")
    if method == "publish" and not isinstance(arguments.get("arguments", {}), dict):
        raise BrokerRequestError("malformed request: publish's 'arguments' is not an object")
    bodies = arguments.get(BODIES)
    if BODIES in arguments and not (
        method == "publish"
        and isinstance(bodies, list)
        and bodies
        and all(isinstance(body, str) for body in bodies)
    ):
        raise BrokerRequestError(
            f"malformed request: {BODIES!r} is a publish's list of string bodies; got "
            f"{trimmed(repr(bodies), 100)} for {method}"
        )
    partition = request.get("partition")
    if partition is not None and not (
        method in PARTITION_METHODS
        and type(partition) is int
        and 0 <= partition < MAX_PARTITIONS
        and isinstance(arguments.get("queue"), str)
    ):
        raise BrokerRequestError(
            f"malformed request: 'partition' names a partition (0 to {MAX_PARTITIONS - 1}) "
            f"of a publish's or lease's queue; got {trimmed(repr(partition), 100)} for "
            f"{method}"
        )
    return method, arguments, request.get("upload"), partition


def checked_upload(upload: Any) -> tuple[int, int]:
    """The rows and bytes a publish request declares (``decode_request``'s upload).

    Raises:
        BrokerRequestError: it declares none, or not as counts.
    """
    if not (
        isinstance(upload, dict)
        and upload.keys() == {"rows", "bytes"}
        and all(type(n) is int and n >= 0 for n in upload.values())
    ):
        raise BrokerRequestError(
            'malformed request: publish\'s "upload" must be {"rows": <count>, "bytes": '
            "<count>}, what the messages that follow add up to"
        )
    return upload["rows"], upload["bytes"]


def inline_bodies(rows: object) -> list[str] | None:
    """``rows`` as the bodies a publish request carries itself (:data:`BODIES`): a list or
    tuple of strings, at least one, of at most :data:`INLINE_BODY_CHARS` characters in all;
    None: they go as Arrow record batches."""
    if not isinstance(rows, list | tuple) or not rows:
        return None
    if any(type(body) is not str for body in rows) or sum(map(len, rows)) > INLINE_BODY_CHARS:
        return None
    return list(rows)


def encode_result(method: str, result: Any) -> bytes:
    """A call's result as the broker sends it (see the module's docstring); ``publish``'s
    is ``publish_outcome``'s."""
    if method == "lease":
        return table_to_ipc(result)
    if method == "publish":
        accepted = np.asarray(result.accepted, bool)
        not_stored = np.flatnonzero(~accepted).tolist() if not accepted.all() else []
        # Its fields as they are (asdict copies them deeply: ~40 us a call).
        answer = {**vars(result.result), "rows": len(accepted), "not_stored": not_stored}
        return json.dumps(answer).encode()
    return json.dumps({"result": result}).encode()


def decode_result(method: str, body: bytes) -> Any:
    """The result :func:`encode_result` encoded, as the QueueTable method returns it."""
    if method == "lease":
        return ipc_to_table(body)
    if method == "publish":
        answer = json.loads(body)
        accepted = np.ones(answer.pop("rows"), bool)
        not_stored = answer.pop("not_stored")
        if not_stored:
            accepted[not_stored] = False
        return PublishOutcome(PublishResult(**answer), accepted)
    return json.loads(body)["result"]


def table_to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def ipc_to_table(body: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(body)).read_all()


def trimmed(message: str, limit: int = MAX_ERROR_BYTES) -> str:
    """``message`` cut to at most ``limit`` UTF-8 bytes, saying so."""
    encoded = message.encode()
    if len(encoded) <= limit:
        return message
    kept = encoded[: limit - 60].decode(errors="ignore")
    return f"{kept} ... (cut: {len(message) - len(kept)} more characters)"


def encode_error(error: BaseException) -> bytes | None:
    """``error`` as the broker sends it back (its message :func:`trimmed`), or None where
    it is not the table's to report (an internal failure of the broker)."""
    name = type(error).__name__
    if isinstance(error, QueueError) and getattr(errors, name, None) is type(error):
        payload: dict[str, Any] = {"error": name, "message": trimmed(str(error))}
        if isinstance(error, errors.QueueNotFoundError):
            payload["queue"] = trimmed(str(error.queue))
        return json.dumps(payload, ensure_ascii=False).encode()
    if _BUILTIN_ERRORS.get(name) is type(error):
        payload = {"error": name, "message": trimmed(str(error))}
        return json.dumps(payload, ensure_ascii=False).encode()
    return None


def decode_error(extra_info: bytes) -> Exception | None:
    """The error :func:`encode_error` encoded, of the same class with the same message;
    None where ``extra_info`` is not one."""
    try:
        payload = json.loads(extra_info)
        name, message = payload["error"], payload["message"]
    except (ValueError, TypeError, KeyError):
        return None
    kind = _BUILTIN_ERRORS.get(name) or getattr(errors, name, None)
    if not (isinstance(kind, type) and issubclass(kind, Exception)) or not isinstance(message, str):
        return None
    if kind is errors.QueueNotFoundError:
        # Its constructor builds the message from the table's queues: set it as it came.
        error = kind.__new__(kind)
        Exception.__init__(error, message)
        error.queue = payload.get("queue")
        return error
    if kind is errors.TableNotFoundError:  # its constructor builds the message from the path
        return errors._restored(kind, (message,), {})
    return kind(message)


@functools.cache
def signature_of(method: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature(method)``, computed once per method (a bound method: once per
    object and method): ~0.15 ms a call otherwise, on every request the broker serves and
    every call a client sends it."""
    return inspect.signature(method)


@functools.cache
def _parameters_of(
    method: Callable[..., Any],
) -> tuple[tuple[str, ...], frozenset[str], str | None]:
    """What :func:`bind_arguments` needs of ``method``'s signature: its parameters' names in order,
    the names a call must give, and the name of its ``**`` parameter (None where it has
    none); ``()`` names where a ``*`` parameter or a positional-only one leaves the
    binding to :meth:`inspect.Signature.bind`."""
    parameters = signature_of(method).parameters.values()
    kinds = {parameter.kind for parameter in parameters}
    if kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY}:
        return (), frozenset(), None
    var_keyword = next(
        (p.name for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD), None
    )
    names = tuple(p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD)
    required = frozenset(
        p.name for p in parameters if p.default is inspect.Parameter.empty and p.name in names
    )
    return names, required, var_keyword


def bind_arguments(method: Callable[..., Any], *args: Any, **kwargs: Any) -> inspect.BoundArguments:
    """``signature_of(method).bind(*args, **kwargs)``, the same arguments in the same order,
    in a few microseconds where the call is a plain one (positional arguments then keywords
    the signature names, or its ``**`` takes): ``bind`` walks every parameter's kind, ~30
    us a call on each side of a broker. Anything else goes to ``bind``, which raises the
    same ``TypeError``."""
    names, required, var_keyword = _parameters_of(method)
    signature = signature_of(method)
    if not names or len(args) > len(names):
        return signature.bind(*args, **kwargs)
    arguments: dict[str, Any] = dict(zip(names, args, strict=False))  # fewer args than names
    extra: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name in arguments:
            return signature.bind(*args, **kwargs)  # given twice: bind's error
        if name in names:
            arguments[name] = value
        elif var_keyword is not None:
            extra[name] = value
        else:
            return signature.bind(*args, **kwargs)  # an unknown keyword: bind's error
    if not required <= arguments.keys():
        return signature.bind(*args, **kwargs)  # one missing: bind's error
    ordered = {name: arguments[name] for name in names if name in arguments}
    if extra:
        ordered[cast(str, var_keyword)] = extra
    return inspect.BoundArguments(signature, ordered)
