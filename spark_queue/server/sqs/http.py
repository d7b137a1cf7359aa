"""The SQS API's HTTP side: the protocol's framing (AWS JSON 1.0: the ``X-Amz-Target``
prefix, the content type) and the guards (docs/SQS.md#security) that bound a client that
has not authenticated, under :mod:`spark_queue.server.sqs.service`.

- **A connection cap**: past ``max_connections`` open connections
  (:class:`~spark_queue.server.sqs.limits.HttpLimits`), a new one is answered ``ServiceUnavailable``
  and closed at once.
- **Timeouts**: a connection must deliver a request's head within ``timeout_seconds`` of
  opening or of its last answer (an idle keep-alive connection closes then too), and its
  body within as long again (:func:`read_body`); a TLS handshake is bounded the same way.
- **Answers without echoes**: a request aiohttp cannot parse (a header over 8190 bytes, too
  many headers) gets a short SQS error that quotes nothing of it, and no traceback is
  logged; an unexpected failure is SQS's ``InternalError``.
- **Bounded logs**: refused connections and failed accepts (``EMFILE``) are logged as one
  line at most every :data:`LOG_EVERY_SECONDS`, with a count.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from spark_queue.server.sqs.errors import SqsError
from spark_queue.server.sqs.limits import HttpLimits

log = logging.getLogger("spark_queue.server.sqs")

TARGET_PREFIX = "AmazonSQS."
CONTENT_TYPE = "application/x-amz-json-1.0"

MAX_HEADERS = 32  # SDKs send about ten; each up to aiohttp's 8190 bytes
LINGER_SECONDS = 1.0  # a refused request's unread body is read and dropped this long
LOG_EVERY_SECONDS = 10.0

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def request_id() -> dict[str, str]:
    """The request id header every answer carries."""
    return {"x-amzn-RequestId": str(uuid.uuid4())}


def error_response(error: SqsError) -> web.Response:
    """``error`` as SQS answers it (JSON body, ``x-amzn-query-error``)."""
    return web.Response(
        body=error.body(),
        status=error.status,
        headers={**error.headers(), **request_id()},
        content_type=CONTENT_TYPE,
    )


def _raw_answer(error: SqsError) -> bytes:
    """``error`` as a whole HTTP/1.1 answer that closes the connection."""
    body = error.body()
    head = [
        f"HTTP/1.1 {error.status} {'Service Unavailable' if error.status == 503 else 'Error'}",
        f"Content-Type: {CONTENT_TYPE}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in {**error.headers(), **request_id()}.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def read_body(request: web.BaseRequest, limits: HttpLimits, batch: bool) -> bytes:
    """The request's body, refused past ``limits.max_request_bytes`` (a larger declared
    Content-Length before a byte of it is read) or ``limits.timeout_seconds``; a client that
    waits for ``100 Continue`` (``Expect: 100-continue``) gets it here, once its headers
    have been checked.

    Raises:
        SqsError: ``RequestTimeout``, or ``BatchRequestTooLong`` (``batch``) or
            ``InvalidParameterValue``: too large.
    """
    too_large = SqsError(
        "BatchRequestTooLong" if batch else "InvalidParameterValue",
        f"The request is larger than {limits.max_request_bytes} bytes.",
    )
    declared = request.content_length
    if declared is not None and declared > limits.max_request_bytes:
        raise too_large
    if request.headers.get("Expect", "").lower() == "100-continue" and request.version >= (1, 1):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the body may come
        request.writer.output_size = 0  # the answer is still to be written
    chunks: list[bytes] = []

    async def read() -> None:
        size = 0
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > limits.max_request_bytes:
                raise too_large
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), limits.timeout_seconds)
    except asyncio.TimeoutError:
        raise SqsError(
            "RequestTimeout",
            f"The request body did not arrive within {limits.timeout_seconds:g} s.",
        ) from None
    return b"".join(chunks)


class _Throttled:
    """A log line at most every :data:`LOG_EVERY_SECONDS`, counting those left out."""

    def __init__(self) -> None:
        self._last = -LOG_EVERY_SECONDS
        self._left_out = 0

    def warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last < LOG_EVERY_SECONDS:
            self._left_out += 1
            return
        more = f" (and {self._left_out} more since)" if self._left_out else ""
        self._last, self._left_out = now, 0
        log.warning("%s%s", message, more)


class _Connection(RequestHandler):
    """One connection: refused past the cap; closed when no request head arrives within
    the timeout of opening or of the last answer; parse errors answered as SQS's."""

    def __init__(self, guard: GuardedServer, **kwargs: Any) -> None:
        super().__init__(guard, **kwargs)
        self._guard = guard
        self._refused = False
        self._handling = False
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        if len(guard.connections) >= guard.limits.max_connections:
            self._refused = True
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(guard.refusal)
            transport.close()
            guard.refusals.warn(
                f"refused SQS connections beyond the cap of {guard.limits.max_connections}"
            )
            return
        super().connection_made(transport)
        self.await_head()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if not self._refused:
            super().connection_lost(exc)

    def await_head(self) -> None:
        """Close the connection unless a request head arrives within the timeout."""
        self._handling = False
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = asyncio.get_running_loop().call_later(
            self._guard.limits.timeout_seconds, self._expire
        )

    def handling(self) -> None:
        """A request head arrived: its handler bounds the rest."""
        self._handling = True

    def _expire(self) -> None:
        self._deadline = None
        if not self._handling:
            self.force_close()

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        """aiohttp's failures outside a handler: one line, the traceback at debug level."""
        self._guard.failures.warn(f"the SQS server: {args[0] if args else 'a failure'}")
        log.debug("its traceback", exc_info=kwargs.get("exc_info"))

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp's: too late for an answer
            raise ConnectionError("an answer was already sent")
        if status >= 500:
            name = type(exc).__name__ if exc is not None else "an error"
            log.error("an SQS request failed: %s", name)
            log.debug("the failure's traceback", exc_info=exc)
            error = SqsError("InternalError", f"the broker failed: {name}")
        else:  # the request could not be parsed: nothing of it is quoted back
            log.debug("an unparsable SQS request: %s", type(exc).__name__)
            error = SqsError(
                "InvalidParameterValue",
                f"The request is not HTTP/1.1 as the endpoint takes it (a line or header "
                f"over 8190 bytes, over {MAX_HEADERS} headers, or malformed).",
            )
        response = error_response(error)
        response.force_close()
        return response


class GuardedServer(web.Server):
    """aiohttp's low-level server with :class:`HttpLimits` on its connections."""

    def __init__(self, handler: Handler, limits: HttpLimits) -> None:
        async def guarded(request: web.BaseRequest) -> web.StreamResponse:
            connection = request.protocol
            if isinstance(connection, _Connection):
                connection.handling()
            try:
                return await handler(request)
            finally:
                if isinstance(connection, _Connection) and connection.transport is not None:
                    connection.await_head()

        self._options: dict[str, Any] = {
            "loop": asyncio.get_running_loop(),
            "max_headers": MAX_HEADERS,
            "lingering_time": LINGER_SECONDS,
            "access_log": None,
        }
        super().__init__(guarded, **self._options)
        self.limits = limits
        self.refusal = _raw_answer(
            SqsError(
                "ServiceUnavailable",
                f"The endpoint serves {limits.max_connections} connections at once: try again.",
            )
        )
        self.refusals = _Throttled()
        self.failures = _Throttled()

    def __call__(self) -> RequestHandler:
        return _Connection(self, **self._options)


class GuardedSite(web.BaseSite):
    """A TCP site of a :class:`GuardedServer`: TLS handshakes bounded by its timeout."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        limits: HttpLimits,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=1024)
        self._host, self._port, self._limits = host, port, limits

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self._server = await loop.create_server(
            server,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=True,
            ssl_handshake_timeout=self._limits.timeout_seconds if self._ssl_context else None,
        )


def quiet_loop_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Report ``loop``'s errors outside a request (a failed accept: ``EMFILE`` each second
    while the process is out of descriptors) as one line at most every
    :data:`LOG_EVERY_SECONDS`, the traceback at debug level."""
    throttled: dict[str, _Throttled] = {}

    def report(_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", "an error"))
        error = context.get("exception")
        shown = f"{type(error).__name__}: {error}" if error is not None else ""
        throttled.setdefault(message, _Throttled()).warn(f"the SQS server: {message}: {shown}")
        if error is not None:
            log.debug("its traceback", exc_info=error)

    loop.set_exception_handler(report)


def answer(members: Any) -> web.Response:
    """A successful answer of ``members``."""
    return web.Response(
        body=json.dumps(members).encode(), headers=request_id(), content_type=CONTENT_TYPE
    )
