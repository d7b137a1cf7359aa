"""The requests each operation on a queue table makes on S3, counted at the server (moto's
request log) and asserted exactly: a change that adds one fails here, without any timing.

On a warm table (this process made the last commit) a commit stores the round's files and
then creates its log entry (``_delta_log/N.json``, if absent), and reads nothing: the
process knows what it committed. Files go up in parallel (their order in the log is free);
the log entry comes last.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import urllib.parse
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from spark_queue import QueueTable
from spark_queue.commit.enqueue import reserve
from spark_queue.storage import table_view
from spark_queue.storage.table_view import TRUSTED_SECONDS
from tests.latency_proxy import LatencyProxy, RoundTrips
from tests.object_store import RequestLog

ROOT = Path(__file__).resolve().parent.parent


def requests(log: RequestLog, uri: str) -> list[tuple[str, str]]:
    """The requests since the mark to the table at ``uri``, as (method, what): ``log N``
    for version N's log entry, ``<record> file`` for a data file of that record."""
    bucket = uri.removeprefix("s3://").partition("/")[0]
    return [(method, touched(target, uri)) for method, target in log.since_mark(bucket)]


def touched(target: str, uri: str) -> str:
    """What a request ``target`` to the table at ``uri`` touched: ``log N`` for version N's
    log entry, ``<record> file`` for a data file of that record, else the target."""
    bucket, _, root = uri.removeprefix("s3://").partition("/")
    path = urllib.parse.unquote(target.split("?", 1)[0]).removeprefix(f"/{bucket}/{root}/")
    if path.startswith("_delta_log/"):
        name = path.removeprefix("_delta_log/")
        return f"log {int(name[:20])}" if name[:20].isdigit() else f"log {name}"
    if path.startswith("record="):
        return f"{path.split('/', 1)[0].removeprefix('record=')} file"
    return target


def files_then_entry(found: list[tuple[str, str]], files: list[str], version: int) -> None:
    """``found`` is a PUT of each of ``files`` (any order), then one of ``version``'s
    log entry, and nothing else."""
    assert sorted(found[:-1]) == sorted(("PUT", f"{record} file") for record in files), found
    assert found[-1] == ("PUT", f"log {version}"), found


def test_a_warm_publish_lease_and_ack_store_their_files_and_the_entry_and_read_nothing(
    s3_table: str, s3_options: dict[str, str], s3_requests: RequestLog
) -> None:
    table = QueueTable(s3_table, storage_options=s3_options, broker="off")
    table.publish("q", [f"m{i}" for i in range(20)])
    version = table.store.view(probe=False).version

    s3_requests.mark()
    assert table.publish("q", ["one"]).seqs == [20]
    files_then_entry(requests(s3_requests, s3_table), ["message", "queue"], version + 1)

    s3_requests.mark()
    leased = table.lease("q", "c", max_messages=10)
    assert leased["body"].to_pylist() == [f"m{i}".encode() for i in range(10)]
    files_then_entry(requests(s3_requests, s3_table), ["queue", "lease"], version + 2)

    s3_requests.mark()
    assert table.ack("q", leased["seq"].to_pylist(), "c") == 10
    files_then_entry(requests(s3_requests, s3_table), ["removal", "queue"], version + 3)

    s3_requests.mark()  # nothing to lease: one look for a newer entry, none found
    assert table.lease("q", "idle", max_messages=0).num_rows == 0
    assert requests(s3_requests, s3_table) == [("GET", f"log {version + 4}")]

    s3_requests.mark()  # a read reaches the present the same way
    assert table.stats("q")["ready"] == 11
    assert requests(s3_requests, s3_table) == [("GET", f"log {version + 4}")]


def test_an_auto_compaction_stores_its_file_and_commits_in_a_round_reading_nothing(
    s3_table: str, s3_options: dict[str, str], s3_requests: RequestLog
) -> None:
    """The group's upkeep compacts the small files this process wrote from the bytes it
    holds, stores the one file that replaces them, and hands the commit to a round: one
    PUT of the file and one of the entry, no read of the log, no entry of its own beside
    a round's."""
    from spark_queue.commit.group import group_of
    from spark_queue.commit.maintenance import SMALL_FILE_LIMIT

    table = QueueTable(s3_table, storage_options=s3_options, broker="off")
    group = group_of(table.store.location)
    group._upkeeping = True  # as if the upkeep thread were busy: the compaction waits
    for call in range(SMALL_FILE_LIMIT + 8):  # one small file a round
        table.publish("q", [f"m{call}"])
    assert group._compaction_due is not None
    version = table.store.view(probe=False).version

    s3_requests.mark()
    assert group._upkeep_next(0)  # the upkeep thread's work, here
    assert requests(s3_requests, s3_table) == [
        ("PUT", "message file"),
        ("PUT", f"log {version + 1}"),
    ]
    group._upkeeping = False
    # The compaction was planned on the version a round was planned on: later rounds' files
    # stay small (one, at most).
    assert table.store.snapshot().message_files("q").num_rows <= 2

    s3_requests.mark()  # the next round plans on the compacted table, as known
    assert table.publish("q", ["after"]).seqs == [SMALL_FILE_LIMIT + 8]
    files_then_entry(requests(s3_requests, s3_table), ["message", "queue"], version + 2)


def test_an_idle_table_checks_the_entry_after_its_own_and_its_own_before_it_answers(
    s3_table: str, s3_options: dict[str, str], s3_requests: RequestLog
) -> None:
    """Idle longer than it trusts what it knows (``TRUSTED_SECONDS``), a table looks for
    the next entry and, that missing, for its own (log cleanup deletes oldest first): two
    requests before a read, and before a commit's files."""
    table = QueueTable(s3_table, storage_options=s3_options, broker="off")
    table.publish("q", ["one"])
    version = table.store.view(probe=False).version
    looks = [("GET", f"log {version + 1}"), ("HEAD", f"log {version}")]

    time.sleep(TRUSTED_SECONDS)
    s3_requests.mark()
    assert table.stats("q")["ready"] == 1
    assert requests(s3_requests, s3_table) == looks

    time.sleep(TRUSTED_SECONDS)
    s3_requests.mark()
    assert table.publish("q", ["two"]).seqs == [1]
    found = requests(s3_requests, s3_table)
    assert found[:2] == looks
    files_then_entry(found[2:], ["message", "queue"], version + 1)


# Another writer: one publish per line it reads (a JSON list of bodies), each answered with a
# line once landed.
ELSEWHERE = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {root!r})
    from spark_queue import QueueTable
    table = QueueTable(sys.argv[1], storage_options=json.loads(sys.argv[2]), broker="off")
    table.declare("q")
    print("ready", flush=True)
    for line in sys.stdin:
        table.publish("q", json.loads(line))
        print("committed", flush=True)
    """
)


def start_elsewhere(uri: str, options: dict[str, str]) -> subprocess.Popen[str]:
    """Another process (:data:`ELSEWHERE`) on the table at ``uri``, once it says it is ready."""
    elsewhere = subprocess.Popen(
        [sys.executable, "-c", ELSEWHERE.format(root=str(ROOT)), uri, json.dumps(options)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert elsewhere.stdout is not None
    assert elsewhere.stdout.readline().strip() == "ready"
    return elsewhere


def publish_there(elsewhere: subprocess.Popen[str], bodies: list[str]) -> None:
    """One publish of ``bodies`` by the process :func:`start_elsewhere` started, landed."""
    assert elsewhere.stdout is not None and elsewhere.stdin is not None
    elsewhere.stdin.write(json.dumps(bodies) + "\n")
    elsewhere.stdin.flush()
    assert elsewhere.stdout.readline().strip() == "committed"


def test_a_commit_that_loses_reads_only_the_entries_after_its_version_and_plans_again(
    s3_table: str, s3_options: dict[str, str], s3_requests: RequestLog
) -> None:
    """Another process commits twice right after this one's commit: this one's next entry
    is refused; it reads the two entries it missed and one more that is not there yet,
    pauses, looks for that one again (the present: the winners may have gone on), reads the
    queue state the other wrote, and commits its publish, renumbered, on the latest."""
    table = QueueTable(s3_table, storage_options=s3_options, broker="off")
    table.publish("q", ["here 0"])
    elsewhere = start_elsewhere(s3_table, s3_options)
    try:
        table.publish("q", ["here 1"])  # known current from here, for a moment
        version = table.store.view(probe=False).version
        for body in ("elsewhere 0", "elsewhere 1"):
            publish_there(elsewhere, [body])

        s3_requests.mark()
        assert table.publish("q", ["here 2"]).seqs == [4]
        found = requests(s3_requests, s3_table)
    finally:
        elsewhere.communicate(timeout=60)
    assert [what for method, what in found if method == "GET"] == [
        f"log {version + 1}",
        f"log {version + 2}",
        f"log {version + 3}",
        f"log {version + 3}",
        "queue file",
    ], found
    entries = [what for method, what in found if method == "PUT" and what.startswith("log")]
    assert entries == [f"log {version + 1}", f"log {version + 3}"], found
    # The refused attempt's two files are deleted (the message file with its publish).
    assert [method for method, _ in found if method not in ("GET", "PUT")] == ["POST"] * 2, found
    assert len(found) == 5 + 6 + 2, found
    bodies = [b.decode() for b in table.peek("q", 10)["body"].to_pylist()]
    assert bodies == ["here 0", "here 1", "elsewhere 0", "elsewhere 1", "here 2"]


def test_a_warm_publish_lease_and_ack_each_wait_for_two_requests_in_a_row(
    proxied_s3_table: str, proxied_s3_options: dict[str, str], latency_proxy: LatencyProxy
) -> None:
    """Behind a proxy that holds each request: the round's files in parallel, then the log
    entry, so two in a row; the idle lease's one look, one."""
    table = QueueTable(proxied_s3_table, storage_options=proxied_s3_options, broker="off")
    bucket = urllib.parse.urlsplit(proxied_s3_table).netloc
    counted = warm_calls_counted(table, latency_proxy, bucket)
    assert counted == [(3, 2), (3, 2), (3, 2), (1, 1)], counted


def warm_calls_counted(table: QueueTable, proxy: LatencyProxy, where: str) -> list[tuple[int, int]]:
    """On ``table``, warmed by a publish of 20: a one-message publish, a lease of 10, their
    ack and an idle lease, each one's requests to ``where`` (a bucket or container) in all
    and in a row, counted once the call before left none running (upkeep in a thread)."""
    table.publish("q", [f"m{i}" for i in range(20)])
    counted = []
    for call in (
        lambda: table.publish("q", ["one"]),
        lambda: table.lease("q", "c", max_messages=10),
        lambda: table.ack("q", list(range(10)), "c"),
        lambda: table.lease("q", "idle", max_messages=0),
    ):
        proxy.quiet(where, 0.2)
        with proxy.counting(where) as trips:
            call()
        counted.append((trips.in_all, trips.in_a_row))
    return counted


def test_a_reservation_after_another_processs_commit_waits_for_two_requests_in_a_row(
    proxied_s3_table: str,
    proxied_s3_options: dict[str, str],
    s3_options: dict[str, str],
    round_trips: Callable[[], AbstractContextManager[RoundTrips]],
) -> None:
    """The sink's planner reserves a batch's seqs where the last commit was made by another
    process (its commit runs in one): the entry after the one it knows and the next read at
    once, then the queue state that entry names, read while the entry it moved to is
    looked at (the planner looked last longer ago than it trusts)."""
    table = QueueTable(proxied_s3_table, storage_options=proxied_s3_options, broker="off")
    table.publish("q", ["here"])
    # Straight to the server: its requests are not counted.
    elsewhere = start_elsewhere(proxied_s3_table, s3_options)
    try:
        publish_there(elsewhere, ["elsewhere"])
    finally:
        elsewhere.communicate(timeout=60)
    time.sleep(TRUSTED_SECONDS)
    with round_trips() as trips:
        base = reserve(table.store, "q", {}, None)
    assert base == 2
    assert (trips.in_all, trips.in_a_row, trips.by_method) == (4, 2, {"GET": 3, "HEAD": 1}), str(
        trips
    )


def test_a_stream_sources_trigger_reads_the_present_at_once_then_commits_in_two_in_a_row(
    proxied_s3_table: str,
    proxied_s3_options: dict[str, str],
    s3_options: dict[str, str],
    latency_proxy: LatencyProxy,
) -> None:
    """The streaming source's driver side (``latestOffset``, as Spark's source worker keeps
    it between triggers) behind the proxy, while another process publishes. A trigger looks
    for the entry after the one it knows; where another process committed it, it reads the
    entry after that together with the queue state and the message file the one found
    names, then commits its acknowledgement and lease: the files at once, then the entry.
    Idle longer than it trusts what it knows, it reads the next two entries at once, then
    looks at the one it moved to while it reads the state and the message file. Where
    nothing came, the look for the next entry is all."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from spark_queue.spark.options import SourceOptions
    from spark_queue.spark.source import RingQueueStreamReader

    uri = proxied_s3_table
    bucket = urllib.parse.urlsplit(uri).netloc
    options = SourceOptions(path=uri, queue="q", consumer="c", storage=proxied_s3_options)
    elsewhere = start_elsewhere(uri, s3_options)  # straight to the server: not counted
    try:
        reader = RingQueueStreamReader(options)
        offset = reader.initialOffset()
        v = reader.table(0).store.view(probe=False).version
        counted = []

        def trigger() -> None:
            nonlocal offset
            latency_proxy.quiet(bucket, 0.2)
            with latency_proxy.counting(bucket) as trips:
                end = reader.latestOffset(offset, ReadAllAvailable())
            leased = 0 if end == offset else sum(b - a + 1 for a, b in end["ranges"])
            found = sorted((r.method, touched(r.target, uri)) for r in trips.requests)
            counted.append((leased, found, trips.in_all, trips.in_a_row))
            offset = end

        trigger()  # nothing there
        publish_there(elsewhere, [f"a{i}" for i in range(10)])  # v + 1
        trigger()  # a lease of the ten: v + 2
        publish_there(elsewhere, [f"b{i}" for i in range(10)])  # v + 3
        trigger()  # their acknowledgement and a lease of the next ten: v + 4
        trigger()  # the acknowledgement of those: v + 5
        trigger()  # nothing there
        time.sleep(TRUSTED_SECONDS)
        publish_there(elsewhere, [f"c{i}" for i in range(10)])  # v + 6
        trigger()  # a lease of the ten, idle meanwhile: v + 7
    finally:
        elsewhere.communicate(timeout=60)
    lease = [("PUT", "queue file"), ("PUT", "lease file")]
    ack = [("PUT", "removal file"), ("PUT", "queue file")]
    expected = [
        (0, [("GET", f"log {v + 1}")], 1, 1),
        (
            10,
            [("GET", f"log {v + 1}"), *the_state_after(v + 2), *lease, ("PUT", f"log {v + 2}")],
            7,
            4,
        ),
        (
            10,
            [
                ("GET", f"log {v + 3}"),
                *the_state_after(v + 4),
                ("GET", "lease file"),  # the publish wrote the state's files anew
                ("PUT", "removal file"),
                *lease,
                ("PUT", f"log {v + 4}"),
            ],
            9,
            4,
        ),
        (0, [("GET", f"log {v + 5}"), *ack, ("PUT", f"log {v + 5}")], 4, 3),
        (0, [("GET", f"log {v + 6}")], 1, 1),
        (
            10,
            [
                ("GET", f"log {v + 6}"),
                ("HEAD", f"log {v + 6}"),
                *the_state_after(v + 7),
                *lease,
                ("PUT", f"log {v + 7}"),
            ],
            8,
            4,
        ),
    ]
    assert counted == [(n, sorted(found), *trips) for n, found, *trips in expected], counted


def the_state_after(version: int) -> list[tuple[str, str]]:
    """A lease's reads sent together once the entry before ``version`` was found: the
    entry of ``version`` (missing), the queue state and the message file the one found
    names."""
    return [("GET", f"log {version}"), ("GET", "queue file"), ("GET", "message file")]


def test_a_view_many_entries_behind_reads_them_in_runs_at_once(
    monkeypatch: pytest.MonkeyPatch,
    proxied_s3_table: str,
    proxied_s3_options: dict[str, str],
    s3_options: dict[str, str],
    round_trips: Callable[[], AbstractContextManager[RoundTrips]],
) -> None:
    """A table this process left while another writer committed 40 times (a partition a
    client comes back to) reaches the present in runs of entries read at once: one, one,
    two, four, eight, sixteen, sixteen; not one request in a row an entry. Its view was
    known current more than ``TRUSTED_SECONDS`` before (made so, not left to the time the
    40 commits take), so the entry it moved to is looked at once more after the missing
    one: log cleanup may have deleted that one."""
    table = QueueTable(proxied_s3_table, storage_options=proxied_s3_options, broker="off")
    table.declare("q")
    table.stats("q")  # this process's view of the table
    other = QueueTable(proxied_s3_table, storage_options=s3_options, broker="off")
    for n in range(40):
        other.publish("q", [f"m{n}"])
    monkeypatch.setattr(table_view, "TRUSTED_SECONDS", 0.0)
    with round_trips() as trips:
        table.store.snapshot(with_states=False)
    assert trips.by_method == {"GET": 48, "HEAD": 1}, trips  # 40 entries, 8 missing
    assert trips.in_a_row == 8, trips
