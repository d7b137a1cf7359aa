"""The queue broker (``spark-queue broker PATH``, docs/BROKER.md): one process that runs the
``QueueTable`` calls of many clients of one table, over Arrow Flight.

It holds one :class:`~spark_queue.QueueTable` for the table (with ``broker="off"``) and
calls its methods from Flight's handler threads, several at once; it answers a request only
once the call holding it has returned, that is once its commit has landed. It keeps nothing
the table does not keep, so a broker killed at any moment loses no answered request, and a
restarted one, or another, takes over. What travels, and how, is :mod:`spark_queue.broker.wire`;
how clients find it is :mod:`spark_queue.broker.discovery`.

Threads: Flight's (gRPC's) handler threads run requests; the thread that called
:func:`run_broker` writes the heartbeat and waits for SIGTERM or SIGINT.

With a token, the broker proves it holds it to each client that dialed one of its own
addresses, and takes each call only with a fresh proof of the token bound to that call
(:mod:`spark_queue.broker.sessions`): the token never travels. A ``DoPut`` or a stream of
calls opens only with a proof of its own, checked as the call starts
(:mod:`spark_queue.server.call_openings`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any, cast

import pyarrow as pa
import pyarrow.flight as flight

from spark_queue.broker.auth import check_token as check_token_text
from spark_queue.broker.auth import token_key
from spark_queue.broker.discovery import (
    DEFAULT_LISTEN,
    DEFAULT_MAX_REQUEST_BYTES,
    HEARTBEAT_SECONDS,
    STOP_TIMEOUT_SECONDS,
    BrokerRecord,
    remove_record,
    remove_stale_records,
    write_record,
)
from spark_queue.broker.sessions import (
    DEFAULT_PROOF_LIFETIME_SECONDS,
    HELLO_ACTION,
    WILDCARDS,
    BrokerAddresses,
    CallChecks,
    HelloRefused,
    MalformedHello,
)
from spark_queue.broker.streams import CALLS_COMMAND
from spark_queue.broker.wire import (
    BODIES,
    MAX_STATUS_MESSAGE_BYTES,
    PROTOCOL,
    ROUTED_METHODS,
    STATUS_ACTION,
    bind_arguments,
    checked_upload,
    decode_request,
    encode_error,
    encode_result,
    trimmed,
)
from spark_queue.commit.group import set_return_wait
from spark_queue.commit.landing import HANDED_ON, WouldWait, handing_on, must_not_hand_on
from spark_queue.errors import (
    BrokerError,
    BrokerRequestError,
    InvalidOptionError,
    NotAQueueTableError,
    StorageError,
)
from spark_queue.model.partition_calls import one_partition
from spark_queue.model.policies import Policies
from spark_queue.server.call_batches import BatchServer
from spark_queue.server.call_openings import CredentialReader, unserved
from spark_queue.server.call_streams import serve_calls
from spark_queue.server.listening import check_bindable, check_sqs_keys, check_token, parse_listen
from spark_queue.server.ownership import OwnedPartitions
from spark_queue.server.sqs.limits import HttpLimits
from spark_queue.server.stopping import stop_broker
from spark_queue.storage.location import scrubbed
from spark_queue.storage.table_folder import new_table_refusal
from spark_queue.table import QueueTable

PUBLISH_KEYWORDS = frozenset({"queue", "rows", "producer", "sequence", "on_reject"})
# A stopping broker, once its requests in flight are answered, stays up until its last answer
# is this old before it closes its connections: a socket closed while its peer still writes
# to it is reset, and a reset can discard an answer the client has received but not read.
STOP_LINGER_SECONDS = 2.0
STOPPING = "the broker is stopping"
# How long a round of the broker's group commit may wait for the callers of the round before
# to come back over their RPCs (commit.group.set_return_wait): 20-40 ms for 32 callers on a
# loaded 2-core machine (docs/decisions/round-cost.md).
RETURN_WAIT_SECONDS = 0.05
# Told of every request that ends: its operation, its seconds, and the kind of its error
# (None: answered); the broker's metrics (:mod:`spark_queue.server.metrics`) record them.
Observer = Callable[[str, float, "str | None"], None]
# Who a log line names as the peer of a call refused as it starts: Flight tells its
# middleware none (pyarrow passes it the call's method and headers only).
UNNAMED_PEER = "an unnamed peer (Flight names none as a call starts)"

log = logging.getLogger("spark_queue.server.flight")


def _unobserved(operation: str, seconds: float, error: str | None) -> None:
    """The default :attr:`QueueBroker.observe`: records nothing."""


class QueueBroker(flight.FlightServerBase):
    """A Flight server running ``table``'s calls; it listens once constructed.

    Args:
        table: the table's ``QueueTable``, with ``broker="off"``.
        host, port: where to listen (port 0: a free one, then :attr:`port`).
        token: when given, every call but :data:`HELLO_ACTION` must carry a proof of it.
        advertise: the ``HOST:PORT`` clients reach it at (:attr:`advertised`); default: the
            listening host (this machine's name where it listens on every address) and the
            bound port. It answers hellos for it (:class:`BrokerAddresses`).
        proof_lifetime_seconds: how long after it was made a call's proof is taken.
        max_request_bytes: larger requests are refused with :class:`BrokerRequestError`,
            before anything is done, and publish's messages as soon as they pass it.
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
        advertise: str | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        tls: tuple[bytes, bytes] | None = None,
        proof_lifetime_seconds: float = DEFAULT_PROOF_LIFETIME_SECONDS,
    ) -> None:
        self._key = token_key(token) if token else None
        self.id = uuid.uuid4().hex[:16]
        # Handlers may run once the server listens, before its port is known: until then
        # it answers no hello.
        self._checks = CallChecks(
            self._key, self.id, BrokerAddresses(host, 0, ""), proof_lifetime_seconds
        )
        self._counts_lock = threading.Condition()
        # Requests answered (served), refused with the table's or a request error, failed
        # in the broker; and those under way now.
        # Calls refused for a missing or wrong proof of the token: "unauthenticated".
        self._counts = {
            "served": 0,
            "failed": 0,
            "refused": 0,
            "unauthenticated": 0,
            "in_flight": 0,
            "streams_open": 0,  # streams of calls open now (broker.streams), idle or not
            "streams_opened": 0,
            "batches": 0,  # messages of several publishes each (server.call_batches)
            "batched": 0,  # the publishes they held
        }
        self._batches = BatchServer(self)
        self.observe: Observer = _unobserved
        middleware: dict[str, flight.ServerMiddlewareFactory] = {}
        if self._key is not None:
            middleware["credential"] = CredentialReader(self._check_opening)
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
        table.partitioned.keyless_places = OwnedPartitions(table.store.location, self.id, self._key)
        if advertise is None:
            shown = socket.gethostname() if host in WILDCARDS else host
            advertise = f"[{shown}]:{self.port}" if ":" in shown else f"{shown}:{self.port}"
        self.advertised = advertise
        self._checks.addresses = BrokerAddresses(host, self.port, advertise)
        self.max_request_bytes = max_request_bytes
        self.started_at = time.time()
        # Requests on one partition (a client's share for the partition's broker), by queue
        # and partition.
        self._partitions_served: dict[str, dict[int, int]] = {}
        self._stopping = False
        self._last_answered = -float("inf")  # time.monotonic() when a request last ended

    # -- Flight methods ----------------------------------------------------------------------

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        self._authenticate(context, "ListActions", b"")
        return [(m, f"QueueTable.{m}") for m in ROUTED_METHODS if m != "publish"] + [
            (STATUS_ACTION, "this broker's id, table and counts"),
            (HELLO_ACTION, "opens a session: this broker's proof of the token for a client"),
        ]

    # A broker with a token refuses these in its middleware, before the handler.
    def list_flights(self, context: flight.ServerCallContext, criteria: bytes) -> Any:
        raise unserved("ListFlights")

    def get_flight_info(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> Any:
        raise unserved("GetFlightInfo")

    def get_schema(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> Any:
        raise unserved("GetSchema")

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> Any:
        raise unserved("DoGet")

    def do_exchange(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.MetadataRecordBatchWriter,
    ) -> None:
        # With a token, its opening proof held as it started (CredentialReader); it proves
        # nothing for the calls, each of which carries its own.
        if descriptor.command != CALLS_COMMAND:
            raise unserved("DoExchange")
        self._count("streams_opened")
        self._count("streams_open")
        try:
            check = functools.partial(self._check_proof, context.peer)
            serve_calls(
                reader,
                writer,
                check,
                lambda m, r: self._serve(m, r, None),
                self._in_flight,
                self._serve_batch,
            )
        finally:
            self._count("streams_open", -1)

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Any:
        body = action.body.to_pybytes()
        if action.type == HELLO_ACTION:
            yield flight.Result(pa.py_buffer(self._hello(context, body)))
            return
        self._authenticate(context, action.type, body)
        if action.type == STATUS_ACTION:
            yield flight.Result(pa.py_buffer(json.dumps(self.status()).encode()))
            return
        with self._in_flight():
            answer = self._serve(action.type, body, None)
        yield flight.Result(pa.py_buffer(answer))

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        # With a token, its opening proof held as it started (CredentialReader); its
        # request's binds the upload to what it was issued for.
        request = descriptor.command or b""
        self._authenticate(context, "publish", request)  # before a row is read
        with self._in_flight():
            answer = self._serve(
                "publish",
                request,
                lambda declared, request_bytes: self._upload(reader, declared, request_bytes),
            )
        writer.write(pa.py_buffer(answer))

    # -- authentication ----------------------------------------------------------------------

    def _hello(self, context: flight.ServerCallContext, body: bytes) -> bytes:
        """The answer to a client's hello (:meth:`CallChecks.hello`); a hello for an
        address not this broker's is refused, logged and counted as a call is."""
        try:
            return self._checks.hello(body)
        except MalformedHello as error:
            raise flight.FlightServerError(str(error)) from None
        except HelloRefused as error:
            self._refused(context.peer(), HELLO_ACTION, f"a hello for another address: {error}")
            raise flight.FlightUnauthenticatedError(f"{error}; nothing was done") from None

    def _authenticate(self, context: flight.ServerCallContext, call: str, body: bytes) -> None:
        """Refuse (and log, and count) a call ``call`` carrying ``body`` without a fresh
        proof of the token for it (:meth:`CallChecks.check`); a broker without a token takes
        every call."""
        if self._key is None:
            return
        credential = context.get_middleware("credential")
        refusal = self._check_proof(context.peer, call, credential and credential.header, body)
        if refusal is not None:
            raise flight.FlightUnauthenticatedError(refusal)

    def _check_opening(self, opening: str, proof: str | None) -> str | None:
        """None where ``proof`` holds for a DoPut's or a stream's ``opening`` (no body);
        else the refusal (logged): :class:`CredentialReader` checks it as the call starts."""
        return self._check_proof(lambda: UNNAMED_PEER, opening, proof, b"")

    def _check_proof(
        self, peer: Callable[[], str], call: str, proof: str | None, body: bytes
    ) -> str | None:
        """None where ``proof`` holds for ``call`` with ``body``; else the refusal (logged
        with ``peer()``)."""
        why = self._checks.check(proof, call, body)
        if why is None:
            return None
        self._refused(peer(), call, why)
        return (
            "this broker needs a fresh proof of its token for each call: missing, wrong, "
            "expired or used before (nothing was done)"
        )

    def _refused(self, peer: str, call: str, why: str) -> None:
        self._count("unauthenticated")
        self.observe(call, 0.0, "Unauthenticated")
        log.warning(
            "refused a %s call from %s: %s; nothing was done",
            repr(call)[1:-1][:100],  # the client names it: one line, escaped
            peer,
            why,
        )

    # -- serving -----------------------------------------------------------------------------

    def _too_large(self, size: int) -> BrokerRequestError:
        return BrokerRequestError(
            f"request too large: {size} bytes or more, above this broker's limit of "
            f"{self.max_request_bytes} (--max-request-bytes); nothing was done: send "
            f"smaller batches"
        )

    def _upload(
        self,
        reader: flight.MetadataRecordBatchReader,
        declared: tuple[int, int],
        request_bytes: int,
    ) -> pa.Table:
        """Publish's messages as they arrive after its request, which ``declared`` their
        rows and bytes: refused before the first batch where they declare too many bytes,
        and as soon as what arrived passes the limit or the rows declared, so a refused
        upload is not held; refused at its end where fewer rows arrived than declared (a
        client that closed its upload early).

        Raises:
            BrokerRequestError: any of these.
        """
        rows_declared, bytes_declared = declared
        size = request_bytes + bytes_declared
        if size > self.max_request_bytes:
            raise self._too_large(size)
        batches: list[pa.RecordBatch] = []
        rows = 0
        size = request_bytes
        refusal = None
        for chunk in _chunks(reader):
            size += chunk.nbytes
            rows += chunk.num_rows
            if size > self.max_request_bytes:
                refusal = self._too_large(size)
            elif rows > rows_declared:
                refusal = BrokerRequestError(
                    f"malformed request: the upload brings more than the {rows_declared} rows "
                    f"its request declares; nothing was done"
                )
            if refusal is not None:
                break
            batches.append(chunk)
        if refusal is not None:
            raise refusal  # what arrived goes with this frame, once _serve has answered
        if rows != rows_declared:
            raise BrokerRequestError(
                f"cut-off upload: {rows} of the {rows_declared} rows its request declares "
                f"arrived (the client closed the upload early); nothing was done"
            )
        return pa.Table.from_batches(batches, schema=reader.schema)

    def _serve(
        self,
        kind: str,
        body: bytes,
        upload: Callable[[tuple[int, int], int], pa.Table] | None,
        take: Callable[[Future[Any]], None] | None = None,
    ) -> bytes:
        """Run one request (``upload``: reads publish's messages, from ``do_put``); its
        encoded result, or a Flight error carrying the table's error. With ``take``, a
        publish of a queue without partitions is not waited for: its future goes to
        ``take`` and the answer is empty (:func:`~spark_queue.commit.landing.handing_on`);
        one that would wait on a path of its own raises ``WouldWait``, none of its messages
        stored."""
        started = time.perf_counter()
        try:
            if len(body) > self.max_request_bytes:
                raise self._too_large(len(body))
            method, arguments, declared, partition = decode_request(body, self.table.path)
            inline = BODIES in arguments
            if method != kind or (method == "publish" and (upload is not None) == inline):
                raise BrokerRequestError(
                    f"malformed request: a {kind} request names the method {method!r} (publish "
                    f"goes by do_put, or by do_action with its bodies in {BODIES!r}; every "
                    f"other method by do_action)"
                )
            rows: pa.Table | list[str] | None = None
            if inline:
                rows = arguments.pop(BODIES)
            elif upload is not None:
                rows = upload(checked_upload(declared), len(body))
            if take is None:
                result = self._call(method, arguments, rows, partition)
            else:
                with handing_on(take):
                    result = self._call(method, arguments, rows, partition)
                if result is HANDED_ON:
                    return b""
            answer = encode_result(method, result)
        except WouldWait:
            raise
        except Exception as error:
            failure = self._failure(kind, error, time.perf_counter() - started)
        else:
            self._count("served")
            self.observe(kind, time.perf_counter() - started, None)
            return answer
        # Raised here, past the except block, so that nothing refers to the error and its
        # frames (a refused upload's batches among them) once the answer is sent.
        raise failure

    def _serve_batch(self, calls: list[tuple[str, bytes]]) -> list[bytes]:
        """A batch of publishes' answer frames (:mod:`spark_queue.server.call_batches`)."""
        self._count("batches")
        self._count("batched", len(calls))
        return self._batches.serve(calls)

    def serve_one(
        self, kind: str, body: bytes, take: Callable[[Future[Any]], None] | None
    ) -> bytes:
        """A call of a batch, served as :meth:`_serve` serves one alone."""
        return self._serve(kind, body, None, take)

    def landed(self, kind: str, seconds: float, error: Exception | None) -> bytes:
        """Count and observe a call of a batch that ended after ``seconds``: the payload of
        its ``error`` where it failed, else empty."""
        if error is None:
            self._count("served")
            self.observe(kind, seconds, None)
            return b""
        return self._failure(kind, error, seconds).extra_info or b""

    def _failure(self, kind: str, error: Exception, seconds: float) -> flight.FlightServerError:
        """The Flight error that carries ``error`` to the client (trimmed to fit gRPC's
        headers, of the same class), after ``seconds`` of its request."""
        payload = encode_error(error)
        self._count("refused" if payload is not None else "failed")
        self.observe(kind, seconds, type(error).__name__ if payload is not None else "BrokerError")
        if payload is None:  # not the table's error: the broker's own failure
            # Storage libraries may quote a URL with a key in it: scrubbed as the
            # table's own errors are.
            text = scrubbed(str(error), self.table.store.location.options)
            log.error("a %s request failed: %s: %s", kind, type(error).__name__, trimmed(text))
            log.debug("the failure's traceback", exc_info=True)
            # A BrokerError is one of the table's errors: it always encodes.
            payload = cast(
                bytes,
                encode_error(BrokerError(f"the broker failed: {type(error).__name__}: {text}")),
            )
        message = json.loads(payload)["message"]  # for clients that read no extra_info
        return flight.FlightServerError(
            trimmed(message, MAX_STATUS_MESSAGE_BYTES), extra_info=payload
        )

    def _call(
        self,
        method: str,
        arguments: dict[str, Any],
        rows: pa.Table | list[str] | None,
        partition: int | None,
    ) -> Any:
        """``self.table.<method>(**arguments)``; publish's rows from the stream, or its
        bodies from the request; on one partition of the queue where the request names it
        (whether or not another broker owns it: served, not batched with its commits)."""
        if rows is not None:
            named = dict(arguments)
            queue_arguments = named.pop("arguments", {})
            clashing = sorted(PUBLISH_KEYWORDS & set(queue_arguments))
            if clashing:
                raise BrokerRequestError(
                    f"malformed request: publish's queue arguments name {clashing}"
                )
            named = {**named, **queue_arguments, "rows": rows}
        else:
            named = arguments
        # publish answers with publish_outcome's result (which rows were stored).
        call = getattr(self.table, "publish_outcome" if method == "publish" else method)
        try:
            bind_arguments(call, **named)
        except TypeError as error:
            raise BrokerRequestError(f"malformed request: {method}: {error}") from None
        if partition is None:
            return call(**named)
        must_not_hand_on()  # a partition's share waits on its partition's round
        queue = named["queue"]
        self.table.partitioned.require_partition(queue, partition)
        with self._counts_lock:
            served = self._partitions_served.setdefault(queue, {})
            served[partition] = served.get(partition, 0) + 1
        with one_partition(partition):
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

    def drain(self, deadline: float, linger_seconds: float = STOP_LINGER_SECONDS) -> int:
        """Refuse new requests, wait until those in flight are answered, then until the
        last answer is ``linger_seconds`` old, for its client to read it (see
        :data:`STOP_LINGER_SECONDS`; an idle broker stops at once), waiting until
        ``deadline`` (``time.monotonic()``) at most. Call before :meth:`shutdown`.

        Returns:
            how many requests were still in flight at the deadline.
        """
        with self._counts_lock:
            self._stopping = True
            self._counts_lock.wait_for(
                lambda: self._counts["in_flight"] == 0, max(0.0, deadline - time.monotonic())
            )
            still_open = self._counts["in_flight"]
            until = min(deadline, self._last_answered + linger_seconds)
        if not still_open:
            time.sleep(max(0.0, until - time.monotonic()))
        return still_open

    def status(self) -> dict[str, Any]:
        with self._counts_lock:
            counts = dict(self._counts)
            stopping = self._stopping
            by_partition = {q: dict(served) for q, served in self._partitions_served.items()}
        return {
            "id": self.id,
            "table": self.table.path,
            "started_at": self.started_at,
            "max_request_bytes": self.max_request_bytes,
            "stopping": stopping,
            "partitions_served": by_partition,
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
    policies: str | os.PathLike[str] | Policies | None = None,
    token: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    tls_files: tuple[str, str] | None = None,
    heartbeat_seconds: float = HEARTBEAT_SECONDS,
    stop_timeout_seconds: float = STOP_TIMEOUT_SECONDS,
    announce: Callable[[str], None] = print,
    sqs_listen: str | None = None,
    sqs_keys: Mapping[str, str] | None = None,
    sqs_limits: HttpLimits | None = None,
    metrics_listen: str | None = None,
    metrics_token: str | None = None,
    proof_lifetime_seconds: float = DEFAULT_PROOF_LIFETIME_SECONDS,
) -> None:
    """Serve ``path``'s table until SIGTERM or SIGINT, then stop cleanly: the record is
    removed (clients commit directly or go to another broker), requests in flight finish,
    new ones are refused; requests still open ``stop_timeout_seconds`` later are cancelled
    and the process exits. Call from the main thread (it installs the signal handlers).

    Args:
        listen: ``HOST:PORT`` to listen on (port 0: a free one).
        advertise: the ``HOST:PORT`` clients reach it at, recorded in the table; default:
            the listening host (this machine's name where it listens on every address)
            and the bound port.
        token: required of clients when given (checked by :func:`check_token_text`);
            required itself beyond loopback, with ``tls_files``.
        tls_files: the PEM files of its certificate chain and private key: gRPC over TLS
            (clients trust the chain's root through ``$SPARK_QUEUE_BROKER_TLS_ROOTS`` or
            the system's roots).
        announce: gets one line once listening, naming the address (never the token).
        sqs_listen: ``HOST:PORT`` where it also serves Amazon SQS's API (docs/SQS.md;
            :mod:`spark_queue.server.sqs.service`); None: it does not.
        sqs_keys: the access keys SQS requests must be signed with (id -> secret); None:
            unsigned requests are taken, on loopback only.
        sqs_limits: the SQS port's connection cap and timeouts (default: SQS.md's).
        metrics_listen: ``HOST:PORT`` where it serves Prometheus metrics at ``/metrics``
            (:mod:`spark_queue.server.metrics`; over HTTPS with ``tls_files``); None: it
            does not, and records none.
        metrics_token: the bearer token scrapes must carry; None: none is asked for, on
            loopback only.
        proof_lifetime_seconds: how long after it was made a client's proof of the token
            for a call is taken (``--proof-lifetime``).

    Raises:
        InvalidOptionError: a bad ``listen``/``advertise``/``sqs_listen``/``metrics_listen``,
            no token (keys, metrics token) or no TLS beyond loopback, empty ``sqs_keys``, or a
            TLS file that cannot be read.
        BrokerError: it cannot listen there (the port is taken, say).
        StorageError: its record cannot be written to the table's store.
    """
    host, port = parse_listen(listen)
    if token is not None:
        check_token_text(token, "the broker's token")
    check_token(host, token, tls_files is not None)
    if advertise is not None:
        parse_listen(advertise, "--advertise")
    sqs_address = None if sqs_listen is None else parse_listen(sqs_listen, "--sqs")
    if sqs_address is not None:
        check_sqs_keys(sqs_address[0], sqs_keys)
    metrics_address = None if metrics_listen is None else parse_listen(metrics_listen, "--metrics")
    if metrics_address is not None:
        from spark_queue.server.metrics import check_metrics_token

        check_metrics_token(metrics_address[0], metrics_token, tls_files is not None)
    tls = None if tls_files is None else (_read_pem(tls_files[0]), _read_pem(tls_files[1]))
    table = QueueTable(path, policies=policies, storage_options=storage_options, broker="off")
    set_return_wait(RETURN_WAIT_SECONDS)
    _warm_up(table)
    sqs_service = None
    if sqs_address is not None:
        from spark_queue.server.sqs.service import SqsService

        sqs_service = SqsService(table, sqs_keys, sqs_limits)
    metrics = None
    if metrics_address is not None:
        from spark_queue.server.metrics import BrokerMetrics

        metrics = BrokerMetrics(table, sqs_service.actions if sqs_service is not None else ())
        if sqs_service is not None:
            sqs_service.observe = metrics.observer("sqs")
    check_bindable(host, port, "--listen")
    try:
        server = QueueBroker(
            table,
            host,
            port,
            token=token,
            advertise=advertise,
            max_request_bytes=max_request_bytes,
            tls=tls,
            proof_lifetime_seconds=proof_lifetime_seconds,
        )
    except (pa.ArrowException, OSError) as error:  # taken since check_bindable looked
        raise BrokerError(
            f"the broker cannot listen on {host}:{port} (--listen): {error}"
        ) from None
    if metrics is not None:
        server.observe = metrics.observer("flight")
    sqs_server = None
    if sqs_address is not None and sqs_service is not None:
        from spark_queue.server.sqs.service import SqsServer

        try:
            sqs_server = SqsServer(sqs_service, *sqs_address, tls_files)
        except OSError as error:
            server.shutdown()
            raise BrokerError(
                f"the broker cannot serve SQS on {sqs_address[0]}:{sqs_address[1]}: {error}"
            ) from None
    metrics_server = None
    if metrics_address is not None and metrics is not None:
        from spark_queue.server.metrics import MetricsServer

        try:
            metrics_server = MetricsServer(
                metrics, *metrics_address, token=metrics_token, tls_files=tls_files
            )
        except OSError as error:
            if sqs_server is not None:
                sqs_server.stop(stop_timeout_seconds)
            server.shutdown()
            raise BrokerError(
                f"the broker cannot serve metrics on {metrics_address[0]}:"
                f"{metrics_address[1]}: {error}"
            ) from None
    advertise = server.advertised
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())

    key = token_key(token) if token else None

    def record() -> BrokerRecord:
        written = BrokerRecord(
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
        return written if key is None else written.signed(key)

    location = table.store.location
    try:
        removed = remove_stale_records(location)
        if removed:
            log.info("removed %d records of brokers that stopped beating", removed)
        try:
            write_record(location, record())
        except OSError as error:
            raise StorageError(location.unreachable(error)) from None
        sqs_line = ""
        if sqs_server is not None:
            shown = sqs_server.host if ":" not in sqs_server.host else f"[{sqs_server.host}]"
            sqs_line = (
                f"; SQS API at {sqs_server.scheme}://{shown}:{sqs_server.port} "
                f"(signatures {'required' if sqs_keys else 'not checked'})"
            )
        metrics_line = ""
        if metrics_server is not None:
            metrics_line = (
                f"; metrics at {metrics_server.url} "
                f"(token {'required' if metrics_token else 'not required'})"
            )
        announce(
            f"spark-queue broker {server.id}: serving {table.path} at {advertise} "
            f"({'TLS, ' if server.tls else ''}token {'required' if token else 'not required'})"
            f"{sqs_line}{metrics_line}; stop with SIGTERM"
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
            if metrics_server is not None:
                metrics_server.stop()
            if sqs_server is not None:
                sqs_server.stop(stop_timeout_seconds)
            stop_broker(server, time.monotonic() + stop_timeout_seconds, stop_timeout_seconds)
    log.info("broker %s stopped: %s", server.id, server.status())


def _warm_up(table: QueueTable) -> None:
    """Before the broker listens, what its first requests would otherwise wait for (~0.3 s
    on a 2-core machine, more on a slow one: a broker taking over answers its first
    requests late): the modules a round imports (pyarrow's first conversion of Python
    values imports pandas) and delta-rs's first open of the table.

    Raises:
        QueueError: the path holds a Delta table that is not a queue table, or no table
            and cannot become one (a folder holding other files, or inside a Delta table:
            the broker would write its record there), or its store cannot be read (the
            broker does not start).
    """
    from spark_queue.model.messages import as_input_table

    as_input_table(["warm-up"])
    if table.store.open() is None:  # the first declare creates the table: where it may
        refusal = new_table_refusal(table.store.location)
        if refusal is not None:
            raise NotAQueueTableError(refusal)
    table.queues()
