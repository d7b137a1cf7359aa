"""Where clients find a table's queue brokers: a small JSON record per broker under the
table root, ``_spark_queue/brokers/<id>.json``, rewritten by the broker every few seconds
(its heartbeat) through the same store as the table's files (docs/BROKER.md "Discovery").

A record is a plain file, not a Delta commit: heartbeats cost the table none of its commit
rate, and Delta readers never see them (files under ``_``-prefixed folders are not part of
a Delta table). It holds the broker's address and whether it wants a token, never the token;
a broker with a token signs its record with it (:mod:`spark_queue.broker.auth`), and a
client with the token uses only records that carry its signature. Safe from any thread.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import socket
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, replace

import pyarrow.fs as pafs

from spark_queue.broker.auth import record_mac, same_mac
from spark_queue.broker.wire import PROTOCOL
from spark_queue.errors import InvalidOptionError
from spark_queue.storage.location import Location

BROKERS_FOLDER = "_spark_queue/brokers"
DEFAULT_LISTEN = "127.0.0.1:0"  # loopback, a free port
# The largest request a broker takes (its JSON and, for publish, its messages as Arrow):
# a bound on what one client can make it hold, well above a publish of small messages.
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
# The least --max-request-bytes: room for a request's own JSON and a small message (a
# broker refusing everything would have every client commit around it).
MIN_MAX_REQUEST_BYTES = 1024
HEARTBEAT_SECONDS = 2.0
# How long a stopping broker waits for its open requests (--stop-timeout) before it cancels
# them and exits: a client that holds an upload open does not hold the stop up. Above the
# ~20 s a commit that loses races retries for (transaction.run): a request cancelled mid-way
# is run again by its client, and a plain publish may then be enqueued twice.
STOP_TIMEOUT_SECONDS = 30.0
# A record is live while its heartbeat is younger than this many of its broker's heartbeat
# intervals (and never less than STALE_FLOOR_SECONDS): clocks of the broker and its clients
# may differ by a few seconds.
STALE_HEARTBEATS = 5
STALE_FLOOR_SECONDS = 10.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerRecord:
    """One broker of a table, as it records itself."""

    id: str
    address: str  # host:port, where clients reach it
    table: str  # the table URI it serves
    pid: int
    host: str  # the machine it runs on (socket.gethostname)
    started_at: float  # Unix time, seconds
    heartbeat_at: float  # Unix time of the last rewrite
    heartbeat_seconds: float
    token_required: bool
    max_request_bytes: int
    protocol: int = PROTOCOL
    tls: bool = False  # reached over TLS (gRPC over TLS)
    mac: str = ""  # broker_auth.record_mac of the rest, where the broker has a token

    def content(self) -> str:
        """Everything but the signature, canonically: what the signature covers."""
        fields = asdict(self)
        del fields["mac"]
        return json.dumps(fields, sort_keys=True)

    def signed(self, key: bytes) -> BrokerRecord:
        return replace(self, mac=record_mac(key, self.content()))

    def signed_with(self, key: bytes) -> bool:
        """Whether a holder of ``key`` (of the token) wrote this record."""
        if not isinstance(self.mac, str) or not self.mac:
            return False
        return same_mac(self.mac, record_mac(key, self.content()))

    def live(self, now: float) -> bool:
        """Whether the heartbeat is recent enough to route to the broker at ``now``."""
        stale_after = max(STALE_FLOOR_SECONDS, STALE_HEARTBEATS * self.heartbeat_seconds)
        return now - self.heartbeat_at <= stale_after


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refuse_unguarded(
    host: str, guarded: bool, serving: str, remedy: str, *, tls: bool | None = None
) -> None:
    """What a broker serves beyond loopback must be guarded (the Flight token, the SQS
    access keys, the metrics token), and, where ``tls`` is given, over TLS: one rule, one
    message shape.

    Args:
        host: the address it would listen on.
        guarded: whether its secret is given.
        serving: what would be served, as the message opens (``the broker would listen``).
        remedy: what is missing and how to give it, or where to listen instead.
        tls: whether it would serve TLS, for what must beyond loopback; None: not asked.

    Raises:
        InvalidOptionError: ``host`` is not loopback and ``guarded`` is false, or ``tls``
            is False.
    """
    if is_loopback(host):
        return
    if not guarded:
        raise InvalidOptionError(f"{serving} on {host}, beyond loopback, {remedy}")
    if tls is False:
        raise InvalidOptionError(
            f"{serving} on {host}, beyond loopback, without TLS: give --tls-cert and "
            f"--tls-key, or listen on 127.0.0.1"
        )


def _folder(location: Location) -> tuple[pafs.FileSystem, str]:
    fs, base = location.filesystem()
    return fs, f"{base.rstrip('/')}/{BROKERS_FOLDER}"


def write_record(location: Location, record: BrokerRecord) -> None:
    """Write (or rewrite) ``record``. On a local disk through a rename, so that a reader
    never sees half a file; an object store's PUT is atomic by itself."""
    fs, folder = _folder(location)
    path = f"{folder}/{record.id}.json"
    body = json.dumps(asdict(record)).encode()
    if location.scheme:
        with fs.open_output_stream(path) as out:
            out.write(body)
        return
    fs.create_dir(folder, recursive=True)
    staged = f"{path}.writing"
    with fs.open_output_stream(staged) as out:
        out.write(body)
    fs.move(staged, path)


def remove_record(location: Location, broker_id: str) -> None:
    """Delete a broker's record; a missing one is fine."""
    location.delete([f"{BROKERS_FOLDER}/{broker_id}.json"])


def read_records(location: Location) -> list[BrokerRecord]:
    """Every broker record of the table, live or not; unreadable ones are skipped (a
    broker of another protocol, a file being replaced)."""
    fs, folder = _folder(location)
    found = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    records = []
    for info in found:
        if info.type != pafs.FileType.File or not info.path.endswith(".json"):
            continue
        try:
            with fs.open_input_stream(info.path) as source:
                records.append(BrokerRecord(**json.loads(source.read())))
        except (OSError, ValueError, TypeError) as error:
            log.debug("skipping broker record %s: %s", info.path, error)
    return records


def distrust(record: BrokerRecord, key: bytes | None) -> str | None:
    """Why a client holding the token of ``key`` (None: no token) may not send its calls to
    the broker of ``record``; None: it may. With a token, it trusts a record signed with
    it; without, a broker that wants none on this machine's loopback (a broker without a
    token listens nowhere else)."""
    if key is not None:
        if record.token_required and record.signed_with(key):
            return None
        return "it is not signed with this client's token"
    if record.token_required:
        return "it wants a token and this client has none"
    host = record.address.rpartition(":")[0].strip("[]")
    if is_loopback(host) and record.host == socket.gethostname():
        return None
    return "it is not on this machine's loopback"


def live_brokers(
    location: Location,
    skipped: Collection[str] = (),
    trusted: Callable[[BrokerRecord], bool] = lambda record: True,
) -> list[BrokerRecord]:
    """The brokers clients of the table may use now: the live records of this protocol
    whose id is not in ``skipped`` and that the client ``trusted``, the first started first
    (ties: by id). A queue without partitions goes to the first, so that every client picks
    the same broker and a second one stands by; a partitioned queue's partitions are
    spread over them all (:mod:`spark_queue.model.assignment`). Records the client does not
    trust are left out before anything is chosen from them: a forged record that claims an
    earlier start hides no genuine broker."""
    now = time.time()
    live = [
        r
        for r in read_records(location)
        if r.protocol == PROTOCOL and r.live(now) and r.id not in skipped and trusted(r)
    ]
    return sorted(live, key=lambda r: (r.started_at, r.id))


def remove_stale_records(location: Location) -> int:
    """Delete the records whose heartbeat stopped (brokers killed without a clean stop);
    returns how many. A broker does this as it starts."""
    now = time.time()
    stale = [r.id for r in read_records(location) if not r.live(now)]
    for broker_id in stale:
        with contextlib.suppress(OSError):
            remove_record(location, broker_id)
    return len(stale)
