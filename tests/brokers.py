"""Queue brokers as the tests run them: real ``spark-queue broker`` processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.flight as flight

from spark_queue.broker.auth import new_nonce, token_key
from spark_queue.broker.client import BrokerClient
from spark_queue.broker.sessions import HELLO_ACTION, ClientSession, hello_body, open_session

START_TIMEOUT = 60.0


class BrokerProcess:
    """``spark-queue broker PATH FLAGS...`` in a process of its own, on a free port of
    127.0.0.1 unless ``--listen`` says otherwise; its log (stderr) goes to ``log_path``;
    ``entry`` is what the interpreter runs (arguments before the CLI's own).
    Starting returns once it has announced its address (it then listens and has written its
    record)."""

    def __init__(
        self,
        path: str,
        *flags: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        token: str | None = None,
        entry: tuple[str, ...] = ("-m", "spark_queue.cli"),
    ) -> None:
        self.path = path
        self.log_path = log_path
        self.token = token
        self._log = open(log_path, "w")  # noqa: SIM115 (closed by stop/kill)
        self.process = subprocess.Popen(
            [sys.executable, *entry, "broker", path, *flags],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, **(env or {})},
        )
        assert self.process.stdout is not None
        self.announcement = self.process.stdout.readline()
        if " at " not in self.announcement:
            self.process.wait(timeout=START_TIMEOUT)
            raise RuntimeError(f"the broker did not start: {log_path.read_text()}")
        self.address = self.announcement.split(" at ", 1)[1].split()[0]
        self.id = self.announcement.split()[2].rstrip(":")
        # What a client is given to reach it: over TLS where it serves TLS.
        self.target = f"tls://{self.address}" if "(TLS, " in self.announcement else self.address

    def client(self) -> BrokerClient:
        return BrokerClient(self.target, self.path, self.token)

    def status(self) -> dict[str, Any]:
        return self.client().status()

    def stop(self) -> int:
        """SIGTERM; its exit code."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=START_TIMEOUT)
        self._close()
        return code

    def kill(self) -> None:
        """SIGKILL: no clean stop, its record stays."""
        self.process.kill()
        self.process.wait(timeout=START_TIMEOUT)
        self._close()

    def output(self) -> str:
        """What it printed and logged (after it stopped)."""
        return self.announcement + self.log_path.read_text()

    def _close(self) -> None:
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.kill()
        self._close()


class Impostor:
    """``python -m tests.impostor MODE --to BROKER --log JOURNAL FLAGS...`` (see that
    module): a process without the token between a client and the broker at ``broker``;
    :attr:`port` is where clients reach it, :meth:`journal` what it got."""

    def __init__(self, mode: str, broker: str, journal: Path, *flags: str) -> None:
        self.journal_path = journal
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.impostor",
                mode,
                "--to",
                broker,
                "--log",
                str(journal),
                *flags,
            ],
            stdout=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "SPARK_QUEUE_BROKER_TOKEN"},
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("listening "):
            self.process.kill()
            raise RuntimeError(f"the impostor did not start: {line!r}")
        self.port = int(line.split()[1])

    def journal(self) -> list[dict[str, Any]]:
        if not self.journal_path.exists():
            return []
        return [json.loads(line) for line in self.journal_path.read_text().splitlines()]

    def __enter__(self) -> Impostor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait(timeout=START_TIMEOUT)
        if self.process.stdout is not None:
            self.process.stdout.close()


def wait_until(condition: Callable[[], bool], timeout: float = 120.0, what: str = "") -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.02)


def session_with(address: str, token: str) -> ClientSession:
    """A session with the broker at ``address``, which holds ``token``, opened by a hello as
    a client opens one: its proofs for calls made by hand."""
    client = flight.FlightClient(f"grpc://{address}")
    nonce = new_nonce()
    hello = flight.Action(HELLO_ACTION, hello_body(nonce, address))
    answer = next(iter(client.do_action(hello))).body.to_pybytes()
    client.close()
    session = open_session(token_key(token), address, nonce, answer, None)
    assert session is not None
    return session
