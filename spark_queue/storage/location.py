"""Where a queue table lives: its URI and the storage options that reach it.

One map of storage options (delta-rs's keys: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AZURE_STORAGE_ACCOUNT_KEY``, ``GOOGLE_SERVICE_ACCOUNT``, ...) feeds every library that
touches the table: delta-rs opens the log with it; obstore (the object_store crate delta-rs
is built on) stores files and log entries on S3, Azure and GCS with the same options mapped
to its names (:func:`obstore_arguments`); files are read through pyarrow's S3 client
(:func:`pyarrow_s3_options`) or delta-rs's own object store
(``deltalake.fs.DeltaStorageHandler``, a pyarrow filesystem). So a credential that reaches
the log reaches the files. Keys left out fall back to the environment of the process, as
delta-rs resolves it (``AWS_*`` variables, instance profiles,
``GOOGLE_APPLICATION_CREDENTIALS``, ...). Local paths use pyarrow's local filesystem and
take no options.

A :class:`Location` is pickled into tasks with its options: that is how executors reach the
store without environment variables set on every machine. Its ``repr`` and every error this
package raises name option keys, never their values (:func:`redacted`).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from spark_queue.errors import InvalidOptionError, NotAQueueTableError, StorageError

if TYPE_CHECKING:  # deltalake is imported where a table is opened
    from deltalake import DeltaTable

# The prefix of storage options among a data source's options: ``storage.AWS_REGION``.
OPTION_PREFIX = "storage."
# URI schemes delta-rs's object store serves; anything else goes to pyarrow.
OBJECT_STORE_SCHEMES = frozenset(
    {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "azure", "r2", "lakefs"}
)
# Every URI scheme a queue table may live at: a local disk's and the object stores'.
TABLE_SCHEMES = ("file", *sorted(OBJECT_STORE_SCHEMES))

_filesystems: dict[tuple[int, str, str, tuple[tuple[str, str], ...]], pafs.FileSystem] = {}
_filesystems_lock = threading.Lock()
_object_stores: dict[tuple[int, str, tuple[tuple[str, str], ...]], Any | None] = {}


# delta-rs reads its retry, runtime and log cache settings under these lower-case keys only
# (the object stores' own keys, ``AWS_REGION`` or ``timeout``, in either case): spelt in
# upper case they are ignored without a word, and ``max_retries`` stays at its default of
# 10 retries over 3 minutes.
_LOWER_CASE_KEYS = frozenset(
    {
        *("max_retries", "retry_timeout"),
        *(
            f"{prefix}{name}"
            for prefix in ("", "backoff_config.", "backoff.")
            for name in ("init_backoff", "max_backoff", "base")
        ),
        *("multi_threaded", "worker_threads", "thread_name", "enable_io", "enable_time"),
        *("max_size_memory_mb", "max_size_disk_mb", "directory"),
    }
)


def normalise_options(
    given: Mapping[str, Any] | None, *, what: str = "storage option"
) -> dict[str, str]:
    """Storage options with string values and upper-case keys, but for the keys delta-rs
    reads in lower case only (:data:`_LOWER_CASE_KEYS`: retries, backoff, its runtime).

    Raises:
        InvalidOptionError: a key is empty or a value is not a string, number or bool; the
            message names the key, never the value.
    """
    options: dict[str, str] = {}
    for key, value in (given or {}).items():
        if not isinstance(key, str) or not key.strip():
            raise InvalidOptionError(f"{what} keys must be non-empty strings; got {key!r}")
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, int | float):
            value = str(value)
        elif not isinstance(value, str):
            raise InvalidOptionError(
                f"{what} {key.strip().upper()} must be a string; got a {type(value).__name__}"
            )
        name = key.strip().upper()
        options[name.lower() if name.lower() in _LOWER_CASE_KEYS else name] = value
    return options


def parse_storage_flags(flags: list[str] | None) -> dict[str, str]:
    """``KEY=VALUE`` strings (the CLI's and jobs' ``--storage-option``) as storage options.

    Raises:
        InvalidOptionError: a flag has no ``=``.
    """
    options: dict[str, str] = {}
    for number, flag in enumerate(flags or [], start=1):
        key, sep, value = flag.partition("=")
        if not sep or not key.strip():
            # Not quoted: a flag without '=' may be a secret given without its key.
            raise InvalidOptionError(
                f"--storage-option takes KEY=VALUE (say AWS_REGION=eu-west-1); flag {number} "
                f"has no '=' or no key"
            )
        options[key.strip()] = value
    return normalise_options(options)


def redacted(options: Mapping[str, str]) -> str:
    """The keys of ``options``, for messages and reprs: values never leave this module."""
    return "{" + ", ".join(f"{key}=***" for key in sorted(options)) + "}"


# Options whose values are no secret: an error may quote them (an endpoint, a region, a flag
# or a number); every other value is taken for a secret.
_NOT_SECRET = frozenset(
    {
        *("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_REGION", "AWS_DEFAULT_REGION"),
        *("AWS_ALLOW_HTTP", "AWS_S3_ALLOW_UNSAFE_RENAME", "AWS_CONDITIONAL_PUT"),
        *("AWS_S3_LOCKING_PROVIDER", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "ALLOW_HTTP"),
        *("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_USE_EMULATOR", "TIMEOUT"),
        *_LOWER_CASE_KEYS,
    }
)
_ENDPOINT_KEYS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def scrubbed(text: str, options: Mapping[str, str]) -> str:
    """``text`` (say, a storage library's error) with every option value of ``options`` that
    may be a secret and appears in it replaced by ``***``: a SAS token or key may be part of
    a URL it quotes. Endpoints, regions and flags stay: they say where the store is."""
    secrets = [v for k, v in options.items() if k.upper() not in _NOT_SECRET and len(v) >= 4]
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(value, "***")
    return text


def one_line(text: str) -> str:
    """A storage library's error on one line: its chain of causes (delta-rs prints one per
    line, in colour) joined by ``: ``, colour codes and the arrows dropped."""
    parts = [line.strip().lstrip("\u21b3").strip() for line in _ANSI.sub("", text).splitlines()]
    return ": ".join(part for part in parts if part)


def without_userinfo(url: str) -> str:
    """``url`` without a ``user:password@`` part, which may hold a credential."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}"


# delta-rs's S3 keys and the pyarrow S3FileSystem argument each becomes.
_PYARROW_S3 = {
    "AWS_ACCESS_KEY_ID": "access_key",
    "AWS_SECRET_ACCESS_KEY": "secret_key",
    "AWS_SESSION_TOKEN": "session_token",
    "AWS_REGION": "region",
    "AWS_ENDPOINT_URL": "endpoint_override",
}
# Keys about the Delta log or plain HTTP, which the file client needs no twin of.
_LOG_ONLY_KEYS = frozenset(
    {
        "AWS_ALLOW_HTTP",
        "AWS_S3_ALLOW_UNSAFE_RENAME",
        "AWS_S3_LOCKING_PROVIDER",
        "AWS_CONDITIONAL_PUT",
        "DELTA_DYNAMO_TABLE_NAME",
    }
)
_SYNONYMS = {
    "AWS_DEFAULT_REGION": "AWS_REGION",
    "AWS_ENDPOINT": "AWS_ENDPOINT_URL",
    "AWS_TOKEN": "AWS_SESSION_TOKEN",
}


def pyarrow_s3_options(options: Mapping[str, str]) -> dict[str, Any] | None:
    """pyarrow ``S3FileSystem`` arguments with the meaning of delta-rs's S3 ``options``,
    the environment filling keys left out as delta-rs fills them; None where an option has
    no pyarrow twin (then delta-rs's own store serves the files, so nothing is lost)."""
    given = {_SYNONYMS.get(k, k): v for k, v in options.items() if k not in _LOG_ONLY_KEYS}
    if set(given) - set(_PYARROW_S3):
        return None
    for key in (*_PYARROW_S3, *_SYNONYMS):
        if _SYNONYMS.get(key, key) not in given and os.environ.get(key):
            given[_SYNONYMS.get(key, key)] = os.environ[key]
    arguments: dict[str, Any] = {_PYARROW_S3[k]: v for k, v in given.items()}
    endpoint = arguments.get("endpoint_override")
    if endpoint and "://" in endpoint:
        scheme, _, host = endpoint.partition("://")
        arguments.update(endpoint_override=host.rstrip("/"), scheme=scheme)
    if endpoint:  # an S3-compatible store: buckets in the path, as delta-rs addresses them
        arguments["force_virtual_addressing"] = False
    arguments.setdefault("region", "us-east-1")
    # Small files (state, an enqueue's messages) in one PUT, not a multipart upload.
    arguments["allow_delayed_open"] = True
    return arguments


# The obstore store (the object_store crate's, which delta-rs is built on) of each URI
# scheme it serves as delta-rs does, and the prefix of that store's environment variables.
_OBSTORE_KINDS = {
    **dict.fromkeys(("s3", "s3a"), "s3"),
    **dict.fromkeys(("az", "abfs", "abfss", "adl", "azure"), "azure"),
    "gs": "gcs",
}
_ENVIRONMENT_PREFIX = {"s3": "AWS", "azure": "AZURE", "gcs": "GOOGLE"}
# By store: delta-rs's keys (each spelling the object_store crate parses, in upper case)
# that mean the same to obstore's store, and the name obstore's config gives each. A key of
# neither this table, the HTTP client's nor the log-only ones sends the table to delta-rs.
_OBSTORE_KEYS: dict[str, dict[str, str]] = {
    "s3": {
        "AWS_ACCESS_KEY_ID": "access_key_id",
        "AWS_SECRET_ACCESS_KEY": "secret_access_key",
        "AWS_SESSION_TOKEN": "session_token",
        "AWS_TOKEN": "session_token",
        "AWS_REGION": "region",
        "AWS_DEFAULT_REGION": "region",
        "AWS_ENDPOINT_URL": "endpoint",
        "AWS_ENDPOINT": "endpoint",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "virtual_hosted_style_request",
        "AWS_CONDITIONAL_PUT": "conditional_put",
    },
    "azure": {
        **dict.fromkeys(("AZURE_STORAGE_ACCOUNT_NAME", "ACCOUNT_NAME"), "account_name"),
        **dict.fromkeys(
            (
                *("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY"),
                *("AZURE_STORAGE_MASTER_KEY", "ACCOUNT_KEY", "ACCESS_KEY", "MASTER_KEY"),
            ),
            "account_key",
        ),
        **dict.fromkeys(
            ("AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_SAS_TOKEN", "SAS_KEY", "SAS_TOKEN"),
            "sas_key",
        ),
        **dict.fromkeys(("AZURE_STORAGE_TOKEN", "BEARER_TOKEN", "TOKEN"), "token"),
        **dict.fromkeys(("AZURE_STORAGE_CLIENT_ID", "AZURE_CLIENT_ID", "CLIENT_ID"), "client_id"),
        **dict.fromkeys(
            ("AZURE_STORAGE_CLIENT_SECRET", "AZURE_CLIENT_SECRET", "CLIENT_SECRET"),
            "client_secret",
        ),
        **dict.fromkeys(
            (
                *("AZURE_STORAGE_TENANT_ID", "AZURE_STORAGE_AUTHORITY_ID", "AZURE_TENANT_ID"),
                *("AZURE_AUTHORITY_ID", "TENANT_ID", "AUTHORITY_ID"),
            ),
            "tenant_id",
        ),
        **dict.fromkeys(
            ("AZURE_FEDERATED_TOKEN_FILE", "FEDERATED_TOKEN_FILE"), "federated_token_file"
        ),
        **dict.fromkeys(("AZURE_USE_AZURE_CLI", "USE_AZURE_CLI"), "use_azure_cli"),
        **dict.fromkeys(("AZURE_STORAGE_USE_EMULATOR", "USE_EMULATOR"), "use_emulator"),
        **dict.fromkeys(("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT", "ENDPOINT"), "endpoint"),
        **dict.fromkeys(
            ("AZURE_USE_FABRIC_ENDPOINT", "USE_FABRIC_ENDPOINT"), "use_fabric_endpoint"
        ),
    },
    "gcs": {
        **dict.fromkeys(
            (
                *("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH"),
                *("SERVICE_ACCOUNT", "SERVICE_ACCOUNT_PATH"),
            ),
            "service_account",
        ),
        **dict.fromkeys(
            ("GOOGLE_SERVICE_ACCOUNT_KEY", "SERVICE_ACCOUNT_KEY"), "service_account_key"
        ),
        **dict.fromkeys(
            ("GOOGLE_APPLICATION_CREDENTIALS", "APPLICATION_CREDENTIALS"),
            "application_credentials",
        ),
        **dict.fromkeys(("GOOGLE_BASE_URL", "BASE_URL"), "base_url"),
    },
}
# The HTTP client's keys, spelt alone or after the store's prefix (``AZURE_ALLOW_HTTP``).
_OBSTORE_CLIENT = {"ALLOW_HTTP": "allow_http", "TIMEOUT": "timeout"}
# Azure credentials of different kinds: where the options and the environment together hold
# more than one, delta-rs picks the account key, then a SAS, then a token, ..., where
# object_store takes a token first, so the two could sign as different principals.
_AZURE_CREDENTIALS = frozenset(
    {"account_key", "sas_key", "token", "client_secret", "federated_token_file", "use_azure_cli"}
)
# Where the AWS SDK (delta-rs, pyarrow) finds credentials that object_store does not read.
_PROFILE_VARIABLES = ("AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")
_PROFILE_FILES = ("~/.aws/credentials", "~/.aws/config")


def obstore_arguments(
    scheme: str, options: Mapping[str, str]
) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """The obstore store (``s3``, ``azure`` or ``gcs``) of a table at ``scheme``, with its
    ``config`` and ``client_options`` of the meaning of delta-rs's ``options`` (the
    environment fills keys left out, as for delta-rs). None where obstore serves no such
    store, where an option has no twin there, or where the two libraries would find
    different credentials: an AWS profile (object_store reads none), Azure credentials of
    more than one kind (:data:`_AZURE_CREDENTIALS`)."""
    kind = _OBSTORE_KINDS.get(scheme)
    if kind is None:
        return None
    keys, prefix = _OBSTORE_KEYS[kind], _ENVIRONMENT_PREFIX[kind]
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    for key, value in options.items():
        client_key = _OBSTORE_CLIENT.get(key.removeprefix(f"{prefix}_"))
        if key in keys:
            config[keys[key]] = value
        elif client_key is not None:
            client[client_key] = value.lower() == "true" if client_key == "allow_http" else value
        elif kind != "s3" or key not in _LOG_ONLY_KEYS:
            return None
    # obstore's client options replace those its store read from the environment.
    if "allow_http" not in client and os.environ.get(f"{prefix}_ALLOW_HTTP"):
        client["allow_http"] = os.environ[f"{prefix}_ALLOW_HTTP"].lower() == "true"
    if kind == "s3":
        explicit = "access_key_id" in config or os.environ.get("AWS_ACCESS_KEY_ID")
        profiled = any(os.environ.get(name) for name in _PROFILE_VARIABLES) or any(
            os.path.exists(os.path.expanduser(path)) for path in _PROFILE_FILES
        )
        if profiled and not explicit:
            return None
    if kind == "azure":
        from_environment = {
            name for key, name in keys.items() if key.startswith("AZURE_") and os.environ.get(key)
        }
        if len((set(config) | from_environment) & _AZURE_CREDENTIALS) > 1:
            return None
    return kind, config, client


def table_uri(path: str | os.PathLike[str]) -> str:
    """A local path made absolute; URIs (``s3://``, ``file://``, ...) unchanged.

    Raises:
        InvalidOptionError: ``path`` is neither a string nor a path, is blank (which
            would make the current directory the table), or is a URI of a scheme no queue
            table lives at (:data:`TABLE_SCHEMES`).
    """
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path.strip():
        raise InvalidOptionError(
            f"path must be the queue table's location, a local path or a URI such as "
            f"s3://bucket/queues; got {path!r}"
        )
    if "://" not in path:
        return os.path.abspath(path)
    scheme, _, rest = path.partition("://")
    if scheme.lower() not in TABLE_SCHEMES:
        raise InvalidOptionError(
            f"path {without_userinfo(path)!r} has the URI scheme {scheme!r}, where no queue "
            f"table lives; it takes a local path or a URI of {', '.join(TABLE_SCHEMES)}"
        )
    return f"{scheme.lower()}://{rest}"  # as the stores' clients spell it (RFC 3986)


@dataclass(frozen=True)
class Location:
    """A queue table's URI and the storage options that reach it. Picklable."""

    uri: str
    options: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, path: str | os.PathLike[str], options: Mapping[str, Any] | None = None) -> Location:
        return cls(table_uri(path), normalise_options(options))

    def __repr__(self) -> str:
        return f"Location({self.uri!r}, storage_options={redacted(self.options)})"

    def __str__(self) -> str:
        return self.uri

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0].lower() if "://" in self.uri else ""

    def delta_options(self) -> dict[str, str] | None:
        """The options for delta-rs calls: None where there are none (the environment)."""
        return dict(self.options) or None

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem and the table root's path on it.

        S3 goes through pyarrow's own S3 client, configured from the same options
        (:func:`pyarrow_s3_options`), because it uploads a small file in one request where
        delta-rs's store makes three; where the options hold a key it cannot take, and on
        every other object store, files go through delta-rs's store. One client per bucket
        and options in each process: building one costs more than a small request.
        """
        if not self.scheme:
            return pafs.LocalFileSystem(), self.uri
        if self.scheme not in OBJECT_STORE_SCHEMES:
            at: tuple[pafs.FileSystem, str] = pafs.FileSystem.from_uri(self.uri)
            return at
        bucket, key = self._bucket_and_key()
        s3 = pyarrow_s3_options(self.options) if self.scheme in ("s3", "s3a") else None
        if s3 is not None:
            return self._client("pyarrow", lambda: pafs.S3FileSystem(**s3)), f"{bucket}/{key}"
        return self._delta_rs_client(), key

    def parents(self) -> list[tuple[str, str]]:
        """The folders above the table root, nearest first, up to the filesystem's root or
        the bucket's: each as its path on :meth:`filesystem` and as a URI (for messages)."""
        _, base = self.filesystem()
        found: list[tuple[str, str]] = []
        if self.scheme in OBJECT_STORE_SCHEMES:
            bucket, key = self._bucket_and_key()
            root = base[: len(base) - len(key)].rstrip("/")  # the bucket, or "" on delta-rs's
            parts = key.split("/") if key else []
            for count in range(len(parts) - 1, -1, -1):
                prefix = "/".join(parts[:count])
                path = "/".join(part for part in (root, prefix) if part)
                found.append((path, f"{self.scheme}://{bucket}/{prefix}".rstrip("/")))
            return found
        path = base.rstrip("/") or "/"
        while (parent := posixpath.dirname(path)) != path:
            found.append((parent, f"{self.scheme}://{parent}" if self.scheme else parent))
            path = parent
        return found

    def object_store(self) -> Any | None:
        """obstore's store of the table root (:mod:`obstore`, the object_store crate that
        delta-rs is built on) on S3, Azure and GCS: one request per file stored, with no
        ``Expect: 100-continue`` round trip first (pyarrow's S3 client waits for one), and
        conditional creates (:mod:`spark_queue.storage.delta_log`). None on other stores,
        and where the options need delta-rs's own client (:func:`obstore_arguments`). One
        per table and options in each process, the choice made once too (every commit
        asks)."""
        key = (os.getpid(), self.uri, tuple(sorted(self.options.items())))
        with _filesystems_lock:
            if key not in _object_stores:
                arguments = obstore_arguments(self.scheme, self.options)
                found = None if arguments is None else self._new_object_store(*arguments)
                _object_stores[key] = found
            return _object_stores[key]

    def _new_object_store(
        self, kind: str, config: dict[str, Any], client: dict[str, Any]
    ) -> Any | None:
        """obstore's store of ``kind``; None where obstore cannot make one of the options
        (an Azure account named nowhere): delta-rs, which cannot either, says why."""
        from obstore.exceptions import BaseError
        from obstore.store import AzureStore, GCSStore, S3Store

        bucket, prefix = self._bucket_and_key()
        settings: dict[str, Any] = {"config": config, "client_options": client}
        try:
            if kind == "azure":  # the URI may name the account (container@account.dfs...)
                return AzureStore.from_url(self.uri, **settings)
            made = S3Store if kind == "s3" else GCSStore
            return made(bucket, prefix=prefix or None, **settings)
        except BaseError:
            return None

    def delete(self, relatives: Iterable[str], *, in_order: bool = False) -> int:
        """Delete files under the table root (paths relative to it); missing ones are fine.
        Returns how many are gone.

        ``in_order``: one after another, stopping at the first that cannot be deleted, so
        the files gone are always the first ones of ``relatives`` (log cleanup: see
        :meth:`spark_queue.storage.store.QueueStore.is_latest`). Else a failure skips the file.
        """
        fs, base = self._deleting_client()
        gone = 0
        for relative in relatives:
            try:
                fs.delete_file(f"{base}/{relative}" if base else relative)
            except FileNotFoundError:
                pass
            except OSError:
                if in_order:
                    break
                continue
            gone += 1
        return gone

    def delete_each(self, relatives: Sequence[str], threads: int) -> dict[str, str]:
        """Delete files under the table root (paths relative to it), up to ``threads`` at
        once (a request each on an object store); missing ones are fine. Returns those that
        could not be deleted, with the store's error on one line."""
        fs, base = self._deleting_client()

        def delete_one(relative: str) -> str | None:
            try:
                fs.delete_file(f"{base}/{relative}" if base else relative)
            except FileNotFoundError:
                pass
            except OSError as error:
                return one_line(scrubbed(str(error), self.options))
            return None

        if not relatives:
            return {}
        with ThreadPoolExecutor(min(threads, len(relatives))) as pool:
            errors = list(pool.map(delete_one, relatives))
        return {path: error for path, error in zip(relatives, errors, strict=True) if error}

    def _deleting_client(self) -> tuple[pafs.FileSystem, str]:
        """The filesystem files are deleted through, and the table root's path on it.
        Object stores: delta-rs's store, since pyarrow's S3 client would store a folder
        marker where it deletes the last file of a prefix."""
        if self.scheme in OBJECT_STORE_SCHEMES:
            return self._delta_rs_client(), self._bucket_and_key()[1]
        return self.filesystem()

    def _bucket_and_key(self) -> tuple[str, str]:
        bucket, _, key = self.uri.split("://", 1)[1].partition("/")
        return bucket, key.rstrip("/")

    def _delta_rs_client(self) -> pafs.FileSystem:
        from deltalake.fs import DeltaStorageHandler

        root = f"{self.scheme}://{self._bucket_and_key()[0]}"
        return self._client(
            "delta-rs",
            lambda: pafs.PyFileSystem(DeltaStorageHandler(root, dict(self.options))),
        )

    def _client(self, kind: str, make: Callable[[], pafs.FileSystem]) -> pafs.FileSystem:
        """One client per kind, bucket and options in each process. By process: a client
        made before a fork must not be used after it (delta-rs refuses its runtime in a
        forked child)."""
        key = (os.getpid(), kind, self._bucket_and_key()[0], tuple(sorted(self.options.items())))
        with _filesystems_lock:
            client = _filesystems.get(key)
            if client is None:
                client = _filesystems[key] = make()
        return client

    def delta_table(self, version: int | None = None) -> DeltaTable:
        """The Delta table here (``deltalake.DeltaTable``), at ``version`` or its latest."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        try:
            return DeltaTable(self.uri, version=version, storage_options=self.delta_options())
        except OSError as error:  # the store refused or is down; no table is TableNotFoundError
            raise StorageError(self.unreachable(error)) from None
        except DeltaError as error:
            if not isinstance(error, TableNotFoundError) and os.path.isfile(self.uri):
                raise NotAQueueTableError(
                    f"{self.uri} is a file, not a queue table: point the path at a folder, "
                    f"new or a queue table's"
                ) from None
            raise

    def endpoint(self) -> str | None:
        """The object store's endpoint where one is set (an S3-compatible store), from the
        options or, as delta-rs reads it, the environment; None for the provider's own."""
        for key in _ENDPOINT_KEYS:
            value = self.options.get(key) or os.environ.get(key)
            if value:
                return without_userinfo(value)
        return None

    def unreachable(self, error: BaseException) -> str:
        """A message for ``error`` from the store, on one line: the URI, the endpoint, the
        option keys and the cause, no secrets."""
        endpoint = self.endpoint()
        at = f" through endpoint {endpoint}" if endpoint else ""
        return (
            f"cannot reach the queue table at {self.uri}{at} (storage options "
            f"{redacted(self.options)}; keys left out come from the environment): "
            f"{one_line(scrubbed(str(error), self.options))}"
        )


def check_exclusive_commits(location: Location) -> int:
    """Check that two writers' commits of one version at ``location``'s store exclude each
    other, as every writer of a queue table relies on.

    delta-rs commits version N by writing ``_delta_log/N.json`` with a conditional put
    (``If-None-Match: *``) on S3, Azure and GCS. A store that ignores the condition lets the
    second of two racing writers overwrite the first's commit, silently. The check races two
    commits of a scratch table under ``_spark_queue_probe/`` next to the table's files and
    deletes it after: its files, and on a local disk the folders it made (the table's own,
    where none existed yet).

    Args:
        location: a table's URI and storage options (``Location.of(uri, options)``).

    Returns:
        The milliseconds the check took.

    Raises:
        StorageError: both commits succeeded (the store ignores conditional puts), or the
            store cannot be reached; the message names the URI, never a credential.
    """
    import uuid

    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import CommitFailedError, DeltaError

    started = time.monotonic()
    probe = Location(
        f"{location.uri.rstrip('/')}/_spark_queue_probe/{uuid.uuid4().hex}", location.options
    )
    fs, base = probe.filesystem()
    # A local disk keeps folders (an object store has none): those the scratch table's
    # writes make go too, up to the deepest one that existed before.
    kept = _deepest_existing(base) if isinstance(fs, pafs.LocalFileSystem) else None
    rows = pa.table({"probe": pa.array([1], pa.int64())})
    once = CommitProperties(max_commit_retries=0)
    try:
        write_deltalake(probe.uri, rows, storage_options=probe.delta_options())
        first, second = probe.delta_table(), probe.delta_table()
        write_deltalake(first, rows, mode="append", commit_properties=once)
        try:
            write_deltalake(second, rows, mode="append", commit_properties=once)
        except CommitFailedError:
            return int((time.monotonic() - started) * 1000)
        raise StorageError(
            f"the store of {location.uri} does not honour conditional puts (If-None-Match): "
            f"two writers both committed version 1 of a scratch table, so one overwrote the "
            f"other. Writers of a queue table would lose commits there; use a store that "
            f"supports conditional writes (AWS S3, MinIO, Azure, GCS do)"
        )
    except (DeltaError, OSError) as error:
        raise StorageError(location.unreachable(error)) from None
    finally:
        with contextlib.suppress(OSError):
            found = fs.get_file_info(pafs.FileSelector(base, recursive=True))
            probe.delete(
                info.path[len(base) + 1 :] for info in found if info.type == pafs.FileType.File
            )
        if kept is not None:
            _remove_empty_folders(base, kept)


def _deepest_existing(path: str) -> str:
    """``path``, or its deepest ancestor that exists (a local disk)."""
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    return path


def _remove_empty_folders(path: str, kept: str) -> None:
    """Remove the empty folders in and at ``path``, then its empty ancestors below ``kept``
    (a local disk). A folder that is not empty stays: another check's, or anyone's files."""
    for folder, _, _ in os.walk(path, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    parent = os.path.dirname(path)
    while parent != kept and parent.startswith(kept):
        try:
            os.rmdir(parent)
        except OSError:
            return
        parent = os.path.dirname(parent)
