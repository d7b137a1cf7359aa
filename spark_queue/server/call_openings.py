"""What a queue broker with a token checks as each Flight call starts, with its headers,
before any message of the call is read: its middleware (:class:`CredentialReader`).

Flight calls a ``DoPut``'s or ``DoExchange``'s handler only once the call's first message
(its descriptor) has arrived, and gRPC's synchronous server holds one of its threads for
the call from its start: a peer that opens one and sends nothing would hold that thread
until the call's deadline. So each opens with a proof of its own, for its opening
(:data:`~spark_queue.broker.wire.PUT_OPENING`,
:data:`~spark_queue.broker.streams.STREAM_OPENING`) with no body, in
:data:`~spark_queue.broker.wire.OPENING_HEADER`; the middleware refuses an opening without
a fresh one before the handler is called. What the call carries keeps its own proof: a
``DoPut``'s descriptor (publish's request) in its ``authorization`` header, each call on a
stream in its message, checked by the handler before the request is parsed.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow.flight as flight

from spark_queue.broker.sessions import HELLO_ACTION
from spark_queue.broker.streams import STREAM_OPENING
from spark_queue.broker.wire import (
    OPENING_HEADER,
    PUT_OPENING,
    ROUTED_METHODS,
    STATUS_ACTION,
    TOKEN_HEADER,
)

# The Flight methods a broker does not serve, as their clients name them: refused as each
# call starts, with one line (pyarrow would otherwise answer with its own traceback).
UNSERVED = {
    flight.FlightMethod.LIST_FLIGHTS: "ListFlights",
    flight.FlightMethod.GET_FLIGHT_INFO: "GetFlightInfo",
    flight.FlightMethod.GET_SCHEMA: "GetSchema",
    flight.FlightMethod.DO_GET: "DoGet",
    flight.FlightMethod.HANDSHAKE: "Handshake",
}
# The calls that open with a proof of their own, and what that proof is for.
OPENINGS = {
    flight.FlightMethod.DO_PUT: PUT_OPENING,
    flight.FlightMethod.DO_EXCHANGE: STREAM_OPENING,
}
# Checks an opening's proof (what it is for, the proof; None: none, or more than one): None
# where it holds, else the refusal's one line for the client (logged and counted).
OpeningCheck = Callable[[str, "str | None"], "str | None"]


def unserved(method: str) -> flight.FlightServerError:
    """The one error of a Flight method a broker does not serve."""
    served = ", ".join(m for m in ROUTED_METHODS if m != "publish")
    return flight.FlightServerError(
        f"{method} is not served by a spark-queue broker: it serves DoAction ({served}, "
        f"{STATUS_ACTION}, {HELLO_ACTION}) and DoPut (publish); nothing was done"
    )


class Credential(flight.ServerMiddleware):
    """A call's authorization header (None: none, or more than one), for its handler."""

    def __init__(self, header: str | None) -> None:
        self.header = header


class CredentialReader(flight.ServerMiddlewareFactory):
    """A broker with a token: refuses a ``DoPut`` or ``DoExchange`` whose opening proof
    fails ``check_opening``, and the Flight methods a broker does not serve, in one line
    each (pyarrow adds a traceback to GetSchema's error from a handler); hands each other
    call's authorization header to its handler, which checks it against what the call
    carries and can log the peer of a call it refuses (Flight tells its middleware no
    peer).

    A broker without a token (on loopback only) has no middleware: a Python middleware
    costs every call a trip into the interpreter from gRPC's thread, a tenth of 32
    processes' publish rate through a broker. Its handlers refuse the unserved methods."""

    def __init__(self, check_opening: OpeningCheck) -> None:
        self._check_opening = check_opening

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> Credential:
        name = UNSERVED.get(info.method)
        if name is not None:
            raise unserved(name)
        opening = OPENINGS.get(info.method)
        if opening is not None:
            refusal = self._check_opening(opening, _one(headers, OPENING_HEADER))
            if refusal is not None:
                raise flight.FlightUnauthenticatedError(refusal)
        return Credential(_one(headers, TOKEN_HEADER))


def _one(headers: dict[str, list[str]], name: str) -> str | None:
    """The header ``name``'s value; None where it is missing or given more than once."""
    given = headers.get(name, [])
    return given[0] if len(given) == 1 else None
