"""The jobs on a real standalone Spark cluster: a master and a worker on localhost.

The cluster is started from the installed pyspark with ``spark-class`` (no SPARK_HOME set up
by hand), ``produce`` and ``consume`` are submitted to it with ``spark-submit --master
spark://...``, and spark_queue reaches the executors the way a user ships it: a zip of the
package on ``--py-files``; Delta's JARs go on ``--jars``. docs/SPARK-SUBMIT.md shows the same
commands. Run it holding /tmp/spark.lock: the cluster is six JVMs on a shared machine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest
from deltalake import DeltaTable

from spark_queue import QueueTable
from spark_queue.spark.session import delta_jars
from tests import jvm

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent
SPARK_BIN = Path(pyspark.__file__).resolve().parent / "bin"
HOST = "127.0.0.1"
# One worker of two cores: each application gets one executor of two cores. Two workers of
# one core each start two executor JVMs an application on the same two cores.
WORKERS, WORKER_CORES = 1, 2
MESSAGES, FILES = 400, 4


def package_zip(folder: Path) -> Path:
    """spark_queue as a user ships it with --py-files: the package folder, zipped."""
    target = folder / "spark_queue.zip"
    with zipfile.ZipFile(target, "w") as archive:
        for source in sorted((ROOT / "spark_queue").rglob("*.py")):
            archive.write(source, source.relative_to(ROOT))
    return target


HIDE_INSTALLED = '''"""Test only: drop the editable install's import hook for spark_queue (it
points at a checkout), so the driver and executors can import only the shipped copy."""
import sys

sys.meta_path[:] = [
    f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")
]
'''


def hide_installed(folder: Path) -> Path:
    """A folder whose ``sitecustomize`` hides an installed spark_queue; put it on PYTHONPATH."""
    target = folder / "hide-installed"
    target.mkdir()
    (target / "sitecustomize.py").write_text(HIDE_INSTALLED)
    probe = subprocess.run(
        [sys.executable, "-c", "import spark_queue"],
        env={**os.environ, "PYTHONPATH": str(target)},
        cwd=folder,
        capture_output=True,
        text=True,
    )
    assert "No module named 'spark_queue'" in probe.stderr, "the installed copy is not hidden"
    return target


@dataclass
class Cluster:
    master_url: str
    ui_url: str
    env: dict[str, str]
    logs: Path

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as response:
            return json.load(response)


def wait_for(condition, what: str, logs: Path, timeout: float = 90) -> None:
    """Poll ``condition`` (the master's JSON status) until true; fail with the logs if not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:  # the UI is not listening yet
            pass
        time.sleep(0.5)
    tails = {p.name: p.read_text()[-2000:] for p in sorted(logs.glob("*.log"))}
    pytest.fail(f"timed out waiting for {what}; logs: {json.dumps(tails, indent=1)}")


def logged(log: Path, pattern: str, logs: Path) -> str:
    """The first group of ``pattern`` in ``log``, once a daemon has written it."""
    found: list[str] = []

    def written() -> bool:
        match = re.search(pattern, log.read_text()) if log.exists() else None
        found.extend(match.groups() if match else ())
        return bool(match)

    wait_for(written, f"{pattern!r} in {log.name}", logs)
    return found[0]


def daemon(cluster_env: dict[str, str], logs: Path, name: str, *args: str) -> subprocess.Popen:
    """A master or worker JVM as its own process group (its executors join the group)."""
    log = open(logs / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        [str(SPARK_BIN / "spark-class"), *args],
        env=cluster_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    logs = tmp_path / "logs"
    logs.mkdir()
    conf_dir = tmp_path / "conf"  # empty: no one's spark-defaults.conf leaks in
    conf_dir.mkdir()
    env = {
        **os.environ,
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": HOST,
        "SPARK_LOG_DIR": str(logs),
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "SPARK_WORKER_CORES": str(WORKER_CORES),
        "SPARK_WORKER_MEMORY": "1g",
        "SPARK_DAEMON_MEMORY": "256m",
        # The master's and workers' JVMs compile with C1 only, as the drivers do (tests/jvm.py).
        "SPARK_DAEMON_JAVA_OPTS": jvm.C1_ONLY,
        "PYSPARK_PYTHON": sys.executable,
    }
    # Ports 0: the master and the workers bind free ports themselves, read back from the
    # master's log and status. (A port probed free here could be taken by another process
    # before the JVM binds it, and Spark would then move to the next port silently.)
    started: list[subprocess.Popen] = []
    try:
        started.append(
            daemon(
                env,
                logs,
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host",
                HOST,
                "--port",
                "0",
                "--webui-port",
                "0",
            )
        )
        ui_port = logged(logs / "master.log", r"and started at https?://[^\s:]+:(\d+)", logs)
        running = Cluster("", f"http://{HOST}:{ui_port}", env, logs)
        wait_for(lambda: running.state()["status"] == "ALIVE", "the master", logs)
        running.master_url = running.state()["url"]
        for n in range(WORKERS):
            started.append(
                daemon(
                    env,
                    logs,
                    f"worker{n}",
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    HOST,
                    "--webui-port",
                    "0",
                    "--work-dir",
                    str(tmp_path / f"work{n}"),
                    running.master_url,
                )
            )
        wait_for(lambda: running.state()["aliveworkers"] == WORKERS, f"{WORKERS} workers", logs)
        yield running
    finally:
        for process in reversed(started):
            stop(process)


def submit(cluster: Cluster, py_files: Path, hidden: Path, job: str, *args: object) -> dict:
    """spark-submit ``jobs/<job>.py`` to the cluster; returns the job's last JSON line.

    ``hidden`` (see :func:`hide_installed`) goes on the driver's and executors' PYTHONPATH
    and the working folder is not the checkout, so spark_queue can come only from
    ``py_files``.
    """
    command = [
        str(SPARK_BIN / "spark-submit"),
        "--master", cluster.master_url,
        "--jars", ",".join(delta_jars()),
        "--py-files", str(py_files),
        "--conf", f"spark.driver.host={HOST}",
        "--conf", "spark.executor.memory=512m",
        "--conf", f"spark.executor.cores={WORKER_CORES}",
        "--conf", f"spark.cores.max={WORKER_CORES}",
        "--conf", "spark.sql.shuffle.partitions=2",
        # Delta rebuilds its output's snapshot in 50 tasks by default: on two cores the
        # consume job took ~80 s with them, ~60 s with 2 (docs/SPARK-SUBMIT.md).
        "--conf", "spark.databricks.delta.snapshotPartitions=2",
        "--conf", "spark.ui.enabled=false",
        "--conf", f"spark.executor.extraJavaOptions={jvm.C1_ONLY}",
        "--conf", f"spark.executorEnv.PYTHONPATH={hidden}",
        str(ROOT / "jobs" / f"{job}.py"),
        *map(str, args),
    ]  # fmt: skip
    env = {**cluster.env, "PYTHONPATH": str(hidden)}
    result = subprocess.run(
        command, env=env, cwd=py_files.parent, capture_output=True, text=True, timeout=240
    )
    (cluster.logs / f"submit-{job}.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, f"{job} failed:\n{result.stderr[-6000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_produce_and_consume_on_a_standalone_cluster(cluster, tmp_path):
    assert delta_jars(), "Delta's JARs are missing: run `make setup` or set SPARK_QUEUE_JARS"
    events = tmp_path / "events"
    events.mkdir()
    expected = set()
    for f in range(FILES):
        lines = []
        for i in range(f * MESSAGES // FILES, (f + 1) * MESSAGES // FILES):
            region = ["eu", "us"][i % 2]
            expected.add((f"e-{i}", f"event {i}", region))
            lines.append(json.dumps({"id": i, "text": f"event {i}", "region": region}))
        (events / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    queues, py_files = tmp_path / "queues", package_zip(tmp_path)
    hidden = hide_installed(tmp_path)

    produced = submit(
        cluster, py_files, hidden, "produce",
        "--path", queues, "--queue", "events", "--source", "files", "--input", events,
        "--format", "json", "--schema", "id BIGINT, text STRING, region STRING",
        "--body", "text", "--message-id", "concat('e-', id)", "--key", "region",
        "--max-files-per-trigger", 1, "--checkpoint", tmp_path / "produce-chk",
    )  # fmt: skip
    assert (produced["added"], produced["ready"]) == (MESSAGES, MESSAGES)

    output = tmp_path / "out"
    consumed = submit(
        cluster, py_files, hidden, "consume",
        "--path", queues, "--queue", "events", "--consumer", "loader",
        "--output", output, "--checkpoint", tmp_path / "consume-chk",
        "--max-messages-per-trigger", 150, "--body-type", "string",
    )  # fmt: skip
    assert (consumed["messages"], consumed["batches"]) == (MESSAGES, 3)

    rows = DeltaTable(str(output)).to_pyarrow_table(columns=["message_id", "body", "key"])
    assert rows.num_rows == MESSAGES  # no message twice
    delivered = set(zip(*(rows[c].to_pylist() for c in rows.column_names), strict=True))
    assert delivered == expected  # every message, with its own body and key
    stats = QueueTable(str(queues)).stats("events")
    assert (stats["acked"], stats["ready"], stats["leased"]) == (MESSAGES, 0, 0)
    # Both applications ran on the cluster.
    apps = cluster.state()["completedapps"]
    assert sorted(app["name"] for app in apps) == ["spark-queue-consume", "spark-queue-produce"]
    # Each application's tasks ran on the cluster's executors, which had the package from
    # --py-files. Which workers an application's executors landed on, and which executors
    # ran its tasks, is Spark's scheduling: one that registers late (a loaded machine can
    # take longer than Spark's wait for resources) may get no task, or the application may
    # end first. An executor that exits as its application stops can also be replaced by
    # the master before it learns the application finished; the replacement never reaches
    # the driver. So only executors that registered with their driver count, and only
    # "some executor ran tasks" is required of each application.
    ran: dict[str, int] = {}
    for executor in tmp_path.glob("work*/app-*/*/"):
        log = (executor / "stderr").read_text() if (executor / "stderr").exists() else ""
        if "Successfully registered with driver" not in log:
            continue
        assert executor.parent.name in {a["id"] for a in apps}
        assert (executor / "spark_queue.zip").exists()  # shipped with --py-files
        if "Finished task" in log:
            ran[executor.parent.name] = ran.get(executor.parent.name, 0) + 1
    assert sorted(ran) == sorted(a["id"] for a in apps)
