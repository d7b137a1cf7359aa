"""A broker's side of the streams of calls (:mod:`spark_queue.broker.streams`): a client
thread's calls, one message each way on a ``DoExchange`` stream, each served as the same
call by ``do_action`` is, in turn, until the client ends the stream; with a token, each
only once its own proof holds (the stream's opening proof covers none of them). A message
may hold a batch of publishes (:mod:`spark_queue.broker.batching`), each call with its own
proof, served together (:mod:`spark_queue.server.call_batches`) and answered in one message.

A stream holds one of Flight's handler threads while it is open, idle or not; a broker
that stops refuses the calls that come after (nothing done: their clients commit directly)
and ends their streams. Streams idle when it stops are closed as it exits, with nothing of
them under way (:func:`~spark_queue.server.flight.run_broker`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pyarrow as pa
import pyarrow.flight as flight

from spark_queue.broker.streams import (
    BATCH,
    BATCH_ANSWERED,
    MAX_BATCH_CALLS,
    answer_frame,
    joined_frames,
    parse_call,
    refusal_frame,
    split_frames,
    unproven_frame,
)
from spark_queue.broker.wire import encode_error
from spark_queue.errors import BrokerRequestError

# Runs one call of the method named, with its request: its encoded answer, or a Flight
# error carrying the table's error in its extra_info (QueueBroker._serve).
Serve = Callable[[str, bytes], bytes]
# Checks a call's proof (method, proof, request) as an RPC's headers' is: None where it
# holds, else the refusal's one line (logged and counted: QueueBroker._check_proof).
Check = Callable[[str, str | None, bytes], str | None]
# Runs a batch's calls (each a method and its request, its proof held) at once: each one's
# answer frame, in order (QueueBroker's batches).
ServeBatch = Callable[[list[tuple[str, bytes]]], list[bytes]]


def serve_calls(
    reader: flight.MetadataRecordBatchReader,
    writer: flight.MetadataRecordBatchWriter,
    check: Check,
    serve: Serve,
    in_flight: Callable[[], AbstractContextManager[None]],
    serve_batch: ServeBatch,
) -> None:
    """Answer each call that comes on the stream until the client ends it, or until the
    broker stops (``in_flight`` refuses the call: it is answered so, and the stream ends).
    A call whose proof fails ``check`` is refused alone, its request unread. A batch's
    calls, their proofs checked, go to ``serve_batch`` together."""
    for frame in _frames(reader):
        if frame[:1] == BATCH:
            answer = _batch_answer(frame, check, serve_batch, in_flight)
            writer.write_metadata(pa.py_buffer(answer))
            if answer == _STOPPING:
                return
            continue
        method, proof, request = parse_call(frame)
        refusal = check(method, proof, request)
        if refusal is not None:
            writer.write_metadata(pa.py_buffer(unproven_frame(refusal)))
            continue
        try:
            with in_flight():
                answer = answer_frame(serve(method, request))
        except flight.FlightUnavailableError:  # stopping: nothing was done
            writer.write_metadata(pa.py_buffer(refusal_frame(b"")))
            return
        except flight.FlightError as error:
            answer = refusal_frame(error.extra_info or b"")
        writer.write_metadata(pa.py_buffer(answer))


_STOPPING = refusal_frame(b"")  # nothing was done: the client commits directly


def _batch_answer(
    frame: bytes,
    check: Check,
    serve_batch: ServeBatch,
    in_flight: Callable[[], AbstractContextManager[None]],
) -> bytes:
    """The answer to a batch of calls: each call's answer frame, those whose proof fails
    ``check`` refused alone, their requests unread; the refusal of the whole batch where it
    is malformed or the broker stops (nothing of it done)."""
    frames = split_frames(frame, MAX_BATCH_CALLS)
    if frames is None:
        error = BrokerRequestError(
            f"malformed request: a batch of calls that does not parse, or of more than "
            f"{MAX_BATCH_CALLS} calls; nothing of it was done"
        )
        return refusal_frame(encode_error(error) or b"")
    answers: list[bytes | None] = []
    proven: list[tuple[str, bytes]] = []
    for one in frames:
        method, proof, request = parse_call(one)
        refusal = check(method, proof, request)
        if refusal is None:
            proven.append((method, request))
        answers.append(None if refusal is None else unproven_frame(refusal))
    try:
        with in_flight():
            served = iter(serve_batch(proven) if proven else [])
    except flight.FlightUnavailableError:  # stopping: nothing was done
        return _STOPPING
    return joined_frames(
        bytes([BATCH_ANSWERED]), [next(served) if a is None else a for a in answers]
    )


def _frames(reader: flight.MetadataRecordBatchReader) -> Iterator[bytes]:
    """The call frames as they come (a message without metadata: an empty frame), until
    the client ends the stream or goes away (a client thread that ended drops its stream)."""
    while True:
        try:
            chunk = reader.read_chunk()
        except (StopIteration, flight.FlightError, pa.ArrowException):  # ended, or dropped
            return
        metadata = chunk.app_metadata
        yield b"" if metadata is None else metadata.to_pybytes()
