"""The client side of a queue broker: which calls of a :class:`~spark_queue.QueueTable` go
to a broker, and how (docs/BROKER.md).

Every ``QueueTable`` has a :class:`BrokerRouter`. Its methods marked :func:`routed`
(publish, lease, ack, cancel, expire, extend, release, stats) ask the router where to run:

- ``broker="off"``: here, always (what the broker's own table does);
- ``broker="auto"`` (the default, or ``$SPARK_QUEUE_BROKER``): at the live broker the table
  records (:mod:`spark_queue.discovery`), looked up at most every 2 seconds; with none,
  here;
- ``broker="host:port"``: at that broker (``"tls://host:port"``: over TLS).

A broker that cannot be reached (refused, stopped, killed, timed out) is skipped for a few
seconds and the call runs here, so a broker is never a single point of failure. A call the
broker answered with an error raises that error, of the class and with the message the
table raised there. A wrong token raises :class:`BrokerAuthenticationError` (never falls
back: a misconfigured client should be told).

Thread-safe: one router serves every thread of its ``QueueTable``; a Flight client (a gRPC
channel) serves concurrent calls. Not fork-safe, like the rest of ``QueueTable``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa

from spark_queue.arguments import parse_seqs
from spark_queue.discovery import live_broker
from spark_queue.errors import (
    BrokerAuthenticationError,
    BrokerRequestError,
    InvalidOptionError,
    QueueError,
)
from spark_queue.messages import as_input_table
from spark_queue.options import check_queue_name
from spark_queue.storage import Location
from spark_queue.wire import (
    ROUTED_METHODS,
    STATUS_ACTION,
    TOKEN_HEADER,
    WIRE_NAMES,
    WRONG_TABLE,
    decode_error,
    decode_result,
    encode_request,
    signature_of,
)

MODE_ENV_VAR = "SPARK_QUEUE_BROKER"
TOKEN_ENV_VAR = "SPARK_QUEUE_BROKER_TOKEN"
TLS_ROOTS_ENV_VAR = "SPARK_QUEUE_BROKER_TLS_ROOTS"
TLS_PREFIX = "tls://"  # a broker address to reach over TLS
AUTO, OFF = "auto", "off"
# How long a lookup of the table's broker records is trusted: a new broker is used, and a
# stopped one left, within about this long (plus its heartbeat's staleness).
DISCOVERY_SECONDS = 2.0
# A broker that could not be reached is not tried again for this long.
RETRY_AFTER_SECONDS = 5.0
# The longest a call waits for a broker's answer before committing here instead: a commit
# that loses races retries for up to ~20 s (transaction.run), so well above that.
CALL_TIMEOUT_SECONDS = 120.0
# Publish sends its messages in record batches of at most this many rows, so that the
# broker can refuse a request over its size limit before it has all of it.
PUBLISH_BATCH_ROWS = 4096

T = TypeVar("T")
log = logging.getLogger(__name__)


class BrokerUnreachable(Exception):
    """A broker did not answer (internal: the router then runs the call here)."""


def parse_mode(value: str | None) -> str:
    """``auto``, ``off``, or a broker's address: ``host:port`` (plain gRPC) or
    ``tls://host:port`` (gRPC over TLS); None: ``$SPARK_QUEUE_BROKER``, else ``auto``.

    Raises:
        InvalidOptionError: anything else.
    """
    given = os.environ.get(MODE_ENV_VAR, AUTO) if value is None else value
    mode = given.strip().lower() if isinstance(given, str) else ""
    if mode in (AUTO, OFF):
        return mode
    host, sep, port = mode.removeprefix(TLS_PREFIX).rpartition(":")
    if sep and host and port.isdigit() and 0 < int(port) < 65536:
        return mode
    raise InvalidOptionError(
        f"broker must be 'auto', 'off', 'host:port' or 'tls://host:port' (say "
        f"'127.0.0.1:8815'); got {given!r}"
    )


def _tls_roots() -> bytes | None:
    """The certificates a client trusts for a broker's TLS: ``$SPARK_QUEUE_BROKER_TLS_ROOTS``
    (a PEM file), else the system's.

    Raises:
        InvalidOptionError: the variable names a file that cannot be read.
    """
    path = os.environ.get(TLS_ROOTS_ENV_VAR)
    if not path:
        return None
    try:
        with open(path, "rb") as source:
            return source.read()
    except OSError as error:
        raise InvalidOptionError(
            f"${TLS_ROOTS_ENV_VAR} names {path!r}, which cannot be read: {error.strerror}"
        ) from None


class BrokerClient:
    """Calls to one broker at ``address`` (``host:port``, or ``tls://host:port`` over TLS,
    checked against :func:`_tls_roots`) for the table ``table``.

    Thread-safe. The token travels in a header of each call and is kept in no message.
    """

    def __init__(self, address: str, table: str, token: str | None) -> None:
        # Imported here: a QueueTable that never meets a broker needs no Flight (some
        # builds of pyarrow leave it out, and it costs ~40 ms to import).
        import pyarrow.flight as flight

        self.address = address
        self.table = table
        if address.startswith(TLS_PREFIX):
            location = f"grpc+tls://{address.removeprefix(TLS_PREFIX)}"
            self._client = flight.FlightClient(location, tls_root_certs=_tls_roots())
        else:
            self._client = flight.FlightClient(f"grpc://{address}")
        headers = [(TOKEN_HEADER.encode(), f"Bearer {token}".encode())] if token else []
        self._options = flight.FlightCallOptions(timeout=CALL_TIMEOUT_SECONDS, headers=headers)

    def __repr__(self) -> str:
        return f"BrokerClient({self.address!r}, {self.table!r})"

    def call(self, method: str, request: bytes, rows: pa.Table | None = None) -> Any:
        """Run ``method`` at the broker: ``request`` as :func:`wire_request` encodes it,
        ``rows`` publish's messages.

        Raises:
            BrokerUnreachable: no answer (the request may or may not have been applied).
            BrokerAuthenticationError: the broker refused the token.
            Exception: the error the table raised at the broker (same class and message),
                or a :class:`BrokerRequestError` / :class:`BrokerError` of the broker.
        """
        import pyarrow.flight as flight

        try:
            if rows is None:
                action = flight.Action(method, request)
                body = next(iter(self._client.do_action(action, self._options))).body
            else:
                body = self._put(request, rows)
        except flight.FlightUnauthenticatedError:
            raise BrokerAuthenticationError(
                f"the broker at {self.address} refused this client's token (missing or "
                f"wrong): give the broker's token (broker_token= or ${TOKEN_ENV_VAR}), or "
                f"broker='off' to commit directly"
            ) from None
        except flight.FlightError as error:
            decoded = decode_error(error.extra_info) if error.extra_info else None
            if decoded is None or (
                isinstance(decoded, BrokerRequestError) and str(decoded).startswith(WRONG_TABLE)
            ):
                raise BrokerUnreachable(f"the broker at {self.address}: {_short(error)}") from None
            raise decoded from None
        except pa.ArrowException as error:  # an answer cut short
            raise BrokerUnreachable(f"the broker at {self.address}: {error}") from None
        return decode_result(method, body.to_pybytes())

    def _put(self, request: bytes, rows: pa.Table) -> pa.Buffer:
        """Send a publish by ``do_put``; the broker's answer.

        Raises:
            BrokerUnreachable: the call ended without an answer.
            pyarrow.flight.FlightError, pyarrow.ArrowException: as :meth:`call` handles.
        """
        import pyarrow.flight as flight

        descriptor = flight.FlightDescriptor.for_command(request)
        writer, answers = self._client.do_put(descriptor, rows.schema, self._options)
        try:
            writer.write_table(rows, max_chunksize=PUBLISH_BATCH_ROWS)
            writer.done_writing()
            body = answers.read()
        except BaseException:
            writer.close()  # raises the broker's error, where it sent one
            raise
        if body is None:
            writer.close()  # raises the broker's error, where it sent one
            raise BrokerUnreachable(f"the broker at {self.address} sent no result")
        try:
            writer.close()
        except (flight.FlightError, pa.ArrowException) as error:
            # The broker answers only once the publish has committed: an answer in hand is
            # the result, whatever closing the call says (a stopping broker may have closed
            # the connection by then). Running it again here would enqueue it twice.
            log.debug("the broker at %s answered, then: %s", self.address, _short(error))
        return body

    def status(self) -> dict[str, Any]:
        """The broker's own report: id, table, requests served and failed."""
        import pyarrow.flight as flight

        action = flight.Action(STATUS_ACTION, b"")
        return json.loads(
            next(iter(self._client.do_action(action, self._options))).body.to_pybytes()
        )


def _short(error: Exception) -> str:
    """A Flight error's message without gRPC's debug context (a line of internals)."""
    return str(error).split(". gRPC client debug context")[0]


def wire_request(
    table: str, method: str, arguments: dict[str, Any]
) -> tuple[bytes, pa.Table | None]:
    """A call's bound arguments as the request that carries them (encoded once: a
    one-message publish is a small request, where encoding is a good part of a client's
    work), and publish's rows as Arrow.

    Raises:
        QueueError, TypeError, ValueError: a value the request cannot carry as the table
            would take it (the caller then runs the call here, where the table judges it).
    """
    given = dict(arguments)
    rows = None
    if method == "publish":
        check_queue_name("queue", given["queue"])
        rows = as_input_table(given.pop("rows"))
        if not given.get("arguments", True):
            del given["arguments"]  # no queue arguments given
    if given.get("seqs") is not None:
        given["seqs"] = parse_seqs("seqs", given["seqs"]).tolist()
    return encode_request(table, method, given), rows


class BrokerRouter:
    """Where the calls of one ``QueueTable`` on ``location`` run: at a broker or here.

    Args:
        location: the table.
        mode: ``auto``, ``off`` or ``host:port`` (see the module's docstring).
        token: the broker's token; None: ``$SPARK_QUEUE_BROKER_TOKEN``, if set.

    Raises:
        InvalidOptionError: an invalid ``mode``.
    """

    def __init__(self, location: Location, mode: str | None, token: str | None) -> None:
        self.location = location
        self.mode = parse_mode(mode)
        self._token = token if token is not None else os.environ.get(TOKEN_ENV_VAR) or None
        self._forget()

    def _forget(self) -> None:
        """Start with no clients and nothing looked up or skipped."""
        self._lock = threading.Lock()
        self._clients: dict[str, BrokerClient] = {}
        self._found: tuple[float, Any] | None = None  # (when looked up, record or None)
        self._skipped: dict[str, float] = {}  # broker id or address -> when to try again

    def __repr__(self) -> str:  # never the token
        return f"BrokerRouter({self.location.uri!r}, mode={self.mode!r})"

    def __getstate__(self) -> dict[str, Any]:
        # A QueueTable pickles (as its QueueStore does); locks and gRPC channels do not.
        return {"location": self.location, "mode": self.mode, "_token": self._token}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._forget()

    def current(self) -> tuple[str, BrokerClient, int | None] | None:
        """The broker a call goes to now: its key (id or address), its client and its
        request size limit where known; None: run here."""
        if self.mode == OFF:
            return None
        now = time.monotonic()
        with self._lock:
            if self.mode != AUTO:
                if self._skipped.get(self.mode, 0.0) > now:
                    return None
                return self.mode, self._client(self.mode), None
            if self._found is None or now - self._found[0] > DISCOVERY_SECONDS:
                skipped = {key for key, until in self._skipped.items() if until > now}
                try:
                    record = live_broker(self.location, skipped)
                except Exception as error:
                    # Best effort: a lookup that fails, whatever the store raised, means a
                    # direct call, which reports the store's error itself.
                    log.debug("broker lookup in %s failed: %s", self.location.uri, error)
                    record = None
                self._found = (now, record)
            record = self._found[1]
            if record is None or self._skipped.get(record.id, 0.0) > now:
                return None
            address = f"{TLS_PREFIX}{record.address}" if record.tls else record.address
            return record.id, self._client(address), record.max_request_bytes

    def address(self) -> str | None:
        """The address of the broker a call would go to now; None: it would run here."""
        route = self.current()
        return None if route is None else route[1].address

    def _client(self, address: str) -> BrokerClient:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = BrokerClient(address, self.location.uri, self._token)
        return client

    def _skip(self, key: str) -> None:
        with self._lock:
            self._skipped[key] = time.monotonic() + RETRY_AFTER_SECONDS
            self._found = None

    def call(
        self,
        method_name: str,
        method: Callable[..., T],
        table: Any,
        args: tuple,
        kwargs: dict[str, Any],
    ) -> T:
        """``method(table, *args, **kwargs)``, at the current broker or here."""
        route = self.current()
        if route is None:
            return method(table, *args, **kwargs)
        key, client, limit = route
        # Only the arguments given: the broker's method fills in its own defaults.
        bound = signature_of(method).bind(table, *args, **kwargs)
        arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
        try:
            request, rows = wire_request(client.table, method_name, arguments)
        except (QueueError, TypeError, ValueError):
            return method(table, *args, **kwargs)  # the table raises its own error
        # What the broker weighs against its limit: the request and the rows.
        size = len(request) + (rows.nbytes if rows is not None else 0)
        if limit is not None and size > limit:
            return method(table, *args, **kwargs)  # too large for the broker: no gain there
        try:
            return client.call(method_name, request, rows)
        except BrokerUnreachable as error:
            log.warning("%s; committing directly for %.0f s", error, RETRY_AFTER_SECONDS)
            self._skip(key)
            return method(table, *args, **kwargs)


def routed(method: Callable[..., T]) -> Callable[..., T]:
    """Mark a ``QueueTable`` method as one a broker may run for it (``self.router``)."""
    name = WIRE_NAMES.get(method.__name__, method.__name__)
    if name not in ROUTED_METHODS:
        raise TypeError(f"{name} is not a method the broker serves")

    @functools.wraps(method)
    def call(table: Any, *args: Any, **kwargs: Any) -> T:
        return table.router.call(name, method, table, args, kwargs)

    return call
