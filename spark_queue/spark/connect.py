"""Spark Connect: getting ``spark_queue`` to the server's Python workers.

On a Spark Connect session (Databricks serverless and standard access mode,
``SparkSession.builder.remote(...)``, ``pyspark --remote``) the client only pickles the
``RingQueueDataSource`` class *by reference*; every method of it runs in Python workers that
the server starts, driver-side (planning, the streaming source's offsets, the sink's commits)
and in tasks. Those workers import ``spark_queue`` from their own environment, or from the
Python files this session added as artifacts (``SparkSession.addArtifacts(..., pyfile=True)``),
which the server puts on their path for this session only.

:func:`ship_package` decides which: by default it asks the server's workers (one Python UDF)
whether they can import ``spark_queue`` and ships a zip of the client's copy only when they
cannot. An installed package is used as installed (its version is the installer's choice);
``ship=True`` or ``ship=False`` overrides the question. Nothing here touches the classic
session's ``sparkContext``, ``_jvm`` or ``_jsc``: none of them exists on a Connect session
(``tests/test_layout.py`` checks it).
"""

from __future__ import annotations

import hashlib
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard, cast

from pyspark.sql import SparkSession

if TYPE_CHECKING:  # importing Connect's session imports gRPC: for the type checker only
    from pyspark.sql._typing import UserDefinedFunctionLike
    from pyspark.sql.connect.session import SparkSession as ConnectSession

PACKAGE = Path(__file__).resolve().parents[1]
PACKAGE_NAME = PACKAGE.name


def is_connect(spark: SparkSession | ConnectSession) -> TypeGuard[ConnectSession]:
    """Whether ``spark`` is a Spark Connect client session rather than a classic one.

    Decided by the session's class, so that the check needs neither a JVM nor the
    ``connect`` extra's packages (``pyspark.sql.connect`` imports gRPC).
    """
    return type(spark).__module__.startswith("pyspark.sql.connect")


def workers_import_package(spark: ConnectSession) -> bool:
    """Whether the Python workers of ``spark``'s server can import ``spark_queue`` now (from
    their environment or from artifacts this session already added).

    Runs one Python UDF on the server. The UDF is a local function, so cloudpickle ships it
    by value: it needs nothing from ``spark_queue`` to run where ``spark_queue`` is missing.
    It is built with Connect's own ``udf``: the generic one picks its kind by the process's
    mode, which is classic where a classic session was made first.
    """
    from pyspark.sql.connect.functions import udf

    # No type hints: Connect's udf reads them to pick an Arrow or pandas kind, and warns
    # ("Cannot infer the eval type") on plain ones.
    def importable(_):
        import importlib.util

        return importlib.util.find_spec(PACKAGE_NAME) is not None

    # udf(function, type) is the UDF (its other form, udf(type), a decorator).
    probe = cast("UserDefinedFunctionLike", udf(importable, "boolean"))
    row = spark.range(1).select(probe("id")).first()
    return row is not None and bool(row[0])


def package_zip(folder: Path, session_id: str) -> Path:
    """A zip of the ``spark_queue`` package (its ``.py`` files and data, no bytecode) in
    ``folder``, for the session ``session_id``.

    Its name carries a hash of its contents, as the server refuses a second artifact of one
    name with other contents, and the session's id: one name shared by two sessions' zips
    broke the workers of one when the other was released (observed on a local server).
    """
    files = sorted(p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(PACKAGE.parent)).encode())
        digest.update(path.read_bytes())
    target = folder / f"{PACKAGE_NAME}-{digest.hexdigest()[:12]}-{session_id}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            archive.write(path, path.relative_to(PACKAGE.parent))
    return target


def ship_package(spark: ConnectSession, ship: bool | None = None) -> bool:
    """Make ``spark_queue`` importable by the Python workers of a Connect session's server.

    Args:
        spark: a Spark Connect session.
        ship: ``True`` adds the client's copy as a Python artifact; ``False`` relies on the
            server's installation; ``None`` (the default) ships only when the workers cannot
            import ``spark_queue`` (:func:`workers_import_package`).

    Returns:
        Whether the package was shipped.
    """
    if ship is None:
        ship = not workers_import_package(spark)
    if ship:
        with tempfile.TemporaryDirectory(prefix="spark-queue-artifact-") as folder:
            zipped = package_zip(Path(folder), spark.session_id)
            spark.addArtifacts(str(zipped), pyfile=True)
    return ship
