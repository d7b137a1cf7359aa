"""The SQS API's security promises (docs/SQS.md#security), each checked against real broker
processes over real sockets with botocore-signed requests: what a signature covers, its time
bound, headers given twice, the credential checked before the body, the timeouts, the
connection cap, and the keys file's rules."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from spark_queue import QueueTable
from spark_queue.errors import InvalidOptionError
from spark_queue.server.sqs import signing
from spark_queue.server.sqs.errors import SqsError
from spark_queue.server.sqs.http import CONTENT_TYPE
from spark_queue.server.sqs.limits import MAX_MESSAGE_BYTES
from spark_queue.server.sqs.signing import KEYS_ENV_VAR
from tests.brokers import BrokerProcess, wait_until

KEY_ID, SECRET = "AKIDSPARKQUEUESEC", "security-secret/with+odd=chars"
REGION = "eu-west-1"
Headers = list[tuple[str, str]]


def sqs_url(broker: BrokerProcess) -> str:
    return broker.announcement.split("SQS API at ", 1)[1].split()[0]


def address_of(endpoint: str) -> tuple[str, int]:
    parts = urlsplit(endpoint)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def client(endpoint: str) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        config=Config(retries={"max_attempts": 1}, read_timeout=30, connect_timeout=5),
    )


def private_keys(folder: Path) -> str:
    path = folder / "sqs-keys"
    path.write_text(f"{KEY_ID} {SECRET}\n")
    path.chmod(0o600)
    return str(path)


def signed(
    endpoint: str,
    target: str,
    body: bytes,
    *,
    service: str = "sqs",
    at: float | None = None,
) -> Headers:
    """The headers of a request botocore's SigV4 signer signs for ``target`` and ``body``,
    at ``at`` (default: now), in the order it sends them."""
    request = AWSRequest(
        method="POST",
        url=endpoint + "/",
        data=body,
        headers={"Content-Type": CONTENT_TYPE, "X-Amz-Target": f"AmazonSQS.{target}"},
    )
    signer = SigV4Auth(Credentials(KEY_ID, SECRET), service, REGION)
    if at is None:
        signer.add_auth(request)
    else:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(at))
        request.context["timestamp"] = stamp
        request.headers["X-Amz-Date"] = stamp
        canonical = signer.canonical_request(request)
        signature = signer.signature(signer.string_to_sign(request, canonical), request)
        names = signer.signed_headers(signer.headers_to_sign(request))
        request.headers["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={signer.scope(request)}, SignedHeaders={names}, "
            f"Signature={signature}"
        )
    return [("Host", urlsplit(endpoint).netloc), *request.headers.items()]


def request_head(headers: Headers, body_length: int, method: str = "POST") -> bytes:
    lines = [f"{method} / HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
    lines += [f"Content-Length: {body_length}", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer_of(connection: socket.socket) -> tuple[int, dict[str, Any], bytes]:
    """The HTTP answer on ``connection``: status, SQS's JSON error or answer, raw body."""
    response = http.client.HTTPResponse(connection)
    response.begin()
    raw = response.read()
    return response.status, json.loads(raw) if raw else {}, raw


def send(endpoint: str, headers: Headers, body: bytes) -> tuple[int, dict[str, Any], bytes]:
    """One raw HTTP/1.1 request, headers exactly as given (repeats and order kept)."""
    with socket.create_connection(address_of(endpoint), timeout=10) as connection:
        connection.sendall(request_head(headers, len(body)) + body)
        return answer_of(connection)


def error_code(answer: dict[str, Any]) -> str:
    return str(answer["__type"]).rsplit("#", 1)[1]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def version_of(path: str) -> int:
    return QueueTable(path, broker="off").store.location.delta_table().version()


def closed_within(connection: socket.socket, seconds: float) -> float | None:
    """Seconds until the peer closes ``connection`` (reading and dropping what it sends);
    None if it is still open after ``seconds``."""
    started = time.monotonic()
    connection.settimeout(0.1)
    while time.monotonic() - started < seconds:
        try:
            if not connection.recv(65536):
                return time.monotonic() - started
        except TimeoutError:
            continue
        except ConnectionError:
            return time.monotonic() - started
    return None


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker whose SQS API requires signatures, with the default timeouts and cap."""
    folder = tmp_path_factory.mktemp("sqs-security")
    with BrokerProcess(
        str(folder / "queues"),
        "--sqs",
        "127.0.0.1:0",
        log_path=folder / "broker.log",
        env={KEYS_ENV_VAR: private_keys(folder)},
    ) as broker:
        yield broker


@pytest.fixture
def queue(guarded: BrokerProcess) -> Iterator[tuple[str, str]]:
    """A queue of ``guarded`` holding one message: its name and URL."""
    name = f"q{time.monotonic_ns()}"
    c = client(sqs_url(guarded))
    url = c.create_queue(QueueName=name)["QueueUrl"]
    c.send_message(QueueUrl=url, MessageBody="kept")
    yield name, url


# -- what a signature covers ---------------------------------------------------------------


def test_a_captured_list_queues_replayed_as_purge_or_send_is_refused(guarded, queue):
    """A real boto3-signed ListQueues, replayed with another X-Amz-Target before the signed
    one, and two X-Amz-Content-SHA256 (the signed body's hash first, the new body's last)."""
    name, url = queue
    endpoint = sqs_url(guarded)
    sender = client(endpoint)
    captured: dict[str, Any] = {}

    def capture(request: Any, **_: Any) -> None:
        captured["headers"] = list(request.headers.items())
        captured["body"] = request.body

    sender.meta.events.register("before-send.sqs.ListQueues", capture)
    sender.list_queues()
    signed_headers = [
        (k, v.decode() if isinstance(v, bytes) else v)
        for k, v in captured["headers"]
        if k.lower() != "content-length"
    ]
    version = version_of(guarded.path)
    for action, members in (
        ("PurgeQueue", {"QueueUrl": url}),
        ("SendMessage", {"QueueUrl": url, "MessageBody": "forged"}),
    ):
        body = json.dumps(members).encode()
        forged = [
            ("Host", urlsplit(endpoint).netloc),
            ("X-Amz-Target", f"AmazonSQS.{action}"),
            *signed_headers,
            ("X-Amz-Content-SHA256", sha256(captured["body"])),
            ("X-Amz-Content-SHA256", sha256(body)),
        ]
        status, answer, _ = send(endpoint, forged, body)
        assert status == 400 and error_code(answer) == "InvalidParameterValue", (action, answer)
        assert "X-Amz-Target" in answer["message"]
    stats = QueueTable(guarded.path, broker="off").stats(name)
    assert (stats["ready"], stats["added"]) == (1, 1)
    assert version_of(guarded.path) == version


def test_a_signature_for_another_service_is_refused(guarded, queue):
    name, url = queue
    endpoint = sqs_url(guarded)
    body = json.dumps({"QueueUrl": url, "MessageBody": "for s3"}).encode()
    status, answer, _ = send(endpoint, signed(endpoint, "SendMessage", body, service="s3"), body)
    assert (status, error_code(answer)) == (403, "SignatureDoesNotMatch")
    assert "'sqs'" in answer["message"]
    assert QueueTable(guarded.path, broker="off").stats(name)["added"] == 1


def test_two_x_amz_date_headers_are_refused(guarded, queue):
    name, url = queue
    endpoint = sqs_url(guarded)
    body = json.dumps({"QueueUrl": url, "MessageBody": "dated twice"}).encode()
    headers = signed(endpoint, "SendMessage", body)
    stamp = next(v for k, v in headers if k == "X-Amz-Date")
    for extra in ("20200101T000000Z", stamp):  # another time first, the signed one last
        status, answer, _ = send(endpoint, [("X-Amz-Date", extra), *headers], body)
        assert status == 400 and "X-Amz-Date" in answer["message"], answer
    assert QueueTable(guarded.path, broker="off").stats(name)["added"] == 1
    status, _, _ = send(endpoint, headers, body)  # the request as signed is taken
    assert status == 200
    assert QueueTable(guarded.path, broker="off").stats(name)["added"] == 2


def test_a_signature_is_good_for_five_minutes_either_side_of_the_brokers_clock(guarded, queue):
    name, url = queue
    endpoint = sqs_url(guarded)
    body = json.dumps({"QueueUrl": url, "MessageBody": "on time"}).encode()
    skew = signing.CLOCK_SKEW_SECONDS
    for offset in (-skew - 60, skew + 60):
        status, answer, _ = send(
            endpoint, signed(endpoint, "SendMessage", body, at=time.time() + offset), body
        )
        assert (status, error_code(answer)) == (403, "RequestExpired"), offset
    assert QueueTable(guarded.path, broker="off").stats(name)["added"] == 1
    for offset in (-skew + 60, skew - 60):
        status, _, _ = send(
            endpoint, signed(endpoint, "SendMessage", body, at=time.time() + offset), body
        )
        assert status == 200, offset
    assert QueueTable(guarded.path, broker="off").stats(name)["added"] == 3


def test_a_signature_must_cover_the_action_and_the_real_body():
    endpoint = "http://127.0.0.1:9324"
    keys = {KEY_ID: SECRET}
    body = b"{}"

    def check(headers: Headers, sent: bytes = body) -> None:
        parsed = signing.headers_of(headers)
        signing.refuse_repeated(parsed)
        signing.verify(signing.credential(parsed, keys, time.time()), "POST", "/", parsed, sent)

    good = signed(endpoint, "ListQueues", body)
    check(good)
    untargeted = AWSRequest(method="POST", url=endpoint + "/", data=body)
    SigV4Auth(Credentials(KEY_ID, SECRET), "sqs", REGION).add_auth(untargeted)
    unsigned_target = [
        ("Host", "127.0.0.1:9324"),
        *untargeted.headers.items(),
        ("X-Amz-Target", "AmazonSQS.PurgeQueue"),
    ]
    hashed = [*good, ("X-Amz-Content-SHA256", sha256(body))]
    for headers, sent, code in (
        (unsigned_target, body, "IncompleteSignature"),  # X-Amz-Target not signed
        (good, b'{"QueueNamePrefix": "x"}', "SignatureDoesNotMatch"),  # another body
        ([*good, ("X-Amz-Content-SHA256", sha256(b"other"))], body, "SignatureDoesNotMatch"),
        (hashed, b"[]", "SignatureDoesNotMatch"),  # a hash that is not the body's
        ([(k, v) for k, v in good if k != "Authorization"], body, "MissingAuthenticationToken"),
    ):
        with pytest.raises(SqsError) as refused:
            check(headers, sent)
        assert refused.value.code == code, (headers, sent)
    check(hashed)  # a hash that is the body's, unsigned, is taken
    signed_hash = AWSRequest(
        method="POST",
        url=endpoint + "/",
        data=body,
        headers={
            "X-Amz-Target": "AmazonSQS.ListQueues",
            "X-Amz-Content-SHA256": sha256(body),
        },
    )
    SigV4Auth(Credentials(KEY_ID, SECRET), "sqs", REGION).add_auth(signed_hash)
    assert "x-amz-content-sha256" in signed_hash.headers["Authorization"]
    check([("Host", "127.0.0.1:9324"), *signed_hash.headers.items()])


def test_repeated_signed_headers_are_joined_as_aws_joins_them():
    """A signed header given twice is one value, its instances trimmed and joined with
    ',' (botocore signs it so); taking either instance alone does not match."""
    request = AWSRequest(
        method="POST",
        url="http://127.0.0.1:9324/",
        data=b"{}",
        headers={"X-Amz-Target": "AmazonSQS.ListQueues"},
    )
    request.headers["X-Amz-Meta-Team"] = "  data   lake "
    request.headers["X-Amz-Meta-Team"] = "ops"  # HTTPHeaders adds a second instance
    SigV4Auth(Credentials(KEY_ID, SECRET), "sqs", REGION).add_auth(request)
    headers = [("Host", "127.0.0.1:9324"), *request.headers.items()]
    parsed = signing.headers_of(headers)
    assert parsed["x-amz-meta-team"] == ["  data   lake ", "ops"]
    signer = signing.credential(parsed, {KEY_ID: SECRET}, time.time())
    signing.verify(signer, "POST", "/", parsed, b"{}")
    for kept in ("ops", "  data   lake "):
        alone = signing.headers_of(
            [(k, v) for k, v in headers if k != "X-Amz-Meta-Team" or v == kept]
        )
        with pytest.raises(SqsError, match="does not match"):
            signing.verify(signer, "POST", "/", alone, b"{}")


def test_an_over_long_authorization_header_is_refused_without_being_quoted(guarded):
    endpoint = sqs_url(guarded)
    headers = signed(endpoint, "ListQueues", b"{}")
    for length in (8_500, 20_000):
        padded = [
            (k, v + ", Padding=" + "a" * length) if k == "Authorization" else (k, v)
            for k, v in headers
        ]
        status, answer, raw = send(endpoint, padded, b"{}")
        assert status in (400, 403) and error_code(answer), answer
        assert KEY_ID.encode() not in raw and b"aaaa" not in raw and len(raw) < 400, raw
    long = signing.headers_of(
        [(k, v + " " * 9000) if k == "Authorization" else (k, v) for k, v in headers]
    )
    with pytest.raises(SqsError) as refused:
        signing.credential(long, {KEY_ID: SECRET}, time.time())
    assert refused.value.code == "IncompleteSignature" and KEY_ID not in refused.value.message
    assert "Traceback" not in guarded.log_path.read_text()


def test_headers_given_twice_are_refused_on_a_broker_without_keys(tmp_path):
    """Without keys (loopback) as with them, one action per request: X-Amz-Target twice is
    refused, whichever comes first."""
    path = str(tmp_path / "queues")
    with BrokerProcess(path, "--sqs", "127.0.0.1:0", log_path=tmp_path / "broker.log") as broker:
        endpoint = sqs_url(broker)
        url = client(endpoint).create_queue(QueueName="open")["QueueUrl"]
        body = json.dumps({"QueueUrl": url, "MessageBody": "twice"}).encode()
        base = [("Host", urlsplit(endpoint).netloc), ("Content-Type", CONTENT_TYPE)]
        for targets in (("SendMessage", "ListQueues"), ("ListQueues", "SendMessage")):
            headers = [*base, *(("X-Amz-Target", f"AmazonSQS.{t}") for t in targets)]
            status, answer, _ = send(endpoint, headers, body)
            assert (status, error_code(answer)) == (400, "InvalidParameterValue")
        assert QueueTable(path, broker="off").stats("open")["added"] == 0


# -- before authentication: the body, timeouts, the connection cap -------------------------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_request_without_a_good_credential_is_answered_before_its_body(guarded, queue):
    """40 requests declaring a 4 MiB body, with no credential or an unknown key, are
    answered 403 at once (the broker's timeout is 20 s) and their bodies dropped unread."""
    _, url = queue
    endpoint = sqs_url(guarded)
    declared = 4 * MAX_MESSAGE_BYTES
    good = signed(endpoint, "SendMessage", b"{}")
    unknown = [
        (k, v.replace(KEY_ID, "AKIDUNKNOWN")) if k == "Authorization" else (k, v) for k, v in good
    ]
    anonymous = [(k, v) for k, v in good if k != "Authorization"]
    before = rss_bytes(guarded.process.pid)
    connections = []
    started = time.monotonic()
    for number in range(40):
        connection = socket.create_connection(address_of(endpoint), timeout=5)
        connection.sendall(request_head(unknown if number % 2 else anonymous, declared))
        connections.append(connection)
    answers = [answer_of(c) for c in connections]
    assert time.monotonic() - started < 5
    assert {(s, error_code(a)) for s, a, _ in answers} == {
        (403, "InvalidClientTokenId"),
        (403, "MissingAuthenticationToken"),
    }
    chunk = b"x" * (1 << 20)
    for connection in connections:
        try:
            for _ in range(3):
                connection.sendall(chunk)
        except OSError:
            pass  # the broker has closed it
        connection.close()
    time.sleep(1)
    assert rss_bytes(guarded.process.pid) - before < 32 << 20
    c = client(endpoint)
    assert c.get_queue_url(QueueName=url.rsplit("/", 1)[1])["QueueUrl"] == url


def test_a_client_that_expects_100_continue_gets_it_only_with_a_good_credential(guarded, queue):
    name, url = queue
    endpoint = sqs_url(guarded)
    body = json.dumps({"QueueUrl": url, "MessageBody": "continued"}).encode()
    good = [*signed(endpoint, "SendMessage", body), ("Expect", "100-continue")]
    bad = [(k, v.replace(KEY_ID, "AKIDUNKNOWN")) for k, v in good]
    with socket.create_connection(address_of(endpoint), timeout=5) as refused:
        refused.sendall(request_head(bad, len(body)))
        status, answer, _ = answer_of(refused)
        assert (status, error_code(answer)) == (403, "InvalidClientTokenId")
    with socket.create_connection(address_of(endpoint), timeout=5) as taken:
        taken.sendall(request_head(good, len(body)))
        assert taken.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        taken.sendall(body)
        status, answer, _ = answer_of(taken)
        assert status == 200 and "MessageId" in answer
    assert QueueTable(guarded.path, broker="off").stats(name)["added"] == 2


@pytest.fixture
def quick(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker with a 1 s SQS timeout and a cap of 8 connections."""
    with BrokerProcess(
        str(tmp_path / "queues"),
        "--sqs",
        "127.0.0.1:0",
        "--sqs-timeout",
        "1s",
        "--sqs-max-connections",
        "8",
        log_path=tmp_path / "broker.log",
        env={KEYS_ENV_VAR: private_keys(tmp_path)},
    ) as broker:
        yield broker


def test_a_client_that_sends_its_head_slowly_is_disconnected_after_the_timeout(quick):
    """One byte every 0.1 s keeps a connection busy but never completes a request head:
    the broker closes it 1 s after it opened; an idle connection likewise."""
    address = address_of(sqs_url(quick))
    with (
        socket.create_connection(address, timeout=5) as idle,
        socket.create_connection(address, timeout=5) as trickling,
    ):
        started = time.monotonic()
        trickling.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        trickling.settimeout(0.1)
        closed = None
        while closed is None and time.monotonic() - started < 10:
            try:
                trickling.sendall(b"a")
                if trickling.recv(1) == b"":
                    closed = time.monotonic() - started
            except TimeoutError:
                pass
            except OSError:
                closed = time.monotonic() - started
        assert closed is not None and 0.8 < closed < 5, closed
        assert closed_within(idle, 3) is not None


def test_a_body_that_arrives_too_slowly_is_cut_off_and_nothing_is_done(quick):
    endpoint = sqs_url(quick)
    c = client(endpoint)
    url = c.create_queue(QueueName="slow")["QueueUrl"]
    body = json.dumps({"QueueUrl": url, "MessageBody": "half"}).encode()
    with socket.create_connection(address_of(endpoint), timeout=5) as connection:
        connection.sendall(request_head(signed(endpoint, "SendMessage", body), len(body)))
        connection.sendall(body[: len(body) // 2])
        started = time.monotonic()
        status, answer, _ = answer_of(connection)
        assert (status, error_code(answer)) == (408, "RequestTimeout")
        assert 0.8 < time.monotonic() - started < 5
        assert closed_within(connection, 3) is not None
    assert QueueTable(quick.path, broker="off").stats("slow")["added"] == 0


def test_the_connection_cap_holds_and_a_client_works_after_the_attackers_leave(tmp_path):
    with BrokerProcess(
        str(tmp_path / "queues"),
        "--sqs",
        "127.0.0.1:0",
        "--sqs-max-connections",
        "8",
        log_path=tmp_path / "broker.log",
        env={KEYS_ENV_VAR: private_keys(tmp_path)},
    ) as broker:
        endpoint = sqs_url(broker)
        address = address_of(endpoint)
        holders = [socket.create_connection(address, timeout=5) for _ in range(8)]
        for holder in holders:
            holder.sendall(b"POST / HTTP/1.1\r\n")  # a head begun, never finished
        time.sleep(0.5)
        started = time.monotonic()
        for _ in range(20):
            with socket.create_connection(address, timeout=5) as extra:
                status, answer, _ = answer_of(extra)
                assert (status, error_code(answer)) == (503, "ServiceUnavailable")
        assert time.monotonic() - started < 5
        with pytest.raises((botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError)):
            client(endpoint).create_queue(QueueName="capped")
        for holder in holders:
            holder.close()
        wait_until(lambda: _creates(client(endpoint)), timeout=10, what="a call after the attack")
        assert QueueTable(broker.path, broker="off").stats("capped")["added"] == 1
        broker.stop()
    log = broker.output()
    assert "Traceback" not in log
    assert log.count("beyond the cap of 8") <= 2, log


def _creates(sender: Any) -> bool:
    try:
        url = sender.create_queue(QueueName="capped")["QueueUrl"]
        sender.send_message(QueueUrl=url, MessageBody="after")
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError):
        return False
    return True


@pytest.mark.skipif(sys.platform != "linux", reason="lowers a process's limit with prlimit")
def test_running_out_of_descriptors_logs_a_line_not_a_traceback_per_accept(tmp_path):
    with BrokerProcess(
        str(tmp_path / "queues"),
        "--sqs",
        "127.0.0.1:0",
        "--sqs-max-connections",
        "10000",
        log_path=tmp_path / "broker.log",
        env={KEYS_ENV_VAR: private_keys(tmp_path)},
    ) as broker:
        endpoint = sqs_url(broker)
        pid = broker.process.pid
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        in_use = len(os.listdir(f"/proc/{pid}/fd"))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 4, hard))
        sockets = [socket.create_connection(address_of(endpoint), timeout=5) for _ in range(40)]
        time.sleep(3.5)  # the accept fails, and is tried again each second
        for connection in sockets:
            connection.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        wait_until(
            lambda: _lists(client(endpoint)), timeout=15, what="a call after descriptors are back"
        )
        broker.stop()
    log = broker.output()
    assert "Traceback" not in log
    assert 1 <= log.count("out of system resource") <= 2, log


def _lists(sender: Any) -> bool:
    try:
        sender.list_queues()
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError):
        return False
    return True


# -- the keys --------------------------------------------------------------------------------


def test_the_keys_file_is_checked_and_never_quoted(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"# the test's keys\n\n{KEY_ID} {SECRET}\nOTHER s2\n")
    keys.chmod(0o600)
    assert signing.load_keys(str(keys)) == {KEY_ID: SECRET, "OTHER": "s2"}
    keys.write_text(f"{KEY_ID} {SECRET} extra\n")
    with pytest.raises(InvalidOptionError, match="line 1") as refused:
        signing.load_keys(str(keys))
    assert SECRET not in str(refused.value)
    with pytest.raises(InvalidOptionError, match="cannot read"):
        signing.load_keys(str(tmp_path / "missing"))


def test_a_key_id_listed_twice_is_refused_naming_it(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY_ID} {SECRET}\nOTHER s2\n{KEY_ID} another-secret\n")
    keys.chmod(0o600)
    with pytest.raises(InvalidOptionError) as refused:
        signing.load_keys(str(keys))
    message = str(refused.value)
    assert KEY_ID in message and "lines 1 and 3" in message
    assert SECRET not in message and "another-secret" not in message


def broker_refusal(tmp_path: Path, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``spark-queue broker --sqs 127.0.0.1:0`` that must exit at once."""
    return subprocess.run(
        [sys.executable, "-m", "spark_queue.cli", "broker", str(tmp_path / "q"),
         "--sqs", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**{k: v for k, v in os.environ.items() if k != KEYS_ENV_VAR}, **environment},
    )  # fmt: skip


@pytest.mark.skipif(os.name != "posix", reason="file modes")
def test_a_keys_file_its_group_or_others_may_read_is_refused(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY_ID} {SECRET}\n")
    for mode in (0o644, 0o640, 0o604):
        keys.chmod(mode)
        with pytest.raises(InvalidOptionError, match="chmod 600") as refused:
            signing.load_keys(str(keys))
        assert str(keys) in str(refused.value) and f"{mode:04o}" in str(refused.value)
    keys.chmod(0o644)
    done = broker_refusal(tmp_path, {KEYS_ENV_VAR: str(keys)})
    assert done.returncode == 2 and "chmod 600" in done.stderr and SECRET not in done.stderr
    assert not (tmp_path / "q").exists()
    keys.chmod(0o400)
    assert signing.load_keys(str(keys)) == {KEY_ID: SECRET}


def test_an_empty_keys_variable_is_an_error_naming_it(tmp_path):
    for empty in ("", "  "):
        done = broker_refusal(tmp_path, {KEYS_ENV_VAR: empty})
        assert done.returncode == 2, done.stderr
        assert "SPARK_QUEUE_SQS_KEYS is set but empty" in done.stderr
    assert not (tmp_path / "q").exists()
    with pytest.raises(InvalidOptionError, match="sqs_keys is empty"):
        from spark_queue.server.listening import check_sqs_keys

        check_sqs_keys("127.0.0.1", {})
