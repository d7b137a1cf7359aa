"""The JVM settings of every Spark driver the tests start, and the class archive they share.

A Spark driver JVM on a slow two-core machine spends most of its start loading and verifying
~17,000 classes and compiling them twice (C1, then C2). The test suite starts dozens of
drivers (its session, the crash tests' drivers, the jobs, the notebooks, the Connect
server), each living seconds to minutes. Two JVM settings take most of that away:

- a dynamic class-data-sharing archive (``jars/spark-classes.jsa``, written by ``make
  test`` once per set of packages and JARs: ``python -m tests.jvm``): the classes a queue
  session loads, parsed and verified once and mapped into every later driver. A bare
  driver's start to its first job goes from 31 s to 10-16 s on a slow
  two-core machine (docs/decisions/test-jvm-settings.md);
- C1 only (``-XX:TieredStopAtLevel=1``): C2 spends the two cores on code that is never hot
  enough to pay back in a test.

``conftest.py`` puts them in ``SPARK_SUBMIT_OPTS``, which every ``spark-submit`` (so every
PySpark driver, the Connect server too) adds to its JVM's options and every child process
inherits. An archive written by another JDK or for other JARs is not used: the JVM checks,
and starts without it (``-Xshare:auto``, its messages off). Nothing here changes what a
test checks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHIVE = ROOT / "jars" / "spark-classes.jsa"
C1_ONLY = "-XX:TieredStopAtLevel=1"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

# The work whose classes the archive holds: what most tests do (Delta, the queue's sink and
# source, a streaming query, a Python data source's workers).
WORKLOAD = """
import sys
from pyspark import SparkContext
from spark_queue import local_session

folder = sys.argv[1]
spark = local_session(app_name="spark-queue-class-archive")
spark.range(10).selectExpr("cast(id as string) as body").write.format("delta").save(
    folder + "/delta"
)
spark.read.format("delta").load(folder + "/delta").write.format("ringqueue").mode(
    "append"
).option("path", folder + "/queues").option("queue", "q").save()
query = (
    spark.readStream.format("ringqueue")
    .option("path", folder + "/queues")
    .option("queue", "q")
    .option("consumer", "c")
    .load()
    .writeStream.format("delta")
    .option("checkpointLocation", folder + "/checkpoint")
    .trigger(availableNow=True)
    .start(folder + "/out")
)
query.awaitTermination()
assert spark.read.format("delta").load(folder + "/out").count() == 10
driver = SparkContext._gateway.proc
spark.stop()
# The JVM writes the archive as it exits, which it does once its stdin closes: wait for it.
driver.stdin.close()
driver.wait()
"""


def submit_opts() -> str:
    """``SPARK_SUBMIT_OPTS`` for the tests' drivers: C1 only, and the archive once written."""
    options = [C1_ONLY]
    if ARCHIVE.exists():
        options += [f"-XX:SharedArchiveFile={ARCHIVE}", "-Xshare:auto", QUIET]
    return " ".join(options)


def write_archive(target: Path = ARCHIVE) -> None:
    """Run :data:`WORKLOAD` in a driver that writes the classes it loaded to ``target``
    when its JVM exits."""
    target.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="spark-queue-class-archive-") as folder:
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_SUBMIT_OPTS": f"{C1_ONLY} -XX:ArchiveClassesAtExit={target} {QUIET}",
        }
        run = subprocess.run([sys.executable, "-c", WORKLOAD, folder], env=env, cwd=ROOT)
    if run.returncode != 0:
        target.unlink(missing_ok=True)  # the classes of a failed run: not a session's
        raise SystemExit(f"the class archive's workload failed (exit {run.returncode})")
    if not target.exists():
        raise SystemExit(f"the JVM wrote no class archive at {target}")


if __name__ == "__main__":
    write_archive(Path(sys.argv[1]) if len(sys.argv) > 1 else ARCHIVE)
