"""The local S3-compatible server the object-storage tests run against (moto's server)."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ACCESS_KEY, SECRET_KEY = "spark-queue-test-key", "spark-queue-test-secret-Zq7"
REGION = "us-east-1"
_REQUEST = re.compile(r'"(GET|PUT|HEAD|POST|DELETE) (\S+) HTTP')
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # the server colours some lines


class RequestLog:
    """The server's request log (``start_s3_server(log_path)``), read from a mark."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0

    def mark(self) -> None:
        time.sleep(0.05)  # the server writes a request's line after answering it
        self.offset = os.path.getsize(self.path)

    def since_mark(self, bucket: str | None = None) -> list[tuple[str, str]]:
        """The requests since the mark (method, target), of ``bucket``'s objects only
        where given (other tests' threads may still be at work on theirs)."""
        time.sleep(0.05)
        with open(self.path, encoding="utf-8", errors="replace") as log:
            log.seek(self.offset)
            text = _COLOUR.sub("", log.read())
        requests = _REQUEST.findall(text)
        if bucket is None:
            return requests
        return [(m, t) for m, t in requests if t.startswith((f"/{bucket}/", f"/{bucket}?"))]


def start_s3_server(log_path: str | None = None) -> tuple[subprocess.Popen, str]:
    """Start moto's server on a free port of 127.0.0.1; returns it and its endpoint URL.
    ``log_path``: where its request log goes (one line per request), else nowhere.

    The port is free when probed but may be taken by another process before the server
    binds it (other suites share the machine): a server that exits at start is started
    again on another port."""
    for _ in range(5):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=log,
        )
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return process, endpoint
            except OSError:
                time.sleep(0.1)
        process.kill()
        process.wait()
        if time.monotonic() >= deadline:
            break  # it never listened: not a port taken meanwhile
    raise RuntimeError(f"moto's S3 server did not start on {endpoint}")


def server_options(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_ALLOW_HTTP": "true",
    }


def clear_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)


def new_bucket(options: dict[str, str], label: str) -> str:
    """Create a bucket named after ``label`` (unique per call) and return its name."""
    digest = hashlib.sha1(f"{label}{time.time_ns()}".encode()).hexdigest()[:12]
    name = f"queues-{digest}"
    request = urllib.request.Request(f"{options['AWS_ENDPOINT_URL']}/{name}", method="PUT")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    return name
