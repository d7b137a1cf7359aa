"""SparkSession helpers: a local session with Delta configured, and registration of ``ringqueue``.

``local_session()`` is for scripts, tests and the demo job: ``local[2]``, UI off, Delta's SQL
extension and catalog, and ``ringqueue`` registered. ``register(spark)`` is for sessions made
elsewhere (Databricks, ``spark-submit`` with ``conf/spark-defaults.conf``).

Delta's JARs come from ``jars/`` at the project root (``make setup`` fetches them from Maven
Central with ``pom.xml``) or from the folder named by ``SPARK_QUEUE_JARS``; where neither has
them, Spark resolves ``DELTA_PACKAGE`` itself through ``spark.jars.packages``.
"""

from __future__ import annotations

import os
import sys
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


def register(spark: SparkSession) -> SparkSession:
    """Register the ``ringqueue`` data source on an existing session and return the session."""
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
) -> SparkSession:
    """Build (or reuse) a local SparkSession with Delta and ``ringqueue`` ready.

    Workers run this interpreter (``PYSPARK_PYTHON``), else the JVM starts whatever
    ``python3`` is on PATH, which may lack pyarrow and deltalake.
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
