"""The queue broker (``spark-queue broker PATH``, docs/BROKER.md): one process that runs the
``QueueTable`` calls of many clients of one table, over Arrow Flight.

It holds one :class:`~spark_queue.QueueTable` for the table (with ``broker="off"``) and
calls its methods from Flight's handler threads, several at once; it answers a request only
once the call holding it has returned, that is once its commit has landed. It keeps nothing
the table does not keep, so a broker killed at any moment loses no answered request, and a
restarted one, or another, takes over. What travels, and how, is :mod:`spark_queue.wire`;
how clients find it is :mod:`spark_queue.discovery`.

Threads: Flight's (gRPC's) handler threads run requests; the thread that called
:func:`run_broker` writes the heartbeat and waits for SIGTERM or SIGINT.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from spark_queue.discovery import (
    DEFAULT_LISTEN,
    DEFAULT_MAX_REQUEST_BYTES,
    HEARTBEAT_SECONDS,
    BrokerRecord,
    remove_record,
    remove_stale_records,
    write_record,
)
from spark_queue.errors import BrokerError, BrokerRequestError, InvalidOptionError, StorageError
from spark_queue.storage import scrubbed
from spark_queue.table import QueueTable
from spark_queue.wire import (
    PROTOCOL,
    ROUTED_METHODS,
    STATUS_ACTION,
    TOKEN_HEADER,
    decode_request,
    encode_error,
    encode_result,
    signature_of,
)

PUBLISH_KEYWORDS = frozenset({"queue", "rows", "producer", "sequence", "on_reject"})
# A stopping broker, once its requests in flight are answered, stays up until its last answer
# is this old before it closes its connections: a socket closed while its peer still writes
# to it is reset, and a reset can discard an answer the client has received but not read.
STOP_LINGER_SECONDS = 2.0
STOPPING = "the broker is stopping"

log = logging.getLogger("spark_queue.broker")


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as a host and a port; port 0: a free one.

    Raises:
        InvalidOptionError: not of that form.
    """
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidOptionError(
            f"--listen takes HOST:PORT (say 127.0.0.1:8815, or port 0 for a free one); got {text!r}"
        )
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_token(host: str, token: str | None) -> None:
    """A broker that listens beyond loopback must have a token.

    Raises:
        InvalidOptionError: ``host`` is not loopback and there is no token.
    """
    if not token and not is_loopback(host):
        raise InvalidOptionError(
            f"the broker would listen on {host}, beyond loopback, without a token: give one "
            f"with $SPARK_QUEUE_BROKER_TOKEN (or --token), or listen on 127.0.0.1"
        )


class _TokenCheck(flight.ServerMiddlewareFactory):
    """Refuses every call without ``Bearer <token>`` (compared in constant time)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> None:
        given = headers.get(TOKEN_HEADER, [])
        if len(given) != 1 or not hmac.compare_digest(given[0].encode(), self._expected):
            raise flight.FlightUnauthenticatedError(
                "this broker needs its token: missing or wrong (nothing was done)"
            )


class QueueBroker(flight.FlightServerBase):
    """A Flight server running ``table``'s calls; it listens once constructed.

    Args:
        table: the table's ``QueueTable``, with ``broker="off"``.
        host, port: where to listen (port 0: a free one, then :attr:`port`).
        token: required of every call when given.
        max_request_bytes: larger requests are refused with :class:`BrokerRequestError`,
            before anything is done.
        tls: the server's certificate chain and private key (PEM): gRPC over TLS.

    Thread-safe: requests run concurrently on Flight's threads.
    """

    def __init__(
        self,
        table: QueueTable,
        host: str,
        port: int,
        *,
        token: str | None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        tls: tuple[bytes, bytes] | None = None,
    ) -> None:
        middleware = {"token": _TokenCheck(token)} if token else {}
        if tls is None:
            super().__init__(f"grpc://{host}:{port}", middleware=middleware)
        else:
            super().__init__(
                f"grpc+tls://{host}:{port}",
                middleware=middleware,
                tls_certificates=[flight.CertKeyPair(cert=tls[0], key=tls[1])],
            )
        self.tls = tls is not None
        self.table = table
        self.id = uuid.uuid4().hex[:16]
        self.max_request_bytes = max_request_bytes
        self.started_at = time.time()
        self._counts_lock = threading.Condition()
        # Requests answered (served), refused with the table's or a request error, failed
        # in the broker; and those under way now.
        self._counts = {"served": 0, "failed": 0, "refused": 0, "in_flight": 0}
        self._stopping = False
        self._last_answered = -float("inf")  # time.monotonic() when a request last ended

    # -- Flight methods ----------------------------------------------------------------------

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        return [(m, f"QueueTable.{m}") for m in ROUTED_METHODS if m != "publish"] + [
            (STATUS_ACTION, "this broker's id, table and counts")
        ]

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Any:
        if action.type == STATUS_ACTION:
            yield flight.Result(pa.py_buffer(json.dumps(self.status()).encode()))
            return
        with self._in_flight():
            body = action.body.to_pybytes()
            answer = self._serve(action.type, body, len(body), None)
        yield flight.Result(pa.py_buffer(answer))

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        command = descriptor.command or b""
        batches: list[pa.RecordBatch] = []
        size = len(command)

        def rows() -> pa.Table:
            return pa.Table.from_batches(batches, schema=reader.schema)

        with self._in_flight():
            for chunk in _chunks(reader):
                size += chunk.nbytes
                if size > self.max_request_bytes:
                    break  # refused below, without reading the rest
                batches.append(chunk)
            answer = self._serve("publish", command, size, rows)
        writer.write(pa.py_buffer(answer))

    # -- serving -----------------------------------------------------------------------------

    def _serve(
        self, kind: str, body: bytes, size: int, rows: Callable[[], pa.Table] | None
    ) -> bytes:
        """Run one request (``rows``: publish's messages, from ``do_put``); its encoded
        result, or a Flight error carrying the table's error."""
        try:
            if size > self.max_request_bytes:
                raise BrokerRequestError(
                    f"request too large: {size} bytes or more, above this broker's limit of "
                    f"{self.max_request_bytes} (--max-request-bytes); nothing was done: send "
                    f"smaller batches"
                )
            method, arguments = decode_request(body, self.table.path)
            if method != kind or (method == "publish") != (rows is not None):
                raise BrokerRequestError(
                    f"malformed request: a {kind} request names the method {method!r} (publish "
                    f"goes by do_put, every other method by do_action)"
                )
            result = self._call(method, arguments, rows)
            answer = encode_result(method, result)
        except Exception as error:
            payload = encode_error(error)
            self._count("refused" if payload is not None else "failed")
            if payload is None:  # not the table's error: the broker's own failure
                # Storage libraries may quote a URL with a key in it: scrubbed as the
                # table's own errors are.
                text = scrubbed(str(error), self.table.store.location.options)
                log.error("a %s request failed: %s: %s", kind, type(error).__name__, text)
                log.debug("the failure's traceback", exc_info=True)
                payload = encode_error(
                    BrokerError(f"the broker failed: {type(error).__name__}: {text}")
                )
            message = json.loads(payload)["message"]  # for clients that read no extra_info
            raise flight.FlightServerError(message, extra_info=payload) from None
        self._count("served")
        return answer

    def _call(
        self, method: str, arguments: dict[str, Any], rows: Callable[[], pa.Table] | None
    ) -> Any:
        """``self.table.<method>(**arguments)``; publish's rows from the stream."""
        if rows is not None:
            named = dict(arguments)
            queue_arguments = named.pop("arguments", {})
            clashing = sorted(PUBLISH_KEYWORDS & set(queue_arguments))
            if clashing:
                raise BrokerRequestError(
                    f"malformed request: publish's queue arguments name {clashing}"
                )
            named = {**named, **queue_arguments, "rows": rows()}
        else:
            named = arguments
        # publish answers with publish_outcome's result (which rows were stored).
        call = getattr(self.table, "publish_outcome" if method == "publish" else method)
        try:
            signature_of(call).bind(**named)
        except TypeError as error:
            raise BrokerRequestError(f"malformed request: {method}: {error}") from None
        return call(**named)

    def _count(self, what: str, by: int = 1) -> None:
        with self._counts_lock:
            self._counts[what] += by

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        """Count a request under way; once :meth:`drain` began, refuse it instead (the
        client, told nothing was done, runs it directly)."""
        with self._counts_lock:
            if self._stopping:
                raise flight.FlightUnavailableError(f"{STOPPING}: nothing was done")
            self._counts["in_flight"] += 1
        try:
            yield
        finally:
            with self._counts_lock:
                self._counts["in_flight"] -= 1
                self._last_answered = time.monotonic()
                self._counts_lock.notify_all()

    def drain(self, linger_seconds: float = STOP_LINGER_SECONDS) -> None:
        """Refuse new requests, wait until those in flight are answered, then until the
        last answer is ``linger_seconds`` old, for its client to read it (see
        :data:`STOP_LINGER_SECONDS`; an idle broker stops at once). Call before
        :meth:`shutdown`."""
        with self._counts_lock:
            self._stopping = True
            self._counts_lock.wait_for(lambda: self._counts["in_flight"] == 0)
            until = self._last_answered + linger_seconds
        time.sleep(max(0.0, until - time.monotonic()))

    def status(self) -> dict[str, Any]:
        with self._counts_lock:
            counts = dict(self._counts)
            stopping = self._stopping
        return {
            "id": self.id,
            "table": self.table.path,
            "started_at": self.started_at,
            "max_request_bytes": self.max_request_bytes,
            "stopping": stopping,
            **counts,
        }


def _chunks(reader: flight.MetadataRecordBatchReader) -> Any:
    while True:
        try:
            yield reader.read_chunk().data
        except StopIteration:
            return


def _read_pem(path: str) -> bytes:
    """A PEM file's bytes (never quoted in an error: it may be a private key)."""
    try:
        with open(path, "rb") as source:
            return source.read()
    except OSError as error:
        raise InvalidOptionError(f"cannot read {path!r}: {error.strerror}") from None


def run_broker(
    path: str,
    *,
    listen: str = DEFAULT_LISTEN,
    advertise: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    policies: Any = None,
    token: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    tls_files: tuple[str, str] | None = None,
    heartbeat_seconds: float = HEARTBEAT_SECONDS,
    announce: Callable[[str], None] = print,
) -> None:
    """Serve ``path``'s table until SIGTERM or SIGINT, then stop cleanly: the record is
    removed (clients commit directly or go to another broker), requests in flight finish,
    new ones are refused. Call from the main thread (it installs the signal handlers).

    Args:
        listen: ``HOST:PORT`` to listen on (port 0: a free one).
        advertise: the ``HOST:PORT`` clients reach it at, recorded in the table; default:
            the listening host (this machine's name where it listens on every address)
            and the bound port.
        token: required of clients when given; required itself beyond loopback.
        tls_files: the PEM files of its certificate chain and private key: gRPC over TLS
            (clients trust the chain's root through ``$SPARK_QUEUE_BROKER_TLS_ROOTS`` or
            the system's roots).
        announce: gets one line once listening, naming the address (never the token).

    Raises:
        InvalidOptionError: a bad ``listen``/``advertise``, no token beyond loopback, or a
            TLS file that cannot be read.
        BrokerError: it cannot listen there (the port is taken, say).
        StorageError: its record cannot be written to the table's store.
    """
    host, port = parse_listen(listen)
    check_token(host, token)
    if advertise is not None:
        parse_listen(advertise)
    tls = None if tls_files is None else (_read_pem(tls_files[0]), _read_pem(tls_files[1]))
    table = QueueTable(path, policies=policies, storage_options=storage_options, broker="off")
    _warm_up(table)
    try:
        server = QueueBroker(
            table, host, port, token=token, max_request_bytes=max_request_bytes, tls=tls
        )
    except (pa.ArrowException, OSError) as error:  # the port is taken, the host not ours
        raise BrokerError(f"the broker cannot listen on {host}:{port}: {error}") from None
    if advertise is None:
        shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
        advertise = f"[{shown}]:{server.port}" if ":" in shown else f"{shown}:{server.port}"
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())

    def record() -> BrokerRecord:
        return BrokerRecord(
            id=server.id,
            address=advertise,
            table=table.path,
            pid=os.getpid(),
            host=socket.gethostname(),
            started_at=server.started_at,
            heartbeat_at=time.time(),
            heartbeat_seconds=heartbeat_seconds,
            token_required=bool(token),
            max_request_bytes=max_request_bytes,
            protocol=PROTOCOL,
            tls=server.tls,
        )

    location = table.store.location
    try:
        removed = remove_stale_records(location)
        if removed:
            log.info("removed %d records of brokers that stopped beating", removed)
        try:
            write_record(location, record())
        except OSError as error:
            raise StorageError(location.unreachable(error)) from None
        announce(
            f"spark-queue broker {server.id}: serving {table.path} at {advertise} "
            f"({'TLS, ' if server.tls else ''}token {'required' if token else 'not required'}); "
            f"stop with SIGTERM"
        )
        while not stop.wait(heartbeat_seconds):
            try:
                write_record(location, record())
            except OSError as error:  # clients see the heartbeat age and commit directly
                log.warning("heartbeat not written: %s", location.unreachable(error))
    finally:
        try:
            remove_record(location, server.id)
        finally:
            server.drain()
            server.shutdown()
    log.info("broker %s stopped: %s", server.id, server.status())


def _warm_up(table: QueueTable) -> None:
    """Before the broker listens, what its first requests would otherwise wait for (~0.3 s
    on a 2-core machine, more on a slow one: a broker taking over answers its first
    requests late): the modules a round imports (pyarrow's first conversion of Python
    values imports pandas) and delta-rs's first open of the table.

    Raises:
        QueueError: the path holds a Delta table that is not a queue table, or its store
            cannot be read (the broker does not start).
    """
    from spark_queue.messages import as_input_table

    as_input_table(["warm-up"])
    table.queues()
