"""Group commit: the operations of many threads on one table, one commit per
round, each caller with exactly its own result or its own error."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import os
import random
import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest

from spark_queue import (
    ArgumentMismatchError,
    CommitUnknownError,
    InvalidInputError,
    PublishResult,
    QueueNotFoundError,
    QueueTable,
    RejectedMessagesError,
)
from spark_queue.commit.enqueue import PendingBatch
from spark_queue.commit.group import CommitGroup, Queued, group_of
from spark_queue.commit.maintenance import compact, plan_compaction
from spark_queue.commit.requests import (
    ChangeRequest,
    CompactRequest,
    LeaseRequest,
    PublishRequest,
    QueuePartitioned,
    ack_planner,
)
from spark_queue.model.messages import Bodies, as_input_table, normalise
from spark_queue.model.queue_arguments import parse_consumer_limits
from spark_queue.rules import identity_holds
from spark_queue.storage.browse import delivered_rows
from spark_queue.storage.commit_log import SUMMARY_KEY, CommitSummary
from spark_queue.storage.store import QueueStore, now_micros

THREADS, CALLS = 8, 12
CLIENTS = 32  # callers at once, and no conflict error reaches any of them
PROCESSES, PROCESS_CALLS = 3, 10


@pytest.fixture
def table(tmp_path) -> QueueTable:
    return QueueTable(str(tmp_path / "queues"))


def texts(rows) -> list[str]:
    return [bytes(b).decode() for b in rows["body"].to_pylist()]


def run_threads(count: int, target) -> list[BaseException]:
    """Start ``count`` threads of ``target(n)`` together; the errors that reached them."""
    errors: list[BaseException] = []
    go = threading.Barrier(count)

    def body(n: int) -> None:
        try:
            go.wait()
            target(n)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=body, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def one_round(group: CommitGroup, requests: list) -> list[Future]:
    """Queue ``requests`` while the leader cannot take any, so they form one round."""
    with group._lock:
        return [group.submit(request) for request in requests]


def publish_request(table: QueueTable, queue: str, bodies: list[str], **options) -> PublishRequest:
    rows = normalise(as_input_table(bodies), 0, now_micros(), queue)
    arguments = options.pop("arguments", {})
    options.setdefault("producer", None)
    options.setdefault("sequence", None)
    options.setdefault("on_reject", "drop")
    return PublishRequest(
        queue, PendingBatch(queue, rows), arguments, policies=table.policies, **options
    )


def bodies_request(table: QueueTable, queue: str, bodies: list, enqueued_at: int) -> PublishRequest:
    """A publish of bodies only, as ``QueueTable.publish`` makes one: shaped by the leader."""
    batch = Bodies.of(as_input_table(bodies), enqueued_at)
    assert batch is not None
    return PublishRequest(
        queue,
        PendingBatch(queue, batch),
        {},
        producer=None,
        sequence=None,
        on_reject="drop",
        policies=table.policies,
    )


def stored(table: QueueTable, queue: str) -> dict[int, tuple[bytes, int, str | None]]:
    """seq -> (body, enqueued_at in microseconds, message_id) of what ``queue`` holds."""
    rows = table.peek(queue, 100)
    return {
        seq: (bytes(body), at, message_id)
        for seq, body, at, message_id in zip(
            rows["seq"].to_pylist(),
            rows["body"].to_pylist(),
            rows["enqueued_at"].cast("int64").to_pylist(),
            rows["message_id"].to_pylist(),
            strict=True,
        )
    }


def lease_request(queue: str, consumer: str, count: int) -> LeaseRequest:
    limits = parse_consumer_limits(
        {"consumer": consumer, "max_messages": count}, surface="keyword", zero_messages_ok=True
    )
    return LeaseRequest(queue, limits, None)


def test_threads_get_exactly_their_own_seqs_and_messages(table, seed):
    """N threads x M publishes, then N threads x M lease-and-ack: every publish's seqs hold
    its own bodies, every message is leased by one thread and acked once."""
    rng = random.Random(seed)
    sizes = [[rng.randint(1, 3) for _ in range(CALLS)] for _ in range(THREADS)]
    table.declare("q")
    published: dict[int, list[tuple[list[str], list[int]]]] = {n: [] for n in range(THREADS)}

    def publisher(n: int) -> None:
        for call, size in enumerate(sizes[n]):
            bodies = [f"t{n}-c{call}-m{i}" for i in range(size)]
            published[n].append((bodies, table.publish("q", bodies).seqs))

    assert run_threads(THREADS, publisher) == []
    total = sum(map(sum, sizes))
    stored = table.peek("q", total)
    by_seq = dict(zip(stored["seq"].to_pylist(), texts(stored), strict=True))
    assert len(by_seq) == total
    for calls in published.values():
        for bodies, seqs in calls:
            assert [by_seq[s] for s in seqs] == bodies
        flat = [s for _, seqs in calls for s in seqs]
        assert flat == sorted(flat)  # one thread's calls commit in call order

    acked: dict[int, list[int]] = {n: [] for n in range(THREADS)}

    def worker(n: int) -> None:
        for _ in range(CALLS):
            leased = table.lease("q", f"w{n}", max_messages=rng_counts[n].pop())
            seqs = leased["seq"].to_pylist()
            assert [by_seq[s] for s in seqs] == texts(leased)  # its own rows, its own order
            assert table.ack("q", seqs, f"w{n}") == len(seqs)
            acked[n] += seqs

    rng_counts = {n: [rng.randint(1, 4) for _ in range(CALLS)] for n in range(THREADS)}
    assert run_threads(THREADS, worker) == []
    flat = [s for seqs in acked.values() for s in seqs]
    assert len(flat) == len(set(flat))  # nobody got another's message
    stats = table.stats("q")
    assert stats["acked"] == len(flat) and stats["leased"] == 0
    assert stats["ready"] == total - len(flat)
    assert identity_holds(stats)


def test_one_round_is_one_commit_and_a_bad_request_fails_alone(table):
    table.declare("q")
    table.declare("full", max_length=1, overflow="reject-publish")
    table.publish("full", ["in"])
    table.publish("q", ["a", "b"])
    group = group_of(table.store.location)
    before = table.store.open().version()
    futures = one_round(
        group,
        [
            publish_request(table, "q", ["c"]),
            ChangeRequest("ACK", "nowhere", ack_planner(None), np.array([1]), None),
            publish_request(table, "q", ["d"], arguments={"max_length": 7}),
            publish_request(table, "full", ["out"], on_reject="fail"),
            lease_request("q", "w", 10),
            publish_request(table, "q", ["e"]),
        ],
    )
    with pytest.raises(QueueNotFoundError, match="nowhere"):
        futures[1].result()
    with pytest.raises(ArgumentMismatchError, match="maxLength"):
        futures[2].result()
    with pytest.raises(RejectedMessagesError, match="full"):
        futures[3].result()
    first, last = futures[0].result().result, futures[5].result().result
    assert first.version == last.version == before + 1  # one commit for the round
    assert table.store.open().version() == before + 1
    outcome = futures[4].result()  # after the round's first publish, it saw its message
    assert texts(delivered_rows(table.store, outcome.view, "q", outcome.leased)) == ["a", "b", "c"]
    assert texts(table.peek("q", 10)) == ["e"]
    assert (table.stats("full")["ready"], table.stats("q")["leased"]) == (1, 3)
    assert identity_holds(table.stats("q")) and identity_holds(table.stats("full"))


def test_a_lease_reads_rows_published_in_its_own_round(table):
    table.declare("ring", ring_size=2)
    group = group_of(table.store.location)
    futures = one_round(
        group,
        [
            publish_request(table, "ring", ["a", "b"]),
            publish_request(table, "ring", ["c"]),  # evicts "a", staged in the same round
            lease_request("ring", "w", 10),
        ],
    )
    # Planned as one enqueue, the two would have evicted together: each gets its own share.
    assert [f.result().result.evicted for f in futures[:2]] == [0, 1]
    outcome = futures[2].result()
    rows = delivered_rows(table.store, outcome.view, "ring", outcome.leased)
    assert texts(rows) == ["b", "c"]
    stats = table.stats("ring")
    assert (stats["replaced"], stats["leased"]) == (1, 2) and identity_holds(stats)


def test_idempotent_publishes_in_one_round(table):
    table.publish("q", ["zero"], producer="p", sequence=1)
    group = group_of(table.store.location)
    futures = one_round(
        group,
        [
            publish_request(table, "q", ["one"], producer="p", sequence=2),
            publish_request(table, "q", ["one again"], producer="p", sequence=2),
            publish_request(table, "q", ["old"], producer="p", sequence=1),
            publish_request(table, "q", ["two"], producer="p", sequence=3),
        ],
    )
    assert futures[1].result().result.duplicate
    with pytest.raises(InvalidInputError, match="sequence 1 is lower than 2"):
        futures[2].result()
    assert not futures[3].result().result.duplicate
    assert texts(table.peek("q", 10)) == ["zero", "one", "two"]
    assert table.last_sequence("p") == 3


def test_thirty_two_threads_and_processes_see_no_conflict_error(table):
    """32 threads of one process and 3 other processes, each publishing, leasing and
    acknowledging one message at a time: no error reaches a caller, nothing is lost."""
    table.declare("q")
    counts: dict[int, int] = {}

    def client(n: int) -> None:
        done = 0
        for call in range(CALLS):
            table.publish("q", [f"t{n}-{call}"])
            leased = table.lease("q", f"c{n}", max_messages=1)
            done += table.ack("q", leased["seq"].to_pylist(), f"c{n}")
        counts[n] = done

    context = multiprocessing.get_context("spawn")
    with context.Pool(PROCESSES) as pool:
        others = [pool.apply_async(process_client, (table.path, p)) for p in range(PROCESSES)]
        assert run_threads(CLIENTS, client) == []
        assert [o.get(timeout=600) for o in others] == [PROCESS_CALLS] * PROCESSES
    published = CLIENTS * CALLS + PROCESSES * PROCESS_CALLS
    stats = table.stats("q")
    assert stats["added"] == published
    assert stats["acked"] == sum(counts.values()) + PROCESSES * PROCESS_CALLS
    assert stats["acked"] + stats["ready"] == published and stats["leased"] == 0
    assert identity_holds(stats)


def process_client(path: str, n: int) -> int:
    """Another OS process's client: publish, then lease and ack one message at a time; it
    leases until it has acked as many as it published (others' messages count too)."""
    table = QueueTable(path)
    acked = 0
    for call in range(PROCESS_CALLS):
        table.publish("q", [f"p{n}-{call}"])
    while acked < PROCESS_CALLS:
        leased = table.lease("q", f"p{n}", max_messages=1)
        acked += table.ack("q", leased["seq"].to_pylist(), f"p{n}")
    return acked


def test_asyncio_callers_through_threads(table):
    """Coroutines await ``asyncio.to_thread`` calls: the event loop keeps running while the
    group commit serves them, and each gets its own seqs."""

    async def publish_all() -> list:
        calls = [asyncio.to_thread(table.publish, "q", [f"a{i}"]) for i in range(16)]
        return await asyncio.gather(*calls)

    results = asyncio.run(publish_all())
    stored = table.peek("q", 100)
    by_seq = dict(zip(stored["seq"].to_pylist(), texts(stored), strict=True))
    assert [by_seq[r.seqs[0]] for r in results] == [f"a{i}" for i in range(16)]


def test_a_hung_holder_of_the_host_lock_delays_a_round_only_so_long(table, monkeypatch):
    """The host lock spares lost races; a process that holds it and hangs (here: this test
    holding it) makes a round wait HOST_LOCK_WAIT, then go on without it."""
    import fcntl

    from spark_queue.commit import group

    monkeypatch.setattr(group, "HOST_LOCK_WAIT", 0.2)
    table.declare("q")
    lock = group.group_of(table.store.location)._host_lock
    with open(lock.path, "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        assert table.publish("q", ["despite the lock"]).seqs
    assert table.publish("q", ["after it"]).seqs  # the abandoned waiter let go of it
    assert texts(table.peek("q", 10)) == ["despite the lock", "after it"]


def test_a_round_of_single_message_publishes_writes_one_file(table):
    table.declare("q")

    def message_files() -> int:
        files = table.store.snapshot().files
        return sum(1 for record in files["record"].to_pylist() if record == "message")

    before = message_files()
    group = group_of(table.store.location)
    futures = one_round(group, [publish_request(table, "q", [f"m{i}"]) for i in range(10)])
    seqs = [seq for f in futures for seq in f.result().result.seqs]
    assert len(seqs) == 10 and seqs == sorted(seqs)  # one each, in arrival order
    assert len({f.result().result.version for f in futures}) == 1
    assert message_files() == before + 1
    assert texts(table.peek("q", 10)) == [f"m{i}" for i in range(10)]


def test_each_publish_of_a_merged_run_gets_a_result_of_its_own(table):
    """A run of publishes merged in one round shares out its result: each publish's is a
    PublishResult like any other (equal to one built from its fields, frozen, its own
    seqs) and says every one of its rows was stored, read-only."""
    table.declare("q")
    group = group_of(table.store.location)
    sizes = [1, 3, 1, 2]
    bodies = [[f"m{n}-{i}" for i in range(size)] for n, size in enumerate(sizes)]
    futures = one_round(group, [publish_request(table, "q", b) for b in bodies])
    outcomes = [future.result(30) for future in futures]
    version = outcomes[0].result.version
    start = 0
    for outcome, size in zip(outcomes, sizes, strict=True):
        expected = PublishResult(
            "q", list(range(start, start + size)), 0, 0, 0, version=version, attempts=1
        )
        assert outcome.result == expected and repr(outcome.result) == repr(expected)
        assert list(vars(outcome.result).items()) == list(vars(expected).items())
        with pytest.raises(dataclasses.FrozenInstanceError):
            outcome.result.seqs = []  # type: ignore[misc]
        assert outcome.accepted.tolist() == [True] * size
        with pytest.raises(ValueError):
            outcome.accepted[0] = False
        start += size
    assert texts(table.peek("q", 10)) == [body for run in bodies for body in run]


def test_body_only_publishes_of_a_round_keep_their_bodies_and_times(table):
    """Publishes of bodies only (str or bytes) stay as given until the leader shapes its
    round's run of them at once: each publish still gets its own seqs, bodies and
    ``enqueued_at``; a publish with more columns in the same run is shaped as before."""
    table.declare("q")
    group = group_of(table.store.location)
    base = 1_700_000_000_000_000
    plain = [["a", "b"], [b"c"], ["d"]]
    requests = [bodies_request(table, "q", bodies, base + n) for n, bodies in enumerate(plain)]
    with_id = PublishRequest(
        "q",
        PendingBatch(
            "q", normalise(as_input_table([{"body": "e", "message_id": "i"}]), 0, base + 9, "q")
        ),
        {},
        producer=None,
        sequence=None,
        on_reject="drop",
        policies=table.policies,
    )
    futures = one_round(group, [*requests[:2], with_id, requests[2]])
    outcomes = [f.result().result for f in futures]
    assert len({o.version for o in outcomes}) == 1  # one commit
    messages = stored(table, "q")
    expected = [
        [(b"a", base, None), (b"b", base, None)],
        [(b"c", base + 1, None)],
        [(b"e", base + 9, "i")],
        [(b"d", base + 2, None)],
    ]
    assert [[messages[seq] for seq in o.seqs] for o in outcomes] == expected
    seqs = [seq for o in outcomes for seq in o.seqs]
    assert seqs == sorted(seqs)  # arrival order


def test_bodies_are_shaped_as_normalise_shapes_them():
    times = [5, 5, 7]
    parts = [Bodies.of(as_input_table(["x", "yy"]), 5), Bodies.of(as_input_table([b"z"]), 7)]
    shaped = Bodies.concat(parts).normalised("q")
    direct = normalise(as_input_table([b"x", b"yy", b"z"]), 0, np.array(times), "q")
    assert shaped.equals(direct)
    assert shaped["enqueued_at"].cast("int64").to_pylist() == times
    # Not bodies only: kept for normalise (a column more); a null body never gets this far.
    assert Bodies.of(as_input_table([{"body": "x", "key": "k"}]), 5) is None
    with pytest.raises(InvalidInputError, match=r"^row 0 has no 'body'"):
        as_input_table([{"body": None}, {"body": "x"}])


def test_a_checkpoint_due_while_requests_wait_is_written_by_the_upkeep_thread(table):
    """With requests waiting, the work after a commit goes to the upkeep thread: the
    checkpoint that fell due is written by the time the group is closed."""
    from deltalake import DeltaTable

    table.declare("q")
    interval = int(DeltaTable(table.path).metadata().configuration["delta.checkpointInterval"])
    store = table.store
    while store.snapshot().version < interval - 1:  # empty commits: nothing runs after them
        store.commit(store.snapshot(), [], [])
    planned_on = store.snapshot()
    store.commit(planned_on, [], [])  # version `interval`, as if a round planned on it
    group = CommitGroup(store.location)  # of its own: nothing else runs its upkeep
    group._upkeep(planned_on)
    group.close()  # waits for the upkeep thread
    log = os.listdir(os.path.join(table.path, "_delta_log"))
    assert f"{interval:020d}.checkpoint.parquet" in log


def summary_of(table: QueueTable, version: int) -> CommitSummary:
    """The spark-queue summary of the log entry of ``version`` of a table on a local disk."""
    with open(os.path.join(table.path, "_delta_log", f"{version:020d}.json")) as entry:
        actions = [json.loads(line) for line in entry if line.strip()]
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    return CommitSummary.decode(info[SUMMARY_KEY])


@pytest.mark.parametrize("waiting", [True, False], ids=["requests waiting", "a lone caller"])
def test_compaction_runs_in_the_upkeep_thread_and_commits_in_a_round(table, waiting):
    """Rounds never compact inline, whether requests wait or not: what falls due goes to
    the upkeep thread, which compacts their small files and hands the commit to the next
    round, beside the requests waiting: no log entry of its own, no race with a round."""
    table.declare("q")
    group = CommitGroup(table.store.location)  # rounds run here, not by a leader
    group._upkeeping = True  # as if the upkeep thread were busy: what falls due waits
    rounds = 40
    for call in range(rounds):
        item = Queued(publish_request(table, "q", [f"m{call}"]), Future())
        assert group._round([item]) == []
        assert item.future.result().result.seqs == [call]
    assert table.store.snapshot().message_files("q").num_rows == rounds  # none inline
    assert group._compaction_due is not None
    before = table.store.snapshot().version
    waiter: Future = Future()
    if waiting:  # queued, and no leader yet: the upkeep's request starts one
        group._pending.append(Queued(publish_request(table, "q", ["waits"]), waiter))
    assert group._upkeep_next(0)  # the upkeep thread's work, here
    group.close()
    assert table.store.snapshot().message_files("q").num_rows < rounds
    assert table.store.snapshot().version == before + 1  # one commit for everything
    operations = summary_of(table, before + 1).operations
    assert operations == (("PUBLISH q", "COMPACT") if waiting else ("COMPACT",))
    if waiting:
        assert waiter.result().result.seqs == [rounds]
    stats = table.stats("q")
    assert stats["added"] == rounds + waiting and identity_holds(stats)


def test_a_compaction_whose_files_went_meanwhile_is_left_out_and_deleted(table):
    """A compaction planned on a version whose small files another writer compacted since
    is not committed by the round it reaches: its file is deleted, every row stays once."""
    table.declare("q")
    for call in range(4):
        table.publish("q", [f"m{call}"])
    store = table.store
    planned_on = store.snapshot()
    compact(store, planned_on)  # another compaction of the same files lands first
    version = store.snapshot().version
    folder = os.path.join(table.path, "record=message")
    on_disk = set(os.listdir(folder))
    item = Queued(CompactRequest(plan_compaction(store, planned_on)), Future())
    group = CommitGroup(store.location)
    assert group._round([item]) == [] and item.future.result() is False
    group._compact(planned_on)  # the upkeep's: its file deleted
    group.close()
    assert set(os.listdir(folder)) - on_disk == {
        item.request.compaction.adds[0].path.split("/")[-1]
    }
    assert store.snapshot().version == version  # nothing committed
    assert store.snapshot().message_files("q").num_rows == 1
    assert table.stats("q")["added"] == 4


def test_rounds_with_requests_waiting_still_compact_and_checkpoint(table):
    """Four threads keep requests waiting at every commit (they submit without waiting
    for the answers) until the table has crossed its checkpoint interval: the small files
    of those rounds are compacted, a checkpoint is written at or after the last multiple of
    the interval crossed, and every message is there once.

    The threads run until the table's version is past the interval, not for a fixed count
    of calls: how many calls a round takes depends on the machine's speed (a loaded one
    made 600 calls into 43 commits, short of the interval of 50)."""
    from deltalake import DeltaTable

    table.declare("q")
    interval = int(DeltaTable(table.path).metadata().configuration["delta.checkpointInterval"])
    group = group_of(table.store.location)
    futures: list[Future] = []
    crossed = threading.Event()

    def submitter(n: int) -> None:
        for call in range(5_000):  # a bound: ~100 s at this pace
            futures.append(group.submit(publish_request(table, "q", [f"t{n}-c{call}"])))
            if n == 0 and call % 20 == 19 and DeltaTable(table.path).version() > interval:
                crossed.set()
            if crossed.is_set():
                return
            threading.Event().wait(0.02)  # a pace, not a wait for anything

    assert run_threads(4, submitter) == []
    seqs = [seq for future in futures for seq in future.result().result.seqs]
    group.close()  # waits for the upkeep thread
    assert sorted(seqs) == list(range(len(futures)))
    version = DeltaTable(table.path).version()
    log = os.listdir(os.path.join(table.path, "_delta_log"))
    written = sorted(int(name.split(".")[0]) for name in log if ".checkpoint." in name)
    # At the last multiple crossed, or later where a compaction took the upkeep's table on.
    assert version >= interval and written[-1] >= version // interval * interval
    stats = table.stats("q")
    assert stats["added"] == len(futures) and identity_holds(stats)
    # A round's publishes are one file: without compaction there would be one per round.
    assert table.store.snapshot().message_files("q").num_rows < version // 2


def test_open_keeps_the_table_while_no_newer_log_entry_exists(table):
    """``open`` keeps the table this thread opened where no newer log entry exists, and
    updates it where another writer committed (a round would otherwise plan on a stale
    version and lose its commit)."""
    table.declare("q")
    store = QueueStore(table.store.location)
    opened = store.open()
    version = opened.version()
    assert store.open() is opened and opened.version() == version
    QueueTable(table.path, broker="off").publish("q", ["from another writer"])
    assert store.open() is opened and opened.version() == version + 1


def test_table_at_moves_this_threads_table_on_and_opens_older_versions_apart(table):
    """``table_at`` moves the thread's table forward to a version (the log entries since,
    no more) and keeps it, so the next ``open`` goes on from there; an older version gets
    a table of its own and leaves the thread's where it is."""
    table.declare("q")
    store = QueueStore(table.store.location)
    opened = store.open()
    before = opened.version()
    for body in ("a", "b"):
        QueueTable(table.path, broker="off").publish("q", [body])
    assert store.table_at(before + 1) is opened and opened.version() == before + 1
    older = store.table_at(before)
    assert older is not opened and older.version() == before
    assert opened.version() == before + 1
    assert store.open() is opened and opened.version() == before + 2


def test_the_upkeep_thread_keeps_its_table_between_jobs_and_ends_with_the_group(table):
    """The upkeep thread lives on between jobs (its table open, read on from where it
    was) and ends when the group closes; ``settle`` returns once what fell due has run."""
    from deltalake import DeltaTable

    table.declare("q")
    interval = int(DeltaTable(table.path).metadata().configuration["delta.checkpointInterval"])
    store = table.store
    group = CommitGroup(store.location)
    checkpoints = []
    for _ in range(2):
        while (store.snapshot().version + 1) % interval:
            store.commit(store.snapshot(), [], [])
        planned_on = store.snapshot()
        store.commit(planned_on, [], [])  # a multiple of the interval, as if a round made it
        group._upkeep(planned_on)
        group.settle()
        checkpoints.append(planned_on.version + 1)
        log = os.listdir(os.path.join(table.path, "_delta_log"))
        assert f"{planned_on.version + 1:020d}.checkpoint.parquet" in log
    thread = group._upkeep_thread
    assert thread is not None and thread.is_alive()  # one thread did both checkpoints
    assert checkpoints[1] == checkpoints[0] + interval
    group.close()
    assert not thread.is_alive()


class HeldEntries:
    """The group's log entries held back until :meth:`release`: the first ``count``
    creates wait (each told to ``reached``), the rest go through."""

    def __init__(self, group: CommitGroup, count: int = 1, *, fail: bool = False) -> None:
        self.entries = group.store.entries
        self.create = self.entries.create
        self.count = count
        self.fail = fail  # the held ones fail as a store does, instead of landing
        self.reached = threading.Event()
        self.gate = threading.Event()
        self.entries.create = self._create  # type: ignore[method-assign]

    def _create(self, version: int, data: bytes) -> bool:
        if self.count:
            self.count -= 1
            self.reached.set()
            assert self.gate.wait(60)
            if self.fail:
                raise OSError("the store did not answer")
        return self.create(version, data)

    def release(self) -> None:
        self.gate.set()


def message_files(path: str) -> set[str]:
    return {name for name in os.listdir(os.path.join(path, "record=message"))}


def two_rounds(table: QueueTable, fail: bool = False) -> tuple[HeldEntries, Future, list[Future]]:
    """Round 1 (publish ``first``) held back at its log entry (``fail``: which then fails);
    round 2 (``a`` and ``b``, more than round 1 holds) planned on it, its message file stored
    meanwhile."""
    table.declare("q")
    group = group_of(table.store.location)
    held = HeldEntries(group, fail=fail)
    first = group.submit(publish_request(table, "q", ["first"]))
    assert held.reached.wait(30)
    before = message_files(table.path)
    with group._lock:  # both in one round
        later = [group.submit(publish_request(table, "q", [body])) for body in ("a", "b")]
    deadline = time.monotonic() + 30
    while message_files(table.path) == before:
        assert time.monotonic() < deadline, "round 2 stored nothing while round 1 was held"
        time.sleep(0.01)
    return held, first, later


def test_the_next_round_is_planned_and_stored_while_an_entry_is_on_its_way(table):
    """While round 1's log entry is held back and more requests wait than it holds, round 2
    is planned on the table as round 1 leaves it and its files are stored; no caller hears
    before its entry landed, and round 2's entry follows round 1's."""
    held, first, later = two_rounds(table)
    version = table.store.view(probe=False).version
    assert not first.done() and not any(future.done() for future in later)
    held.release()
    assert first.result(30).result.seqs == [0]
    assert [future.result(30).result.seqs for future in later] == [[1], [2]]
    assert later[0].result().result.version == first.result().result.version + 1 == version + 2
    assert texts(table.peek("q", 10)) == ["first", "a", "b"]


ELSEWHERE = """
import sys
from spark_queue import QueueTable
QueueTable(sys.argv[1], broker="off").publish("q", ["elsewhere"])
"""


def test_a_round_planned_on_one_that_lost_its_race_is_planned_again(table):
    """Round 1's entry loses to another process's commit while round 2, planned on it,
    waits: both are planned again on the present, and each message is stored once."""
    import subprocess
    import sys

    held, first, later = two_rounds(table)
    done = subprocess.run(
        [sys.executable, "-c", ELSEWHERE, table.path], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    held.release()
    assert first.result(60).result.seqs == [1]
    assert [future.result(60).result.seqs for future in later] == [[2], [3]]
    assert first.result().result.attempts == 2
    assert texts(table.peek("q", 10)) == ["elsewhere", "first", "a", "b"]
    stats = table.stats("q")
    assert stats["added"] == 4 and identity_holds(stats)


def test_a_round_planned_on_one_whose_entry_fails_is_planned_again_without_it(table):
    """Round 1's log entry fails (the store did not answer): its caller hears that its
    fate is unknown, once; round 2, planned on it, is planned again on the table as it is
    and lands."""
    held, first, later = two_rounds(table, fail=True)
    held.release()
    with pytest.raises(CommitUnknownError):
        first.result(30)
    assert [future.result(30).result.seqs for future in later] == [[0], [1]]
    assert texts(table.peek("q", 10)) == ["a", "b"]


def test_whole_publishes_merged_in_a_round_on_a_queue_partitioned_since_are_refused(table):
    """Publishes routed as for a queue of one partition (``whole``), merged in one round,
    on a queue that has partitions by then: each caller hears so (QueuePartitioned), to
    route its rows again, and none is stored; a partition's own share in the same round is
    stored."""
    table.declare("q")
    table.alter("q", partitions=2)
    group = group_of(table.store.location)

    def whole(body: str) -> PublishRequest:
        request = bodies_request(table, "q", [body], now_micros())
        request.whole = True
        return request

    futures = one_round(group, [whole("w1"), whole("w2"), bodies_request(table, "q", ["s"], 0)])
    for future in futures[:2]:
        with pytest.raises(QueuePartitioned):
            future.result(30)
    assert futures[2].result(30).result.seqs
    assert texts(table.peek("q", 10)) == ["s"]
