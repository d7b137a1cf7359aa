"""Calls on streams: each thread of a client sends its calls to a broker on one Flight
``DoExchange`` stream of its own (docs/BROKER.md "Streams of calls"), one message each way
a call, each with its own proof where the broker has a token.

An RPC a call costs both ends a gRPC call's setup and a server thread started and ended
for it (gRPC's synchronous server keeps two idle): ~0.26 ms of the broker's CPU and ~0.21 ms
of the client's, against ~0.08 ms each for a message on an open stream (32 threads, a
Flight server that answers after 50 ms, 2 cores). Through a broker every round of the group
commit waits for its ~30 callers to come back through both processes, so that CPU is a
round's time (docs/decisions/broker-streams.md).

A frame of a call is its method, a newline, its proof (what an RPC's ``authorization``
header carries, :meth:`~spark_queue.broker.sessions.ClientSession.header`; empty without a
token), a newline and its request (:func:`~spark_queue.broker.wire.encode_request`); of an
answer a byte, :data:`ANSWERED` then the encoded result, :data:`REFUSED` then the error's
payload (:func:`~spark_queue.broker.wire.encode_error`; empty where nothing was done and the
client is to commit directly), or :data:`UNPROVEN` then the one line of a call refused for
its proof (nothing done). With a token, a stream opens with a proof of its own
(:data:`STREAM_OPENING`, in its :data:`~spark_queue.broker.wire.OPENING_HEADER` header),
which the broker checks as the stream starts and which covers none of its calls: the broker
checks each call's proof before it parses its request.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, TypeAlias, cast

import pyarrow as pa

CALLS_COMMAND = b"calls"  # the DoExchange descriptor's command of a stream of calls
STREAM_OPENING = "stream"  # what a stream's own proof is for, with an empty body
ANSWERED, REFUSED, UNPROVEN = 0, 1, 2  # an answer frame's first byte
# A batch frame's first byte (no method starts with it), and its answer's: then each call
# frame (or answer frame), its length first (4 bytes, big-endian).
BATCH, BATCH_ANSWERED = b"\x00", 3
# Calls of a batch, at most (the broker refuses a larger one: nothing of it done).
MAX_BATCH_CALLS = 256


def call_frame(method: str, proof: str | None, request: bytes) -> bytes:
    return method.encode() + b"\n" + (proof or "").encode() + b"\n" + request


def parse_call(frame: bytes) -> tuple[str, str | None, bytes]:
    """A call frame's method, proof (None: none) and request (a frame without a method: an
    empty one, which the broker refuses as a malformed request)."""
    method, _, rest = frame.partition(b"\n")
    proof, _, request = rest.partition(b"\n")
    shown = proof.decode("utf-8", "replace")  # a proof is ASCII: any other is a wrong one
    return method.decode("utf-8", "replace"), shown or None, request


def answer_frame(answer: bytes) -> bytes:
    return bytes([ANSWERED]) + answer


def refusal_frame(payload: bytes) -> bytes:
    return bytes([REFUSED]) + payload


def unproven_frame(refusal: str) -> bytes:
    return bytes([UNPROVEN]) + refusal.encode()


def joined_frames(first: bytes, frames: list[bytes]) -> bytes:
    """``first``, then each of ``frames`` with its length."""
    parts = [first]
    for frame in frames:
        parts += [len(frame).to_bytes(4, "big"), frame]
    return b"".join(parts)


def split_frames(body: bytes | memoryview, limit: int) -> list[bytes] | None:
    """The frames :func:`joined_frames` joined into ``body`` (its first byte left out):
    None where it is malformed (a length past its end) or holds more than ``limit``."""
    frames: list[bytes] = []
    view, at = memoryview(body), 1
    while at < len(view):
        if len(frames) == limit or at + 4 > len(view):
            return None
        size = int.from_bytes(view[at : at + 4], "big")
        at += 4
        if at + size > len(view):
            return None
        frames.append(bytes(view[at : at + size]))
        at += size
    return frames


# A call's encoded result, or the error its caller raises (:meth:`CallStreams.call`).
Outcome: TypeAlias = Any  # a pa.Buffer, or a BaseException


def _outcome(answer: pa.Buffer) -> Outcome:
    """What an answer frame (not empty) says of its call: its encoded result, or the
    error :meth:`CallStreams.call` raises for it."""
    import pyarrow.flight as flight

    if answer[0] == ANSWERED:
        return answer[1:]
    if answer[0] == UNPROVEN:
        return flight.FlightUnauthenticatedError(answer[1:].to_pybytes().decode())
    return flight.FlightServerError("refused by the broker", extra_info=answer[1:].to_pybytes())


class StreamsNotServed(Exception):
    """The broker serves no streams of calls (one of an older release, or a Flight server
    without DoExchange): nothing of the call was done; it goes as an RPC of its own."""


class _Stream:
    __slots__ = ("opened", "reader", "writer")

    def __init__(self, writer: Any, reader: Any) -> None:
        self.writer = writer
        self.reader = reader
        self.opened = time.monotonic()

    def close(self) -> None:
        """End the stream (the broker's thread for it then ends), whatever its state."""
        with contextlib.suppress(Exception):  # what broke: its error is no call's
            self.writer.close()

    # A stream dropped unclosed (its thread ended) would be closed by Arrow's destructor,
    # which prints a close that failed (its broker gone) to stderr.
    __del__ = close


class CallStreams:
    """The streams of calls of one :class:`~spark_queue.broker.client.BrokerClient`'s
    Flight client, one per thread that calls. Thread-safe (each thread its own stream)."""

    def __init__(
        self,
        client: Any,
        call_timeout: float,
        opening: Callable[[], list[tuple[bytes, bytes]]] | None = None,
    ) -> None:
        self._client = client
        # The headers a stream opens with: its own proof where the broker has a token.
        self._opening = opening
        # A stream lives twice a call's timeout at most (its gRPC deadline): a call that
        # hangs at the broker ends with it, as an RPC ends at its timeout. A stream older
        # than one timeout is given no other call (a new one opens), so each call has its
        # whole timeout.
        self._call_timeout = call_timeout
        self._local = threading.local()
        self.served = True  # False once the broker refused a stream: RPCs from then on

    def call(self, method: str, proof: str | None, request: bytes) -> pa.Buffer:
        """Send a call on this thread's stream (opened where it has none, or where it is
        older than a call's timeout), with its ``proof`` (None: a broker without a token);
        the encoded result.

        Raises:
            StreamsNotServed: the broker refused the stream before the call was read.
            pyarrow.flight.FlightUnauthenticatedError: the broker refused the call's proof
                (nothing was done; the stream stays open).
            pyarrow.flight.FlightServerError: the broker's refusal of the call, its payload
                in ``extra_info`` (empty: nothing was done).
            pyarrow.flight.FlightError, pyarrow.ArrowException: the stream broke (the call
                may or may not have been applied).
        """
        answer = self._exchange(call_frame(method, proof, request))
        outcome = _outcome(answer)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def call_batch(self, calls: list[tuple[str, str | None, bytes]]) -> list[Outcome]:
        """Send ``calls`` (each a method, its proof and its request, as :meth:`call` takes)
        as one message on this thread's stream: each one's encoded result, or the error
        :meth:`call` would raise for it alone.

        Raises:
            StreamsNotServed, pyarrow.flight.FlightError, pyarrow.ArrowException: as
                :meth:`call`, for every call of the batch.
        """
        import pyarrow.flight as flight

        frames = [call_frame(method, proof, request) for method, proof, request in calls]
        answer = self._exchange(joined_frames(BATCH, frames))
        if answer[0] != BATCH_ANSWERED:  # the batch refused whole: nothing of it done
            outcome = _outcome(answer)
            return [outcome] * len(calls)
        answers = split_frames(answer.to_pybytes(), len(calls))
        if answers is None or len(answers) != len(calls) or not all(answers):
            self._close(getattr(self._local, "stream", None))
            raise flight.FlightUnavailableError("the broker sent a malformed answer")
        return [_outcome(pa.py_buffer(one)) for one in answers]

    def _exchange(self, frame: bytes) -> pa.Buffer:
        """Send ``frame`` on this thread's stream; the answer frame (not empty).

        Raises:
            StreamsNotServed, pyarrow.flight.FlightError, pyarrow.ArrowException: as
                :meth:`call`.
        """
        import pyarrow.flight as flight

        stream: _Stream | None = getattr(self._local, "stream", None)
        if stream is not None and time.monotonic() - stream.opened > self._call_timeout:
            self._close(stream)
            stream = None
        message = pa.py_buffer(frame)
        fresh = stream is None
        if stream is not None:
            try:
                stream.writer.write_metadata(message)
            except (flight.FlightError, pa.ArrowException):
                # Ended since its last call (the broker restarted, or stopped): the
                # call was not sent; it goes on a new stream.
                self._close(stream)
                stream, fresh = None, True
        try:
            if stream is None:
                stream = self._open()
                stream.writer.write_metadata(message)
            chunk = stream.reader.read_chunk()
        except StopIteration:  # ended without an answer
            self._close(stream)
            raise flight.FlightUnavailableError(
                "the broker ended the stream before answering"
            ) from None
        except (flight.FlightServerError, pa.ArrowNotImplementedError) as error:
            self._close(stream)
            # Refused before reading a call: a broker of an older release, or a Flight
            # server that implements no DoExchange (gRPC's UNIMPLEMENTED).
            if fresh:
                self.served = False
                raise StreamsNotServed(str(error)) from None
            raise flight.FlightUnavailableError(str(error)) from None
        except BaseException:
            self._close(stream)
            raise
        answer = chunk.app_metadata
        if answer is None or not len(answer):
            self._close(stream)
            raise flight.FlightUnavailableError("the broker sent an empty answer")
        return cast(pa.Buffer, answer)

    def _open(self) -> _Stream:
        import pyarrow.flight as flight

        headers = self._opening() if self._opening is not None else []
        options = flight.FlightCallOptions(timeout=2 * self._call_timeout, headers=headers)
        writer, reader = self._client.do_exchange(
            flight.FlightDescriptor.for_command(CALLS_COMMAND), options
        )
        stream = _Stream(writer, reader)
        self._local.stream = stream
        return stream

    def _close(self, stream: _Stream | None) -> None:
        """Forget ``stream`` and close it (its broker's thread for it then ends)."""
        self._local.stream = None
        if stream is not None:
            stream.close()
