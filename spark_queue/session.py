"""SparkSession helpers: a local session with Delta configured, and registration of ``ringqueue``.

``local_session()`` is for scripts, tests and the demo job: ``local[2]``, UI off, Delta's SQL
extension and catalog, and ``ringqueue`` registered. ``register(spark)`` is for sessions made
elsewhere (Databricks, ``spark-submit`` with ``conf/spark-defaults.conf``).

Delta's JARs come from ``jars/`` at the project root (``make setup`` fetches them from Maven
Central with ``pom.xml``) or from the folder named by ``SPARK_QUEUE_JARS``; where neither has
them, Spark resolves ``DELTA_PACKAGE`` itself through ``spark.jars.packages``. hadoop-aws and
the AWS SDK (``jars/s3/``) go on the driver's class path, so a local session reads ``s3a://``
and ``s3://`` with delta-spark; :func:`s3a_conf` turns the connector's storage options into
the S3A settings that reach the same store.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"
JARS_ENV = "SPARK_QUEUE_JARS"


def delta_jars() -> list[str]:
    """The Delta JAR files to put on ``spark.jars``, or ``[]`` when none were fetched."""
    folder = os.environ.get(JARS_ENV)
    candidates = [Path(folder)] if folder else []
    candidates.append(Path(__file__).resolve().parent.parent / "jars")
    for candidate in candidates:
        jars = sorted(str(p) for p in candidate.glob("*.jar"))
        if any("delta-spark" in Path(j).name for j in jars):
            return jars
    return []


def s3_jars() -> list[str]:
    """hadoop-aws and the AWS SDK bundle (``jars/s3/``), or ``[]`` when none were fetched."""
    folder = os.environ.get(JARS_ENV)
    candidates = [Path(folder) / "s3"] if folder else []
    candidates.append(Path(__file__).resolve().parent.parent / "jars" / "s3")
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


def register(spark: SparkSession) -> SparkSession:
    """Register the ``ringqueue`` data source on a session made elsewhere (Databricks,
    ``spark-submit``).

    Args:
        spark: the session; it needs Delta's JARs for ``format("delta")`` reads only.

    Returns:
        The same session.
    """
    from spark_queue.datasource import RingQueueDataSource

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


def local_session(
    app_name: str = "spark-queue",
    master: str = "local[2]",
    conf: dict[str, str] | None = None,
    storage_options: Mapping[str, str] | None = None,
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

    Returns:
        The session, with ``ringqueue`` registered. An existing session is reused as
        ``SparkSession.builder.getOrCreate`` reuses one: settings a running JVM fixed at
        start (JARs, class path) then stay as they were.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.sql.streaming.stopTimeout", "60s")
        # Delta rebuilds table snapshots with 50 tasks by default: seconds of overhead per
        # commit on two cores. Two suits local[2].
        .config("spark.databricks.delta.snapshotPartitions", "2")
    )
    s3 = s3_jars()
    if s3:  # the class path, not spark.jars: see pom.xml
        builder = builder.config("spark.driver.extraClassPath", os.pathsep.join(s3))
        builder = builder.config("spark.executor.extraClassPath", os.pathsep.join(s3))
    for key, value in s3a_conf(storage_options).items():
        builder = builder.config(f"spark.hadoop.{key}", value)
    jars = delta_jars()
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    else:
        builder = builder.config("spark.jars.packages", DELTA_PACKAGE)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return register(spark)
