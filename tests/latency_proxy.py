"""A TCP proxy in front of an HTTP server (the suite's S3 server) that holds each request for
a round trip's delay and records when each request started and ended.

What a request costs on object storage is its round trip: ~10-30 ms on S3, where moto answers
in well under a millisecond. The proxy delays the **first** client->server chunk of each HTTP
request by ``delay_ms`` (later chunks of the same request, and the answers, pass at once), so
every request costs about one round trip, on keep-alive connections too: it reads the HTTP/1.1
framing of both directions (``Content-Length``, ``Transfer-Encoding: chunked``, answers without
a body to ``HEAD`` and 1xx/204/304, interim ``100 Continue`` answers) to know where each
request begins and where its answer ends. New connections cost nothing (a real store adds
TCP and TLS handshakes; clients keep their connections).

From the record, :class:`RoundTrips` counts a window's requests **in all** and **in a row**:
the longest chain of requests each of which started after the one before it ended (the
critical path). Requests that overlap are parallel. The count is exact for a code path when
the delay is large next to the client's own work between requests it sends together: each
request then lasts at least the delay, so requests sent together overlap.

The proxy runs in a process of its own (``python tests/latency_proxy.py UPSTREAM DELAY_MS``,
started by :class:`LatencyProxy`), so a busy client process (32 threads, the GIL) does not
hold back its forwarding. It takes commands on stdin, one a line: ``records N`` answers one
JSON line, the finished requests from the N-th on and those in flight. Times are
``time.time()``: the one clock of the machine, which Spark's progress reports share.

Only the standard library: it runs as a script, and the tests and the benchmarks import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

READ_SIZE = 64 * 1024
SETTLE_TIMEOUT = 30.0  # seconds a window waits for the requests it started to finish


# -- what was recorded, and what it counts ------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One HTTP request through the proxy: ``start`` when its first byte reached the proxy,
    ``end`` just before the last bytes of its answer left it (``time.time()`` seconds), so a
    call that returned on its answer returned after ``end``; ``status`` is None where the
    connection closed before an answer."""

    method: str
    target: str
    status: int | None
    start: float
    end: float


def in_a_row(requests: Iterable[Request]) -> int:
    """The length of the longest chain of ``requests`` where each started after the one
    before it ended: the most pairwise non-overlapping requests, found exactly by taking
    them in order of their end, each one that starts after the last one taken."""
    chain, last_end = 0, float("-inf")
    for request in sorted(requests, key=lambda r: r.end):
        if request.start >= last_end:
            chain += 1
            last_end = request.end
    return chain


@dataclass
class RoundTrips:
    """The requests that started in a window (of one bucket's objects, where asked), filled
    in when the window closes (:meth:`LatencyProxy.counting`, :meth:`LatencyProxy.between`)."""

    requests: list[Request] = field(default_factory=list)
    closed_at: float | None = None  # when the window closed (time.time())

    @property
    def in_all(self) -> int:
        return len(self._closed())

    @property
    def in_a_row(self) -> int:
        return in_a_row(self._closed())

    @property
    def by_method(self) -> dict[str, int]:
        """Requests by HTTP method, methods in alphabetical order."""
        return dict(sorted(Counter(r.method for r in self._closed()).items()))

    @property
    def after_return(self) -> list[Request]:
        """The requests that started in the window and ended after it closed: work left
        running when the measured call returned."""
        closed_at = self.closed_at
        return [r for r in self._closed() if closed_at is not None and r.end > closed_at]

    def _closed(self) -> list[Request]:
        if self.closed_at is None:
            raise RuntimeError("round trips are counted once their window has closed")
        return self.requests

    def __str__(self) -> str:
        """A summary and one line per request, in order of start (for assertion messages)."""
        requests = sorted(self._closed(), key=lambda r: r.start)
        origin = requests[0].start if requests else 0.0
        lines = [f"{self.in_all} requests, {self.in_a_row} in a row, {self.by_method}"]
        lines += [
            f"  {1000 * (r.start - origin):8.1f} -> {1000 * (r.end - origin):8.1f} ms "
            f"{r.method} {r.target} {r.status}"
            for r in requests
        ]
        return "\n".join(lines)


def of_bucket(target: str, bucket: str | None) -> bool:
    """Whether a path-style request ``target`` touches ``bucket`` (every target for None)."""
    if bucket is None:
        return True
    return target == f"/{bucket}" or target.startswith((f"/{bucket}/", f"/{bucket}?"))


# -- the proxy, seen from the tests and the benchmarks ------------------------------------------


class LatencyProxy:
    """The proxy process in front of ``upstream`` (``http://host:port``), holding each request
    ``delay_ms`` milliseconds; ``endpoint`` is its URL on 127.0.0.1. Safe to use from many
    threads; a context manager (leaving it stops the process)."""

    def __init__(self, upstream: str, delay_ms: float) -> None:
        self._process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), upstream, str(delay_ms)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._stdin: IO[str] = self._process.stdin  # type: ignore[assignment]
        self._stdout: IO[str] = self._process.stdout  # type: ignore[assignment]
        announced = self._stdout.readline().split()
        if announced[:1] != ["listening"]:
            self.close()
            raise RuntimeError(f"the latency proxy did not start: {announced}")
        self.endpoint = f"http://127.0.0.1:{announced[1]}"
        self._lock = threading.Lock()
        self._finished: list[Request] = []

    def __enter__(self) -> LatencyProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the process (it exits when its stdin closes)."""
        with contextlib.suppress(OSError):
            self._stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._stdout.close()

    def between(self, start: float, end: float, bucket: str | None = None) -> RoundTrips:
        """The requests that started from ``start`` to ``end`` (``time.time()`` seconds),
        of ``bucket``'s objects where given, once every one of them has finished (at most
        :data:`SETTLE_TIMEOUT` seconds; then the unfinished ones are left out)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            finished, in_flight = self._fetch()
            pending = [
                target
                for target, began in in_flight
                if start <= began <= end and (not target or of_bucket(target, bucket))
            ]  # a target not yet known (its head not read whole) may be the bucket's
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        chosen = [r for r in finished if start <= r.start <= end and of_bucket(r.target, bucket)]
        return RoundTrips(sorted(chosen, key=lambda r: r.start), end)

    @contextlib.contextmanager
    def counting(self, bucket: str | None = None) -> Iterator[RoundTrips]:
        """A window around the ``with`` block: the :class:`RoundTrips` it yields is filled
        in when the block ends (:meth:`between`)."""
        trips = RoundTrips()
        start = time.time()
        yield trips
        counted = self.between(start, time.time(), bucket)
        trips.requests, trips.closed_at = counted.requests, counted.closed_at

    def quiet(self, bucket: str | None, seconds: float) -> None:
        """Wait until no request of ``bucket`` (of any, for None) has been in flight for
        ``seconds``: what a call left running (upkeep in a thread) has finished, so that
        the next window counts only its own (at most :data:`SETTLE_TIMEOUT` seconds)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while time.monotonic() < deadline:
            finished, in_flight = self._fetch()
            now = time.time()
            busy = any(not target or of_bucket(target, bucket) for target, _ in in_flight)
            # The record is in order of end: the bucket's last request is the last ended.
            last = next((r.end for r in reversed(finished) if of_bucket(r.target, bucket)), 0.0)
            if not busy and now - last >= seconds:
                return
            time.sleep(min(seconds, 0.05))

    def _fetch(self) -> tuple[list[Request], list[tuple[str, float]]]:
        """Every finished request so far, and (target, start) of those in flight."""
        with self._lock:
            self._stdin.write(f"records {len(self._finished)}\n")
            self._stdin.flush()
            answer = json.loads(self._stdout.readline())
            self._finished.extend(Request(*fields) for fields in answer["finished"])
            return list(self._finished), [(t, s) for t, s in answer["in_flight"]]


# -- the proxy process --------------------------------------------------------------------------


class Framer:
    """Where HTTP/1.1 messages end in a byte stream, fed as it arrives. ``feed(data)``
    returns how many leading bytes of ``data`` belong to the current message and whether
    they complete it; ``head`` is the current message's first line and headers, once read.

    A request's body is its ``Content-Length`` or chunked; an answer's is none for ``HEAD``
    (``method_answered()`` says what the answer is to) and for 1xx, 204 and 304, else
    chunked, ``Content-Length``, or all until the connection closes. A 1xx answer other
    than 101 is interim: ``interim`` is true once it completes, and the final answer
    follows."""

    def __init__(self, method_answered: Callable[[], str] | None = None) -> None:
        self.method_answered = method_answered  # None: this stream carries requests
        self._reset()

    def _reset(self) -> None:
        self.head: tuple[str, dict[str, str]] | None = None
        self.interim = False
        self._buffer = b""
        self._state = "head"
        self._remaining = 0

    @property
    def between_messages(self) -> bool:
        """Whether the next byte fed starts a message."""
        return self._state == "done" or (self._state == "head" and not self._buffer)

    def feed(self, data: bytes) -> tuple[int, bool]:
        if self._state == "done":  # the last call completed a message: this one starts anew
            self._reset()
        used = 0
        while used < len(data) and self._state != "done":
            used += self._step(data[used:])
        return used, self._state == "done"

    def _step(self, data: bytes) -> int:
        if self._state in ("head", "chunk size", "trailer"):
            ending = b"\r\n\r\n" if self._state == "head" else b"\r\n"
            kept = len(self._buffer)
            self._buffer += data
            found = self._buffer.find(ending, max(0, kept - len(ending) + 1))
            if found < 0:
                return len(data)
            line, self._buffer = self._buffer[:found], b""
            used = found + len(ending) - kept
            {"head": self._head, "chunk size": self._chunk_size, "trailer": self._trailer}[
                self._state
            ](line)
            return used
        if self._state == "until close":
            return len(data)
        used = min(len(data), self._remaining)
        self._remaining -= used
        if self._remaining == 0:
            self._state = "chunk size" if self._state == "chunk data" else "done"
        return used

    def _head(self, text: bytes) -> None:
        first, *lines = text.decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.partition(":")
            key = name.strip().lower()
            headers[key] = f"{headers[key]},{value.strip()}" if key in headers else value.strip()
        self.head = (first, headers)
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = int(headers.get("content-length", "0").split(",")[0] or 0)
        if self.method_answered is None:  # a request
            self._body("chunked" if chunked else length)
            return
        status = int(first.split()[1])
        if 100 <= status < 200 and status != 101:
            self.interim = True
            self._state = "done"
        elif self.method_answered() == "HEAD" or status in (204, 304):
            self._body(0)
        elif chunked:
            self._body("chunked")
        elif "content-length" in headers:
            self._body(length)
        else:
            self._state = "until close"

    def _body(self, size: int | str) -> None:
        if size == "chunked":
            self._state = "chunk size"
        elif size:
            self._state, self._remaining = "body", int(size)
        else:
            self._state = "done"

    def _chunk_size(self, line: bytes) -> None:
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            self._state = "trailer"
        else:
            self._state, self._remaining = "chunk data", size + 2  # the data, then CRLF

    def _trailer(self, line: bytes) -> None:
        if not line:
            self._state = "done"


@dataclass
class Exchange:
    """A request on its way and its answer's progress."""

    start: float
    method: str = ""
    target: str = ""
    status: int | None = None


class Recorder:
    """The proxy's record: finished requests in order of their end, and those in flight."""

    def __init__(self) -> None:
        self.finished: list[list[object]] = []
        self.in_flight: set[int] = set()
        self.exchanges: dict[int, Exchange] = {}

    def begin(self, exchange: Exchange) -> None:
        self.exchanges[id(exchange)] = exchange
        self.in_flight.add(id(exchange))

    def end(self, exchange: Exchange) -> None:
        if id(exchange) in self.in_flight:
            self.in_flight.discard(id(exchange))
            del self.exchanges[id(exchange)]
            self.finished.append(
                [exchange.method, exchange.target, exchange.status, exchange.start, time.time()]
            )

    def answer(self, first: int) -> str:
        flying = [self.exchanges[key] for key in self.in_flight]
        return json.dumps(
            {
                "finished": self.finished[first:],
                "in_flight": [[e.target, e.start] for e in flying],
            }
        )


async def relay(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    upstream_address: tuple[str, int],
    delay: float,
    recorder: Recorder,
) -> None:
    """One client connection: a connection upstream of its own, requests held ``delay``
    seconds at their first chunk, answers passed on as they come."""
    client_reader, client_writer = client
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection(*upstream_address)
    except OSError:
        client_writer.close()
        return
    waiting: deque[Exchange] = deque()  # sent upstream, not yet answered, in order

    async def requests() -> None:
        framer = Framer()
        exchange: Exchange | None = None
        while data := await client_reader.read(READ_SIZE):
            while data:
                starts = framer.between_messages
                if starts:
                    exchange = Exchange(time.time())
                    recorder.begin(exchange)
                    waiting.append(exchange)
                used, complete = framer.feed(data)
                if exchange is not None and framer.head is not None and not exchange.method:
                    method, target, *_ = framer.head[0].split(" ")
                    exchange.method, exchange.target = method, target
                if starts:
                    await asyncio.sleep(delay)
                upstream_writer.write(data[:used])
                data = data[used:]
                if complete:
                    exchange = None
            await upstream_writer.drain()
        if upstream_writer.can_write_eof():
            upstream_writer.write_eof()

    def method_answered() -> str:
        return waiting[0].method if waiting else ""

    async def answers() -> None:
        framer = Framer(method_answered)
        while data := await upstream_reader.read(READ_SIZE):
            while data:
                used, complete = framer.feed(data)
                if complete and not framer.interim and waiting:
                    # Its end is taken before its last bytes leave: the client cannot have
                    # them, nor return, nor send its next request, before this moment.
                    exchange = waiting.popleft()
                    if framer.head is not None:
                        exchange.status = int(framer.head[0].split()[1])
                    recorder.end(exchange)
                client_writer.write(data[:used])
                data = data[used:]
            await client_writer.drain()
        while waiting:  # an answer until close, or none
            recorder.end(waiting.popleft())
        client_writer.close()

    pumps = [asyncio.ensure_future(requests()), asyncio.ensure_future(answers())]
    try:
        await asyncio.gather(*pumps)
    except OSError:  # a connection reset: the other direction stops too
        for pump in pumps:
            pump.cancel()
    finally:
        for exchange in waiting:
            recorder.end(exchange)
        upstream_writer.close()
        client_writer.close()


async def serve(upstream: str, delay_ms: float) -> None:
    parts = urlsplit(upstream)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    recorder = Recorder()
    relays: set[asyncio.Task[None]] = set()

    def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(relay((reader, writer), address, delay_ms / 1000, recorder))
        relays.add(task)
        task.add_done_callback(relays.discard)

    server = await asyncio.start_server(connected, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"listening {port}", flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command, _, argument = line.strip().partition(" ")
        if command == "records":
            print(recorder.answer(int(argument or 0)), flush=True)
    server.close()
    for task in relays:
        task.cancel()
    await asyncio.gather(*relays, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], float(sys.argv[2])))
