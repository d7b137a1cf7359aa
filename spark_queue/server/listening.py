"""Where a queue broker's servers listen (``spark-queue broker``'s ``--listen``,
``--advertise``, ``--sqs`` and ``--metrics``): addresses as given, whether one can be bound,
and what a server must have to listen beyond loopback."""

from __future__ import annotations

import socket
from collections.abc import Mapping

from spark_queue.broker.discovery import refuse_unguarded
from spark_queue.errors import BrokerError, InvalidOptionError

# An address each flag of an address could take, for messages: the Flight port, the SQS port
# of ElasticMQ (SQS's own stand-in) and the Prometheus exporters' port.
ADDRESS_EXAMPLES = {
    "--listen": "127.0.0.1:8815",
    "--advertise": "broker.internal:8815",
    "--sqs": "127.0.0.1:9324",
    "--metrics": "127.0.0.1:9464",
}


def parse_listen(text: str, flag: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as a host and a port; port 0: a free one.
    ``flag``: the flag that gave it (a key of :data:`ADDRESS_EXAMPLES`), for the message.

    Raises:
        InvalidOptionError: not of that form.
    """
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        free = "" if flag == "--advertise" else ", or port 0 for a free one"
        raise InvalidOptionError(
            f"{flag} takes HOST:PORT (say {ADDRESS_EXAMPLES[flag]}{free}); got {text!r}"
        )
    return host, int(port)


def check_bindable(host: str, port: int, flag: str) -> None:
    """That a server can listen at ``host:port`` (given by ``flag``): one of its addresses
    binds, as gRPC's server binds them (``SO_REUSEADDR``). Checked before gRPC tries, which
    logs raw lines of its own, then fails with "Server did not start properly".

    Raises:
        BrokerError: the port is taken, the host is not this machine's or does not resolve.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise BrokerError(
            f"the broker cannot listen on {host}:{port} ({flag}): {error.strerror}"
        ) from None
    refusals = []
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                refusals.append(error.strerror)
                continue
        return
    raise BrokerError(f"the broker cannot listen on {host}:{port} ({flag}): {refusals[0]}")


def check_token(host: str, token: str | None, tls: bool) -> None:
    """A broker that listens beyond loopback must have a token, and serve TLS: without it,
    whoever is on the path reads the messages and can play a call it held back.

    Raises:
        InvalidOptionError: ``host`` is not loopback and there is no token, or no TLS.
    """
    refuse_unguarded(
        host,
        bool(token),
        "the broker would listen",
        "without a token: give one with $SPARK_QUEUE_BROKER_TOKEN (or --token), or listen on "
        "127.0.0.1",
        tls=tls,
    )


def check_sqs_keys(host: str, keys: Mapping[str, str] | None) -> None:
    """An SQS API that listens beyond loopback must check signatures.

    Raises:
        InvalidOptionError: ``keys`` is empty (None, not an empty set, takes unsigned
            requests), or ``host`` is not loopback and there are no access keys.
    """
    if keys is not None and not keys:
        raise InvalidOptionError(
            "sqs_keys is empty: give access keys, or None to take unsigned requests on loopback"
        )
    refuse_unguarded(
        host,
        bool(keys),
        "the SQS API would listen",
        "without access keys: name a file of them with $SPARK_QUEUE_SQS_KEYS, or listen on "
        "127.0.0.1",
    )
