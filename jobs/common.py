"""What the jobs share: finding the package, the SparkSession, triggers and duration flags.

Each job runs both ways:

- ``python jobs/<job>.py ...``: a local session (``spark_queue.local_session``: ``local[2]``,
  Delta configured from ``jars/`` or ``SPARK_QUEUE_JARS``, ``ringqueue`` registered);
- ``spark-submit [--master ...] jobs/<job>.py ...``: the session spark-submit configured (its
  master, ``--jars``/``--packages``, ``--conf``, ``--properties-file``); the job only registers
  ``ringqueue`` and, where the submitter set none, Delta's SQL extension and catalog;
- ``python jobs/<job>.py --remote sc://HOST:PORT ...`` (or with ``SPARK_REMOTE`` set): a Spark
  Connect session of that server, which must have Delta configured; ``ringqueue`` is
  registered on it, shipping ``spark_queue`` to the server's Python workers where they lack
  it. ``--remote local`` (``local[N]``) starts a local Connect server instead
  (``local_session(remote=True)``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent


def import_path() -> None:
    """Make ``spark_queue`` importable from the checkout when it is not installed or shipped.

    The package a user ships (``--py-files`` zip, an installed wheel) wins over the checkout,
    so the driver runs the same code as the executors.
    """
    try:
        import spark_queue  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT))


import_path()

from pyspark import SparkConf  # noqa: E402
from pyspark.errors import PySparkException  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.streaming import (  # noqa: E402
    DataStreamWriter,
    StreamingQuery,
    StreamingQueryListener,
)
from pyspark.sql.streaming.listener import (  # noqa: E402
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from spark_queue import configure_s3a, local_session, register  # noqa: E402
from spark_queue.model.arguments import ARGUMENTS, flag_type  # noqa: E402
from spark_queue.storage.location import parse_storage_flags  # noqa: E402

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
TRIGGERS = ("availableNow", "processingTime")
# A connector error as it reaches the driver: inside a Python traceback inside a JVM error.
CONNECTOR_ERROR = re.compile(r"spark_queue\.errors\.(\w+): (.+)")


def under_spark_submit() -> bool:
    """True when spark-submit (or pyspark's launcher) started this Python driver: the JVM is
    already running and told us its gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def job_session(
    app_name: str,
    storage: dict[str, str] | None = None,
    remote: str | None = None,
    spark: SparkSession | None = None,
) -> SparkSession:
    """The session a job runs in: ``spark`` where the caller gave one (a notebook's, which
    the job then leaves running: :func:`end_session`), else a Spark Connect session when
    ``remote`` is given (``sc://HOST:PORT``, or ``local``/``local[N]`` for a local Connect
    server), else spark-submit's (master and JARs left to it), else local; its S3A configured
    from the job's ``--storage-option`` flags (checkpoints, outputs)."""
    if spark is not None:
        if storage:
            configure_s3a(spark, storage)
        return register(spark)
    if remote and remote.startswith("local"):
        return local_session(app_name, master=remote, storage_options=storage, remote=True)
    if remote:
        spark = SparkSession.builder.remote(remote).getOrCreate()
        if storage:
            configure_s3a(spark, storage)
        return register(spark)
    if not under_spark_submit():
        return local_session(app_name=app_name, storage_options=storage)
    submitted = SparkConf()  # spark-submit's --conf, --properties-file, --master ...
    builder = SparkSession.builder.appName(app_name)
    for key, value in DELTA_CONF.items():
        if not submitted.contains(key):
            builder = builder.config(key, value)
    return register(builder.getOrCreate())


def end_session(spark: SparkSession, given: SparkSession | None) -> None:
    """Stop the job's session, unless the caller gave it (``main(argv, spark=...)``)."""
    if given is None:
        spark.stop()


def add_remote_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--remote",
        default=os.environ.get("SPARK_REMOTE") or None,
        type=_remote_flag,
        metavar="sc://HOST:PORT",
        help="run on this Spark Connect server (default: $SPARK_REMOTE when set); 'local' or "
        "'local[N]' starts a local one with Delta configured. Without it: spark-submit's "
        "session, else a local classic one",
    )


def _remote_flag(text: str) -> str:
    """argparse type: a Spark Connect URL, or ``local[N]``."""
    if not text.startswith(("sc://", "local")):
        raise argparse.ArgumentTypeError(
            f"must be a Spark Connect URL sc://HOST:PORT or local[N], got {text!r}"
        )
    return text


def table_location(text: str) -> str:
    """``--path`` as the connector takes it: a local path made absolute here, on the driver
    (Spark's Python workers do not share its working directory), a URI unchanged."""
    return text if "://" in text else os.path.abspath(text)


def add_storage_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        dest="storage_options",
        type=_storage_flag,
        help="a storage option of the object store the queue table is on, passed to the "
        "connector as storage.KEY (AWS_ENDPOINT_URL=..., AZURE_STORAGE_ACCOUNT_KEY=...; "
        "docs/STORAGE.md); repeat for more; keys left out come from the environment",
    )


def _storage_flag(text: str) -> str:
    """argparse type: ``KEY=VALUE`` (the message never shows the value)."""
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError("takes KEY=VALUE, say AWS_REGION=eu-west-1")
    return text


def storage_options(args: argparse.Namespace) -> dict[str, str]:
    """``--storage-option`` flags as delta-rs storage options (upper-case keys)."""
    return parse_storage_flags(args.storage_options)


def add_trigger_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--trigger",
        choices=TRIGGERS,
        default="availableNow",
        help="availableNow: process what is there at start, in bounded micro-batches, then "
        "stop (a batch job; schedule it). processingTime: a long-running query, one "
        "micro-batch every --interval, until the job is stopped (default: %(default)s)",
    )
    parser.add_argument(
        "--interval",
        default="10 seconds",
        help="micro-batch interval with --trigger processingTime (default: %(default)s)",
    )


def with_trigger(writer: DataStreamWriter, args: argparse.Namespace) -> DataStreamWriter:
    """``writer`` with the trigger of ``--trigger``/``--interval``."""
    if args.trigger == "availableNow":
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=args.interval)


def argument_type(name: str) -> Callable[[str], Any]:
    """argparse type of the argument ``name`` of the specification."""
    return flag_type(ARGUMENTS[name].kind, ARGUMENTS[name].flag)


# A whole number >= 1, as maxMessagesPerTrigger is.
positive_int = argument_type("max_messages")


def fail(prog: str, message: str, status: int = 1) -> NoReturn:
    """Exit with ``status`` and one line naming the job and what went wrong."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(status)


def explain(error: Exception) -> str:
    """One line for a failed query: the connector's own error if it raised one (it names the
    option or queue), else the first line of Spark's message."""
    text = str(error)
    found = CONNECTOR_ERROR.search(text)
    if found:
        return f"{found.group(1)}: {found.group(2).strip()}"
    message = error.getMessage() if isinstance(error, PySparkException) else text
    return next((line.strip() for line in message.splitlines() if line.strip()), text)


class Progress(StreamingQueryListener):
    """Micro-batches that read rows, and the rows, of the one query a job runs.

    ``StreamingQuery.recentProgress`` keeps only the last 100 batches, so a long run's totals
    are counted here, from Spark's progress events.
    """

    def __init__(self) -> None:
        self.batches = 0
        self.rows = 0
        self.terminated = threading.Event()

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        rows = event.progress.numInputRows
        if rows > 0:
            self.batches += 1
            self.rows += rows

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        self.terminated.set()


def run_query(prog: str, spark: SparkSession, start: Callable[[], StreamingQuery]) -> Progress:
    """Start a streaming query of ``spark``, wait for it to end (availableNow) or fail, and
    return what it did. A failure exits with status 1 and :func:`explain`'s line, not a JVM
    stack trace (classic) or a gRPC error (Connect)."""
    progress = Progress()
    spark.streams.addListener(progress)
    try:
        start().awaitTermination()
    except PySparkException as error:
        fail(prog, explain(error))
    # Listener events arrive asynchronously: the last progress comes before the termination.
    progress.terminated.wait(timeout=60)
    spark.streams.removeListener(progress)
    return progress
