"""Processes that stand between a token-holding client and a real queue broker, as an
attacker without the token would run them: ``python -m tests.impostor MODE --to HOST:PORT
--log FILE``. Each prints ``listening <port>`` once it listens on 127.0.0.1, then serves
until SIGTERM, and writes what it got, one JSON object a line, to ``FILE``.

- ``relay``: a Flight server of its own. It relays each client's hello to the broker at
  ``--to`` (with ``--rewrite-target``, naming the broker's address instead of its own, so
  the broker answers), hands the answer back, then tries to lease at the broker with
  whatever the answer holds. Any other call it records (its headers and what it carries)
  and tries at the broker with the call's authorization header.
- ``forward``: a Flight server that forwards every call as it came, headers included, and
  records them: what a client that dialed it sees is the broker. With ``--hold METHOD`` it
  records the calls of ``METHOD`` and does not forward them (the client hears of no answer):
  a proof made and never used.
- ``tcp``: a TCP relay that passes bytes both ways and records (hex) what clients sent.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from spark_queue.broker.wire import OPENING_HEADER, PROTOCOL

AUTHORIZATION = "authorization"


class Journal:
    """What the process got, appended one JSON object a line (thread-safe)."""

    def __init__(self, path: str) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()

    def write(self, **event: Any) -> None:
        with self._lock, self._path.open("a") as out:
            out.write(json.dumps(event) + "\n")


class _Headers(flight.ServerMiddleware):
    def __init__(self, headers: dict[str, list[str]]) -> None:
        self.headers = headers


class _HeaderReader(flight.ServerMiddlewareFactory):
    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> _Headers:
        return _Headers(headers)


def _headers(context: flight.ServerCallContext) -> dict[str, list[str]]:
    found = context.get_middleware("headers")
    return {} if found is None else found.headers


def _options(headers: dict[str, list[str]]) -> flight.FlightCallOptions:
    """Call options carrying the proofs among ``headers`` as they came."""
    carried = [
        (name.encode(), value.encode())
        for name in (AUTHORIZATION, OPENING_HEADER)
        for value in headers.get(name, [])
    ]
    return flight.FlightCallOptions(headers=carried, timeout=30)


def _passed_on(error: flight.FlightError) -> flight.FlightError:
    """The broker's error, to raise to the client as it came."""
    message = str(error).split(". gRPC client debug context")[0]
    return type(error)(message, extra_info=error.extra_info)


class Relay(flight.FlightServerBase):
    """``relay`` (see the module's docstring)."""

    def __init__(self, broker: str, table: str, journal: Journal, rewrite_target: bool) -> None:
        super().__init__("grpc://127.0.0.1:0", middleware={"headers": _HeaderReader()})
        self.broker = flight.FlightClient(f"grpc://{broker}")
        self.broker_address = broker
        self.table = table
        self.journal = journal
        self.rewrite_target = rewrite_target

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Any:
        body = action.body.to_pybytes()
        headers = _headers(context)
        if action.type != "broker-hello":
            self._call(action.type, headers, body)
            raise flight.FlightUnavailableError("the impostor serves nothing")
        self.journal.write(event="hello", body=body.decode(), headers=headers)
        if self.rewrite_target:
            hello = json.loads(body)
            body = json.dumps({**hello, "target": self.broker_address}).encode()
        relayed = flight.Action(action.type, body)
        try:
            answer = next(iter(self.broker.do_action(relayed, _options({})))).body.to_pybytes()
        except flight.FlightError as error:
            self.journal.write(event="hello-refused", error=str(error)[:300])
            raise _passed_on(error) from None
        self.journal.write(event="hello-answered", answer=answer.decode())
        self._lease_with_the_answer(json.loads(answer))
        yield flight.Result(pa.py_buffer(answer))

    def _lease_with_the_answer(self, answer: dict[str, Any]) -> None:
        """A proof made of the broker's answer, as a call's proof: the impostor's best."""
        header = f"Proof {answer.get('challenge')}.1.{answer.get('clock')}.{answer.get('proof')}"
        self._lease(header)

    def _call(self, method: str, headers: dict[str, list[str]], body: bytes) -> None:
        self.journal.write(event="call", method=method, headers=headers, body=body.hex())
        for header in headers.get(AUTHORIZATION, []):
            self._lease(header)

    def _lease(self, header: str) -> None:
        """Try to lease at the broker with ``header``; record what it answered."""
        request = {
            "protocol": PROTOCOL,
            "table": self.table,
            "method": "lease",
            "arguments": {"queue": "jobs", "consumer": "impostor", "max_messages": 100},
        }
        options = _options({AUTHORIZATION: [header]})
        action = flight.Action("lease", json.dumps(request).encode())
        try:
            leased = pa.ipc.open_stream(
                next(iter(self.broker.do_action(action, options))).body
            ).read_all()
            self.journal.write(event="leased", rows=leased.num_rows)
        except flight.FlightError as error:
            self.journal.write(event="lease-refused", error=type(error).__name__)

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        rows = reader.read_all()
        self.journal.write(event="rows", bodies=[str(b) for b in rows.column("body").to_pylist()])
        self._call("publish", _headers(context), descriptor.command or b"")
        raise flight.FlightUnavailableError("the impostor serves nothing")


class Forwarder(flight.FlightServerBase):
    """``forward`` (see the module's docstring)."""

    def __init__(self, broker: str, journal: Journal, hold: str | None) -> None:
        super().__init__("grpc://127.0.0.1:0", middleware={"headers": _HeaderReader()})
        self.broker = flight.FlightClient(f"grpc://{broker}")
        self.journal = journal
        self.hold = hold

    def _record(self, context: flight.ServerCallContext, method: str, body: bytes) -> bool:
        """Record a call; whether it is forwarded."""
        held = method == self.hold
        self.journal.write(
            event="held" if held else "forwarded",
            method=method,
            authorization=_headers(context).get(AUTHORIZATION, []),
            body=body.hex(),
        )
        return not held

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Any:
        body = action.body.to_pybytes()
        if not self._record(context, action.type, body):
            raise flight.FlightUnavailableError("held back")
        try:
            results = list(self.broker.do_action(action, _options(_headers(context))))
        except flight.FlightError as error:
            raise _passed_on(error) from None
        yield from (flight.Result(r.body) for r in results)

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        rows = reader.read_all()
        if not self._record(context, "publish", descriptor.command or b""):
            raise flight.FlightUnavailableError("held back")
        try:
            put, answers = self.broker.do_put(descriptor, rows.schema, _options(_headers(context)))
            put.write_table(rows)
            put.done_writing()
            answer = answers.read()
            put.close()
        except flight.FlightError as error:
            raise _passed_on(error) from None
        writer.write(answer)


def tcp_relay(broker: str, journal: Journal) -> None:
    """``tcp`` (see the module's docstring): serves until the process ends."""
    host, _, port = broker.rpartition(":")
    listener = socket.create_server(("127.0.0.1", 0))
    print(f"listening {listener.getsockname()[1]}", flush=True)

    def pump(source: socket.socket, sink: socket.socket, recorded: bool) -> None:
        while chunk := source.recv(65536):
            if recorded:
                journal.write(event="bytes", data=chunk.hex())
            sink.sendall(chunk)
        sink.shutdown(socket.SHUT_WR)

    while True:
        client, _ = listener.accept()
        upstream = socket.create_connection((host, int(port)))
        for source, sink, recorded in ((client, upstream, True), (upstream, client, False)):
            threading.Thread(target=pump, args=(source, sink, recorded), daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("relay", "forward", "tcp"))
    parser.add_argument("--to", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--table", default="")
    parser.add_argument("--rewrite-target", action="store_true")
    parser.add_argument("--hold")
    args = parser.parse_args()
    journal = Journal(args.log)
    if args.mode == "tcp":
        tcp_relay(args.to, journal)
        return
    server: flight.FlightServerBase
    if args.mode == "relay":
        server = Relay(args.to, args.table, journal, args.rewrite_target)
    else:
        server = Forwarder(args.to, journal, args.hold)
    print(f"listening {server.port}", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
