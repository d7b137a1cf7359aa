"""The client side of a queue broker: which calls of a :class:`~spark_queue.QueueTable` go
to a broker, and how (docs/BROKER.md).

Every ``QueueTable`` has a :class:`BrokerRouter`. Its methods marked :func:`routed`
(publish, lease, ack, cancel, expire, extend, release, stats) ask the router where to run:

- ``broker="off"``: here, always (what the broker's own table does);
- ``broker="auto"`` (the default, or ``$SPARK_QUEUE_BROKER``): at the live broker the table
  records (:mod:`spark_queue.broker.discovery`), looked up at most every 2 seconds; with none,
  here. Where several are live, a partitioned queue's calls are split by partition, each
  share at the broker that serves its partition (:mod:`spark_queue.broker.spread`);
- ``broker="host:port"``: at that broker (``"tls://host:port"``: over TLS).

A broker that cannot be reached (refused, stopped, killed, timed out) is skipped for a few
seconds and the call runs here, so a broker is never a single point of failure. A call the
broker answered with an error raises that error, of the class and with the message the
table raised there. A wrong token for a broker given by address raises
:class:`BrokerAuthenticationError` (never falls back: a misconfigured client should be told).

Whom a client trusts (docs/BROKER.md "Security"): a client with a token uses only records
signed with it, and sends a broker nothing before the broker proved that it holds the token,
for a fresh nonce and the address the client dialed; each call then carries a fresh proof of
its own (:mod:`spark_queue.broker.sessions`); the token itself never travels. A client
without a token uses only records of brokers without one, on this machine's loopback.

Thread-safe: one router serves every thread of its ``QueueTable``; a Flight client (a gRPC
channel) serves concurrent calls. Not fork-safe, like the rest of ``QueueTable``.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

import pyarrow as pa

from spark_queue.broker.auth import check_token, new_nonce, token_key
from spark_queue.broker.batching import batcher_of
from spark_queue.broker.discovery import BrokerRecord, distrust, live_brokers
from spark_queue.broker.sessions import HELLO_ACTION, ClientSession, hello_body, open_session
from spark_queue.broker.spread import NOT_SPREAD, SPREAD_METHODS, spread_call
from spark_queue.broker.streams import STREAM_OPENING, CallStreams, StreamsNotServed
from spark_queue.broker.wire import (
    BODIES,
    OPENING_HEADER,
    PUT_OPENING,
    ROUTED_METHODS,
    STATUS_ACTION,
    TOKEN_HEADER,
    WIRE_NAMES,
    WRONG_TABLE,
    bind_arguments,
    decode_error,
    decode_result,
    encode_request,
    inline_bodies,
)
from spark_queue.errors import (
    BrokerAuthenticationError,
    BrokerRequestError,
    InvalidOptionError,
    QueueError,
)
from spark_queue.model.arguments import parse_seqs
from spark_queue.model.messages import as_input_table
from spark_queue.model.partition_calls import one_partition
from spark_queue.model.queue_arguments import check_queue_name
from spark_queue.storage.location import Location

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
Route = tuple[str, "BrokerClient", "int | None"]  # a broker's key, client and request limit
log = logging.getLogger(__name__)


class BrokerUnreachable(Exception):
    """A broker did not answer (internal: the router then runs the call here)."""


def token_of(token: str | None, mode: str) -> str | None:
    """The client's token: ``token``, else ``$SPARK_QUEUE_BROKER_TOKEN`` where set and not
    empty and ``mode`` may use a broker; None: no token.

    Raises:
        InvalidOptionError: a token that is not printable ASCII, or blank (named as given).
    """
    if token is not None:
        return check_token(token, "broker_token")
    if mode == OFF:
        return None  # (a broker's own table, say: the variable is the broker's token)
    given = os.environ.get(TOKEN_ENV_VAR)
    return check_token(given, f"${TOKEN_ENV_VAR}") if given else None


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

    With a token, the first call opens a session: it asks the broker to prove it holds the
    token, for a fresh nonce and this address (the broker ``broker_id`` where given: the one
    a record names), and sends nothing else to a broker that does not; each call then
    carries a proof of its own. The token itself never travels.

    Thread-safe.
    """

    def __init__(
        self, address: str, table: str, token: str | None, broker_id: str | None = None
    ) -> None:
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
        self._key = None if token is None else token_key(check_token(token, "broker_token"))
        self._broker_id = broker_id
        self._lock = threading.Lock()
        self._bare = flight.FlightCallOptions(timeout=CALL_TIMEOUT_SECONDS)
        self._session: ClientSession | None = None  # with a token: once the broker proved it
        # Each thread's calls but publish's uploads go on a stream of its own, each with its
        # proof where the broker has a token.
        self._streams = CallStreams(self._client, CALL_TIMEOUT_SECONDS, self._stream_opening)
        # Publishes that travel as calls, of threads of the process that call together,
        # share messages (the batcher of every client of this broker, table and trust).
        self._publishes = batcher_of(
            address, table, self._key, broker_id, os.environ.get(TLS_ROOTS_ENV_VAR)
        )

    def __repr__(self) -> str:
        return f"BrokerClient({self.address!r}, {self.table!r})"

    def _options(
        self, method: str, body: bytes, uploads: bool, stale: ClientSession | None = None
    ) -> tuple[Any, ClientSession | None, str | None]:
        """The options of one call of ``method`` carrying ``body``: with a token, its proof
        in its headers (and, where it ``uploads`` rows by ``do_put``, the proof of a put's
        opening, which the broker checks as the call starts), in the session open with the
        broker (opened first where there is none, or where it is ``stale``: the broker at
        the address refused a call of it); that session; and the proof (None: no token),
        which a call on a stream carries instead.

        Raises:
            BrokerAuthenticationError: the broker did not prove it holds the token.
            pyarrow.flight.FlightError, pyarrow.ArrowException: as :meth:`call` handles.
        """
        import pyarrow.flight as flight

        if self._key is None:
            return self._bare, None, None
        session = self._session_with(self._key, stale)
        header = session.header(method, body)
        headers = [(TOKEN_HEADER.encode(), header.encode())]
        if uploads:
            headers.append(_opening(session, PUT_OPENING))
        options = flight.FlightCallOptions(timeout=CALL_TIMEOUT_SECONDS, headers=headers)
        return options, session, header

    def _stream_opening(self) -> list[tuple[bytes, bytes]]:
        """The headers a stream of calls opens with: its own proof (:data:`STREAM_OPENING`)
        where the broker has a token, in the session of the call that opens it."""
        if self._key is None:
            return []
        return [_opening(self._session_with(self._key), STREAM_OPENING)]

    def _session_with(self, key: bytes, stale: ClientSession | None = None) -> ClientSession:
        """The session open with the broker, opened first where there is none, or where it
        is ``stale`` (the broker at the address refused a call of it)."""
        with self._lock:
            if self._session is None or self._session is stale:
                self._session = self._hello(key)
            return self._session

    def _hello(self, key: bytes) -> ClientSession:
        """A session with the broker at this address, once it proved it holds the token.

        Raises:
            BrokerAuthenticationError: it did not.
        """
        import pyarrow.flight as flight

        nonce, target = new_nonce(), self.address.removeprefix(TLS_PREFIX)
        action = flight.Action(HELLO_ACTION, hello_body(nonce, target))
        refusal = ""
        try:
            answer = next(iter(self._client.do_action(action, self._bare))).body.to_pybytes()
        except flight.FlightUnauthenticatedError as error:  # not at an address of its own
            answered = _short(error).split(". Detail: ")[0][:300]
            answer, refusal = b"", f": it answered {answered!r}"
        session = open_session(key, target, nonce, answer, self._broker_id)
        if session is None:
            raise BrokerAuthenticationError(
                f"the broker at {self.address} did not prove that it holds this client's "
                f"token for this address{refusal} (a wrong token, a relay at another "
                f"address, or not the broker its record names); nothing was sent to it: give "
                f"the broker's token (broker_token= or ${TOKEN_ENV_VAR}), or broker='off' to "
                f"commit directly"
            )
        return session

    def call(self, method: str, request: bytes, rows: pa.Table | None = None) -> Any:
        """Run ``method`` at the broker: ``request`` as :func:`wire_request` encodes it,
        ``rows`` publish's messages as Arrow (None: the request carries them, or none).

        Raises:
            BrokerUnreachable: no answer (the request may or may not have been applied).
            BrokerAuthenticationError: the broker refused the token.
            Exception: the error the table raised at the broker (same class and message),
                or a :class:`BrokerRequestError` / :class:`BrokerError` of the broker.
        """
        import pyarrow.flight as flight

        uploads = rows is not None
        try:
            options, session, proof = self._options(method, request, uploads)
            try:
                body = self._send(method, request, rows, options, proof)
            except flight.FlightUnauthenticatedError:
                if self._key is None:
                    raise
                # Refused undone: the broker at the address may have restarted since it
                # proved itself (it has a new id), or this session's clock drifted from
                # its. Open a new session, once.
                options, _, proof = self._options(method, request, uploads, stale=session)
                body = self._send(method, request, rows, options, proof)
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

    def _send(
        self, method: str, request: bytes, rows: pa.Table | None, options: Any, proof: str | None
    ) -> Any:
        import pyarrow.flight as flight

        if rows is None:
            if self._streams.served:
                try:
                    if method == "publish":
                        return self._publishes.call((method, proof, request), self._streams)
                    return self._streams.call(method, proof, request)
                except StreamsNotServed:
                    pass  # nothing was read, its proof unused: it goes as an RPC
            action = flight.Action(method, request)
            return next(iter(self._client.do_action(action, options))).body
        return self._put(request, rows, options)

    def _put(self, request: bytes, rows: pa.Table, options: Any) -> pa.Buffer:
        """Send a publish by ``do_put``; the broker's answer.

        Raises:
            BrokerUnreachable: the call ended without an answer.
            pyarrow.flight.FlightError, pyarrow.ArrowException: as :meth:`call` handles.
        """
        import pyarrow.flight as flight

        descriptor = flight.FlightDescriptor.for_command(request)
        writer, answers = self._client.do_put(descriptor, rows.schema, options)
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
        options, _, _ = self._options(STATUS_ACTION, b"", uploads=False)
        status: dict[str, Any] = json.loads(
            next(iter(self._client.do_action(action, options))).body.to_pybytes()
        )
        return status


def _opening(session: ClientSession, opening: str) -> tuple[bytes, bytes]:
    """The header of a ``do_put``'s or a stream's own proof, for its ``opening`` (no body)."""
    return OPENING_HEADER.encode(), session.header(opening, b"").encode()


def _short(error: Exception) -> str:
    """A Flight error's message without gRPC's debug context (a line of internals)."""
    return str(error).split(". gRPC client debug context")[0]


def wire_request(
    table: str, method: str, arguments: dict[str, Any], partition: int | None = None
) -> tuple[bytes, pa.Table | None]:
    """A call's bound arguments as the request that carries them (encoded once: a
    one-message publish is a small request, where encoding is a good part of a client's
    work), and publish's rows as Arrow (None where the request carries its bodies itself:
    :func:`~spark_queue.broker.wire.inline_bodies`); ``partition``: the one partition of the
    queue it runs on.

    Raises:
        QueueError, TypeError, ValueError: a value the request cannot carry as the table
            would take it (the caller then runs the call here, where the table judges it).
    """
    given = dict(arguments)
    rows = upload = None
    if method == "publish":
        check_queue_name("queue", given["queue"])
        given_rows = given.pop("rows")
        if not given.get("arguments", True):
            del given["arguments"]  # no queue arguments given
        bodies = inline_bodies(given_rows)
        if bodies is not None:
            given[BODIES] = bodies
        else:
            rows = as_input_table(given_rows)
            # What the broker checks the upload against: a cut-off one is refused, not stored.
            upload = {"rows": rows.num_rows, "bytes": rows.nbytes}
    if given.get("seqs") is not None:
        given["seqs"] = parse_seqs("seqs", given["seqs"]).tolist()
    return encode_request(table, method, given, upload, partition), rows


class BrokerRouter:
    """Where the calls of one ``QueueTable`` on ``location`` run: at a broker or here.

    Args:
        location: the table.
        mode: ``auto``, ``off`` or ``host:port`` (see the module's docstring).
        token: the broker's token; None: ``$SPARK_QUEUE_BROKER_TOKEN``, if set. Kept out
            of pickles: an unpickled router takes ``$SPARK_QUEUE_BROKER_TOKEN``.

    Raises:
        InvalidOptionError: an invalid ``mode``, or a token that is not printable ASCII or
            is blank.
    """

    def __init__(self, location: Location, mode: str | None, token: str | None) -> None:
        self.location = location
        self.mode = parse_mode(mode)
        self._token = token_of(token, self.mode)
        self._key = None if self._token is None else token_key(self._token)
        self._forget()

    def _forget(self) -> None:
        """Start with no clients and nothing looked up or skipped."""
        self._lock = threading.Lock()
        self._clients: dict[str, BrokerClient] = {}
        self._found: tuple[float, list[BrokerRecord]] | None = None  # (when, live records)
        self._skipped: dict[str, float] = {}  # broker id or address -> when to try again
        self._distrusted: set[str] = set()  # ids of the records ignored (warned of once)

    def __repr__(self) -> str:  # never the token
        return f"BrokerRouter({self.location.uri!r}, mode={self.mode!r})"

    def __getstate__(self) -> dict[str, Any]:
        # A QueueTable pickles (as its QueueStore does); locks and gRPC channels do not,
        # and the token is not written where a pickle may go.
        return {"location": self.location, "mode": self.mode}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._token = token_of(None, self.mode)
        self._key = None if self._token is None else token_key(self._token)
        self._forget()

    def _trusts(self, record: BrokerRecord) -> bool:
        """Whether this client may send its calls to the broker of ``record``
        (:func:`~spark_queue.broker.discovery.distrust`); a record ignored is logged once."""
        why = distrust(record, self._key)
        if why is not None and record.id not in self._distrusted:
            self._distrusted.add(record.id)
            log.warning(
                # Not "committing directly": another record may be trusted and used.
                "ignoring the broker record %s in %s (%s, says %s): %s",
                record.id,
                self.location.uri,
                record.address,
                "a token" if record.token_required else "no token",
                why,
            )
        return why is None

    def live(self) -> list[BrokerRecord]:
        """In ``auto``, the live brokers the table records that this client trusts and is
        not skipping, the first started first (looked up at most every
        :data:`DISCOVERY_SECONDS`); else none."""
        if self.mode != AUTO:
            return []
        now = time.monotonic()
        with self._lock:
            if self._found is None or now - self._found[0] > DISCOVERY_SECONDS:
                skipped = {key for key, until in self._skipped.items() if until > now}
                try:
                    records = live_brokers(self.location, skipped, self._trusts)
                except Exception as error:
                    # Best effort: a lookup that fails, whatever the store raised, means a
                    # direct call, which reports the store's error itself.
                    log.debug("broker lookup in %s failed: %s", self.location.uri, error)
                    records = []
                self._found = (now, records)
            return [r for r in self._found[1] if self._skipped.get(r.id, 0.0) <= now]

    def current(self) -> Route | None:
        """The broker a call goes to now (a partitioned queue's shares aside: :meth:`call`):
        its key (id or address), its client and its request size limit where known; None:
        run here."""
        if self.mode == OFF:
            return None
        if self.mode != AUTO:
            with self._lock:
                if self._skipped.get(self.mode, 0.0) > time.monotonic():
                    return None
                return self.mode, self._client(self.mode), None
        records = self.live()
        return self._route(records[0]) if records else None

    def _route(self, record: BrokerRecord) -> Route:
        address = f"{TLS_PREFIX}{record.address}" if record.tls else record.address
        with self._lock:
            return record.id, self._client(address, record.id), record.max_request_bytes

    def address(self) -> str | None:
        """The address of the broker a call would go to now; None: it would run here."""
        route = self.current()
        return None if route is None else route[1].address

    def _client(self, address: str, broker_id: str | None = None) -> BrokerClient:
        """The client of the broker at ``address`` (``broker_id``: the one a record names,
        which must prove it is that one)."""
        key = f"{address} {broker_id}"
        client = self._clients.get(key)
        if client is None:
            client = BrokerClient(address, self.location.uri, self._token, broker_id)
            self._clients[key] = client
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
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        """``method(table, *args, **kwargs)``, at the current broker or here; a partitioned
        queue's shares, where several brokers are live, each at its partition's broker
        (:mod:`spark_queue.broker.spread`)."""
        if method_name in SPREAD_METHODS:
            records = self.live()
            if len(records) > 1:
                spread = spread_call(self, records, method_name, method, table, args, kwargs)
                if spread is not NOT_SPREAD:
                    return cast(T, spread)
        route = self.current()
        if route is None:
            return method(table, *args, **kwargs)
        # Only the arguments given: the broker's method fills in its own defaults.
        return self.send(route, method_name, method, bind_arguments(method, table, *args, **kwargs))

    def send_share(
        self,
        record: BrokerRecord,
        method_name: str,
        method: Callable[..., T],
        table: Any,
        bound: inspect.BoundArguments,
        partition: int | None,
    ) -> T:
        """A share of a call on a partitioned queue, at ``record``'s broker (on
        ``partition`` where given), else here (:meth:`send`)."""
        return self.send(self._route(record), method_name, method, bound, partition)

    def send(
        self,
        route: Route,
        method_name: str,
        method: Callable[..., T],
        bound: inspect.BoundArguments,
        partition: int | None = None,
    ) -> T:
        """``method`` with ``bound`` (its ``self`` the table) at the broker of ``route``,
        on ``partition`` of the queue where given; here where the broker is not to be used
        for it (too large for it, or arguments the request cannot carry) or cannot be
        reached (then it is skipped for :data:`RETRY_AFTER_SECONDS`)."""
        key, client, limit = route

        def here() -> T:
            if partition is None:
                return method(*bound.args, **bound.kwargs)
            with one_partition(partition):
                return method(*bound.args, **bound.kwargs)

        arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
        try:
            request, rows = wire_request(client.table, method_name, arguments, partition)
        except (QueueError, TypeError, ValueError):
            return here()  # the table raises its own error
        # What the broker weighs against its limit: the request and the rows.
        size = len(request) + (rows.nbytes if rows is not None else 0)
        if limit is not None and size > limit:
            return here()  # too large for the broker: no gain there
        try:
            # The broker ran the method: its result, decoded as the method returns it.
            return cast(T, client.call(method_name, request, rows))
        except BrokerAuthenticationError as error:
            if self.mode != AUTO:
                raise
            # A record signed with the token names this broker, but what answers at its
            # address cannot prove it holds the token: nothing was sent to it.
            log.warning("%s; committing directly for %.0f s", error, RETRY_AFTER_SECONDS)
            self._skip(key)
            return here()
        except BrokerUnreachable as error:
            log.warning("%s; committing directly for %.0f s", error, RETRY_AFTER_SECONDS)
            self._skip(key)
            return here()


Params = ParamSpec("Params")


def routed(method: Callable[Params, T]) -> Callable[Params, T]:
    """Mark a ``QueueTable`` method as one a broker may run for it (``self.router``); its
    signature stays the method's."""
    name = WIRE_NAMES.get(method.__name__, method.__name__)
    if name not in ROUTED_METHODS:
        raise TypeError(f"{name} is not a method the broker serves")

    @functools.wraps(method)
    def call(*args: Params.args, **kwargs: Params.kwargs) -> T:
        table: Any = args[0]  # the QueueTable the method is called on
        router: BrokerRouter = table.router
        return router.call(name, method, table, args[1:], kwargs)

    return call
