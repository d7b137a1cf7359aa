"""SparkSession helpers: a local session with Delta configured, and registration of ``ringqueue``.

``local_session()`` is for scripts, tests and the demo job: ``local[2]``, UI off, Delta's SQL
extension and catalog, and ``ringqueue`` registered; ``local_session(remote=True)`` is the
same as a Spark Connect session of a local Connect server in a child process
(:func:`start_connect_server`). ``register(spark)`` is for sessions made elsewhere, classic
(``spark-submit`` with ``conf/spark-defaults.conf``, a Databricks dedicated cluster) or Spark
Connect (``SparkSession.builder.remote``, Databricks serverless and standard access mode).

Delta's JARs come from ``jars/`` at the project root (``make setup`` fetches them from Maven
Central with ``pom.xml``) or from the folder named by ``SPARK_QUEUE_JARS``; where neither has
them, Spark resolves ``DELTA_PACKAGE`` itself through ``spark.jars.packages``. hadoop-aws and
the AWS SDK (``jars/s3/``) go on the driver's class path, so a local session reads ``s3a://``
and ``s3://`` with delta-spark; :func:`s3a_conf` turns the connector's storage options into
the S3A settings that reach the same store.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from spark_queue.spark.connect import is_connect, ship_package

DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"
JARS_ENV = "SPARK_QUEUE_JARS"


def delta_jars() -> list[str]:
    """The Delta JAR files to put on ``spark.jars``, or ``[]`` when none were fetched."""
    folder = os.environ.get(JARS_ENV)
    candidates = [Path(folder)] if folder else []
    candidates.append(Path(__file__).resolve().parents[2] / "jars")
    for candidate in candidates:
        jars = sorted(str(p) for p in candidate.glob("*.jar"))
        if any("delta-spark" in Path(j).name for j in jars):
            return jars
    return []


def s3_jars() -> list[str]:
    """hadoop-aws and the AWS SDK bundle (``jars/s3/``), or ``[]`` when none were fetched."""
    folder = os.environ.get(JARS_ENV)
    candidates = [Path(folder) / "s3"] if folder else []
    candidates.append(Path(__file__).resolve().parents[2] / "jars" / "s3")
    for candidate in candidates:
        jars = sorted(str(p) for p in candidate.glob("*.jar"))
        if any("hadoop-aws" in Path(j).name for j in jars):
            return jars
    return []


# delta-rs storage option -> S3A setting with the same meaning.
_S3A_KEYS = {
    "AWS_ACCESS_KEY_ID": "fs.s3a.access.key",
    "AWS_SECRET_ACCESS_KEY": "fs.s3a.secret.key",
    "AWS_SESSION_TOKEN": "fs.s3a.session.token",
    "AWS_REGION": "fs.s3a.endpoint.region",
    "AWS_ENDPOINT_URL": "fs.s3a.endpoint",
}


def s3a_conf(storage_options: Mapping[str, str] | None = None) -> dict[str, str]:
    """Hadoop S3A settings (``fs.s3a.*``) that reach the store ``storage_options`` name.

    The options are delta-rs's keys, as the connector takes them; ``AWS_*`` environment
    variables fill the keys left out, as delta-rs fills them. An endpoint (an S3-compatible
    store) turns on path-style access, and an ``http://`` one turns TLS off. ``s3://`` is
    mapped to S3A too, so one URI serves the connector and delta-spark. Prefix the keys with
    ``spark.hadoop.`` for a session builder or ``spark-submit --conf``.

    Args:
        storage_options: the connector's storage options (delta-rs keys, any case).

    Returns:
        Hadoop settings, ``fs.s3a.*`` and ``fs.s3.impl``.
    """
    given = {k.upper(): v for k, v in (storage_options or {}).items()}
    for key in (*_S3A_KEYS, "AWS_DEFAULT_REGION", "AWS_ENDPOINT"):
        if key not in given and os.environ.get(key):
            given[key] = os.environ[key]
    given.setdefault("AWS_ENDPOINT_URL", given.get("AWS_ENDPOINT", ""))
    given.setdefault("AWS_REGION", given.get("AWS_DEFAULT_REGION", ""))
    conf = {"fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    conf.update({_S3A_KEYS[k]: v for k, v in given.items() if k in _S3A_KEYS and v})
    if "AWS_SESSION_TOKEN" in given:
        conf["fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        )
    endpoint = conf.get("fs.s3a.endpoint")
    if endpoint:
        conf["fs.s3a.path.style.access"] = str(
            given.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false").lower() != "true"
        ).lower()
        conf["fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https")).lower()
    return conf


def configure_s3a(
    spark: SparkSession, storage_options: Mapping[str, str] | None = None
) -> SparkSession:
    """Point a running session's S3A at the store ``storage_options`` name (:func:`s3a_conf`).

    Takes effect for file systems Spark has not opened yet: Hadoop caches one per bucket.

    Args:
        spark: a running session.
        storage_options: the connector's storage options (delta-rs keys, any case).

    Returns:
        The same session.
    """
    for key, value in s3a_conf(storage_options).items():
        spark.conf.set(key, value)
    return spark


def register(spark: SparkSession, ship: bool | None = None) -> SparkSession:
    """Register the ``ringqueue`` data source on a session made elsewhere (Databricks,
    ``spark-submit``, ``SparkSession.builder.remote(...)``), classic or Spark Connect.

    Args:
        spark: the session; it needs Delta's JARs for ``format("delta")`` reads only.
        ship: Spark Connect only (a classic session's workers import the driver's
            installation or ``--py-files``): ``True`` ships the client's ``spark_queue`` to
            the server's Python workers as an artifact, ``False`` relies on the server's
            installation, ``None`` ships it only where they cannot import it
            (:func:`spark_queue.spark.connect.ship_package`).

    Returns:
        The same session. Registering again is harmless.
    """
    from spark_queue.spark.datasource import RingQueueDataSource

    if is_connect(spark):
        ship_package(spark, ship)
    else:
        _py_files_for_driver_workers(spark)
    spark.dataSource.register(RingQueueDataSource)
    return spark


def _py_files_for_driver_workers(spark: SparkSession) -> None:
    """Put the driver's copies of ``--py-files`` on the PYTHONPATH of the Python workers the
    context starts from now on (the data source registered next is one of their users).

    Under spark-submit with the package shipped only by ``--py-files``, PySpark 4.2 gives those
    files to executors' workers and to the driver's planning workers, but the Python process
    that runs a streaming source's offsets on the driver (``python_streaming_source_runner``)
    cannot import them, so a ``ringqueue`` readStream failed there with "No module named
    'spark_queue'" (tests/test_cluster.py). Workers inherit ``SparkContext.environment``. On
    executors the driver's paths do not exist and are skipped by Python's import system.
    """
    from pyspark import SparkFiles

    context = spark.sparkContext
    includes = list(getattr(context, "_python_includes", None) or [])
    if not includes:
        return
    root = SparkFiles.getRootDirectory()
    current = [p for p in context.environment.get("PYTHONPATH", "").split(os.pathsep) if p]
    shipped = [os.path.join(root, name) for name in includes]
    context.environment["PYTHONPATH"] = os.pathsep.join(
        [*current, *(p for p in shipped if p not in current)]
    )


def local_conf(
    app_name: str = "spark-queue",
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The Spark settings of a local session, classic or the Connect server's: ``master``,
    UI off, Delta's SQL extension and catalog and its JARs (or ``DELTA_PACKAGE``), hadoop-aws
    on the class path, S3A from ``storage_options``, then ``conf`` (it wins)."""
    settings = {
        "spark.app.name": app_name,
        "spark.master": master,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "2g",
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.streaming.stopTimeout": "60s",
        # Delta rebuilds table snapshots with 50 tasks by default: seconds of overhead per
        # commit on two cores. Two suits local[2].
        "spark.databricks.delta.snapshotPartitions": "2",
    }
    s3 = s3_jars()
    if s3:  # the class path, not spark.jars: see pom.xml
        settings["spark.driver.extraClassPath"] = os.pathsep.join(s3)
        settings["spark.executor.extraClassPath"] = os.pathsep.join(s3)
    for key, value in s3a_conf(storage_options).items():
        settings[f"spark.hadoop.{key}"] = value
    jars = delta_jars()
    if jars:
        settings["spark.jars"] = ",".join(jars)
    else:
        settings["spark.jars.packages"] = DELTA_PACKAGE
    settings.update(conf or {})
    return settings


def local_session(
    app_name: str = "spark-queue",
    master: str = "local[2]",
    conf: dict[str, str] | None = None,
    storage_options: Mapping[str, str] | None = None,
    remote: bool = False,
) -> SparkSession:
    """Build (or reuse) a local SparkSession with Delta and ``ringqueue`` ready.

    Workers run this interpreter (``PYSPARK_PYTHON``), else the JVM starts whatever
    ``python3`` is on PATH, which may lack pyarrow and deltalake.

    Args:
        app_name: the application's name.
        master: Spark's master URL; ``local[2]`` suits a two-core machine.
        conf: more Spark settings, applied last (they win).
        storage_options: the connector's storage options (docs/STORAGE.md), also given
            to S3A (:func:`s3a_conf`) so delta-spark reads the queue tables they reach.
        remote: ``True`` returns a Spark Connect session (needs the ``connect`` extra) of a
            local Spark Connect server this process starts with the same settings
            (:func:`start_connect_server`) and stops when it exits.

    Returns:
        The session, with ``ringqueue`` registered. An existing session (or local Connect
        server) is reused as ``SparkSession.builder.getOrCreate`` reuses one: settings a
        running JVM fixed at start (JARs, class path) then stay as they were.
    """
    settings = local_conf(app_name, master, conf, storage_options)
    if remote:
        return register(connect_session(_shared_connect_server(settings).url))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return register(spark)


CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
SERVER_START_ATTEMPTS = 3


class LocalConnectServer:
    """A Spark Connect server in a child process of this one, on a port of 127.0.0.1.

    Its JVM is the driver of a local Spark application; Connect sessions reach it at
    :attr:`url`. Its output goes to :attr:`log`.
    """

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.log = log

    @property
    def url(self) -> str:
        """The ``sc://`` URL of the server, for ``SparkSession.builder.remote``."""
        return f"sc://127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 60.0) -> None:
        """End the server (SIGTERM, then SIGKILL after ``timeout`` seconds) and wait for it."""
        if not self.running():
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_connect_server(
    settings: Mapping[str, str] | None = None,
    python: str | None = None,
    timeout: float = 180.0,
) -> LocalConnectServer:
    """Start a local Spark Connect server (``spark-submit`` of ``CONNECT_SERVER_CLASS``)
    with ``settings`` (default :func:`local_conf`) on a free port; returns once it accepts
    connections.

    Args:
        settings: Spark settings of the server's application.
        python: the interpreter of the server's Python workers (``PYSPARK_PYTHON``); default
            this one.
        timeout: seconds to wait for the server to listen.

    Raises:
        RuntimeError: the server exited or did not listen in time; the message ends with its
            log.
    """
    settings = dict(local_conf() if settings is None else settings)
    settings["spark.connect.grpc.binding.address"] = "127.0.0.1"
    settings.setdefault("spark.log.level", "ERROR")
    home = os.environ.get("SPARK_HOME") or str(Path(pyspark.__file__).resolve().parent)
    # A client's own settings must not turn the server into a client.
    hidden = {"SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_GATEWAY_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    env["PYSPARK_PYTHON"] = python or sys.executable
    deadline = time.monotonic() + timeout
    for attempt in range(1, SERVER_START_ATTEMPTS + 1):
        # A port probed free may be taken before the server binds it: the server then
        # exits, and another port is tried.
        port = _free_port()
        settings["spark.connect.grpc.binding.port"] = str(port)
        command = [str(Path(home) / "bin" / "spark-submit"), "--class", CONNECT_SERVER_CLASS]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        folder = Path(tempfile.mkdtemp(prefix="spark-queue-connect-"))
        log = folder / "server.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                command, env=env, cwd=folder, stdout=output, stderr=subprocess.STDOUT
            )
        server = LocalConnectServer(process, port, log)
        while server.running() and time.monotonic() < deadline and not _listening(port):
            time.sleep(0.2)
        if server.running() and _listening(port):
            return server
        server.stop()
        if time.monotonic() >= deadline or attempt == SERVER_START_ATTEMPTS:
            break
    raise RuntimeError(
        f"the Spark Connect server did not start (log {log}):\n"
        + log.read_text(errors="replace")[-4000:]
    )


def connect_session(url: str) -> SparkSession:
    """A Spark Connect session of the server at ``url`` (``sc://HOST:PORT``), not
    registered. PySpark turns the process to Connect mode (its functions build Connect
    columns), and refuses where the process already has a classic session.
    """
    return SparkSession.builder.remote(url).getOrCreate()


_shared_server: LocalConnectServer | None = None


def _shared_connect_server(settings: Mapping[str, str]) -> LocalConnectServer:
    """The local Connect server of this process (started on first use, stopped at exit)."""
    global _shared_server
    if _shared_server is None or not _shared_server.running():
        _shared_server = start_connect_server(settings)
        atexit.register(_shared_server.stop)
    return _shared_server


def _free_port() -> int:
    """A TCP port the OS has just handed out and taken back: free, unless another process
    takes it before the server binds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True
