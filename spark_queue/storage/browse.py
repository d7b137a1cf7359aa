"""Browse read: ``spark.read.format("ringqueue").load(path)``, the messages now in the queues.

What runs where: ``partitions()`` runs on the driver side; it reads the queue states and the
Delta log (``deltalake``) and settles each queue in memory (due scheduled messages promoted,
as the next commit would), without committing anything. Each partition is one queue level
(a priority) over one run of files, in head order, so a plain ``collect()`` returns the
messages in delivery order. ``read()`` runs in executor tasks and only reads Parquet files
(pyarrow); everything it needs travels in the pickled :class:`BrowsePartition`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.errors import TableNotFoundError
from spark_queue.model.partitions import partition_uri
from spark_queue.model.schema import BROWSE_ARROW_SCHEMA, BROWSE_COLUMNS, FILE_SCHEMA
from spark_queue.portable import Portable
from spark_queue.rules import Leases, QueueState, below_heads, live_mask, member, plan_settle
from spark_queue.storage.location import Location
from spark_queue.storage.message_files import file_runs
from spark_queue.storage.store import QueueStore, Snapshot, now_micros, require_queue


@dataclass
class BrowsePartition(Portable):
    """One queue level over files whose seq ranges do not overlap other partitions'.

    Planned on the driver side (the browse reader's ``partitions``, ``QueueTable.peek``) and,
    under Spark, pickled into one executor task, which reads its files and needs nothing
    else."""

    location: Location
    queue: str
    priority: int
    head: int
    holes: list[int]  # removed at or after the head
    below: list[int]  # live below the head: extras, scheduled and leased messages
    leased: dict[int, str]  # seq -> consumer
    paths: list[str]
    now: int
    # Not due yet, by the state's index: a message waiting out a redelivery delay has no
    # deliver_at of its own in its row.
    scheduled: list[int] = field(default_factory=list)


def settled_states(
    store: QueueStore, snapshot: Snapshot, now: int, names: list[str] | None = None
) -> dict[str, QueueState]:
    """Queues (``names``, else all) as they are at ``now``: due scheduled messages
    promoted and run-out leases returned, not committed."""
    reader = store.head_reader(snapshot)
    wanted = snapshot.states if names is None else {n: snapshot.states[n] for n in names}
    return {name: plan_settle(state, reader, now).state for name, state in wanted.items()}


def plan_partitions(
    store: QueueStore,
    snapshot: Snapshot,
    states: dict[str, QueueState],
    queue: str | None,
    now: int,
) -> list[BrowsePartition]:
    if queue is not None:
        require_queue(states, queue, store.uri)
    names = [queue] if queue is not None else sorted(states)
    partitions: list[BrowsePartition] = []
    for name in names:
        state = states[name]
        for priority in sorted(state.levels, reverse=True):
            level = state.levels[priority]
            below = below_heads(state, priority).tolist()
            mine = state.leases.take(state.leases.priority == priority)
            leased = dict(zip(mine.seq.tolist(), mine.consumer.tolist(), strict=True))
            waiting = np.sort(state.scheduled.seq[state.scheduled.priority == priority]).tolist()
            start = min([level.head, *below[:1]])
            files = snapshot.message_files(name, priority=priority, from_seq=start)
            partitions.extend(
                BrowsePartition(
                    store.location,
                    name,
                    priority,
                    level.head,
                    sorted(state.holes),
                    below,
                    leased,
                    run,
                    now,
                    waiting,
                )
                for run in file_runs(files)
            )
    return partitions


def live_rows(partition: BrowsePartition, columns: list[str] | None = None) -> pa.Table:
    """The live rows of one partition in seq order (``columns`` must include ``seq``)."""
    store = QueueStore(partition.location)
    start = min([partition.head, *partition.below[:1]])
    filters = [
        ("queue", "=", partition.queue),
        ("priority", "=", partition.priority),
        ("seq", ">=", start),
    ]
    parts = [store.read_rows(path, columns, filters=filters) for path in partition.paths]
    if not parts:
        return (
            FILE_SCHEMA.empty_table()
            if columns is None
            else FILE_SCHEMA.empty_table().select(columns)
        )
    rows = pa.concat_tables(parts)
    seqs = rows.column("seq").to_numpy()
    if len(seqs) > 1 and bool((seqs[1:] < seqs[:-1]).any()):  # one file: in order already
        rows = rows.sort_by("seq")
    live = live_mask(
        rows.column("seq").to_numpy(),
        partition.head,
        np.asarray(partition.holes, dtype=np.int64),
        np.asarray(partition.below, dtype=np.int64),
    )
    return rows if live.all() else rows.filter(pa.array(live))


def leased_consumers(leased: dict[int, str], seqs: np.ndarray) -> pa.Array:
    """Each seq's consumer where it is leased, else null: array by array, as a partition
    can hold millions of rows."""
    if not leased:
        return pa.nulls(len(seqs), pa.string())
    leased_seqs = np.fromiter(leased, dtype=np.int64, count=len(leased))
    order = np.argsort(leased_seqs)
    ordered = leased_seqs[order]
    at = np.searchsorted(ordered, seqs)
    at[at == len(ordered)] = 0
    names = sorted(set(leased.values()))
    code = {name: i for i, name in enumerate(names)}
    codes = np.fromiter((code[n] for n in leased.values()), np.int32, len(leased))[order]
    indices = pa.array(codes[at], pa.int32(), mask=ordered[at] != seqs)
    return pa.DictionaryArray.from_arrays(indices, pa.array(names, pa.string())).cast(pa.string())


def read_partition(partition: BrowsePartition) -> pa.Table:
    """The live messages of one partition, seq order, with their ``state``."""
    rows = live_rows(partition)
    if rows.num_rows == 0:
        return BROWSE_ARROW_SCHEMA.empty_table()
    seqs = rows.column("seq").to_numpy()
    waiting = member(seqs, np.asarray(partition.scheduled, dtype=np.int64))
    state = pc.if_else(pa.array(waiting), "scheduled", "ready")
    consumer = leased_consumers(partition.leased, seqs)
    state = pc.if_else(pc.is_valid(consumer), "leased", state)
    rows = rows.drop_columns(["consumer"]).append_column("consumer", consumer)
    rows = rows.append_column("state", state)
    return rows.select(BROWSE_COLUMNS).cast(BROWSE_ARROW_SCHEMA)


def plan_browse(location: Location, queue: str | None) -> list[BrowsePartition]:
    """The partitions of a browse read of ``queue`` (None: every queue), settled now: a
    partitioned queue's over each of its partition tables, partition 0 first.

    Raises:
        TableNotFoundError: no queue table at ``location``.
        QueueNotFoundError: ``queue`` was never declared there.
    """
    store = QueueStore(location)
    snapshot = store.snapshot()
    if snapshot is None:
        raise TableNotFoundError(store.uri)
    now = now_micros()
    only = [queue] if queue in snapshot.states else None  # else the error lists them all
    states = settled_states(store, snapshot, now, only)
    found = plan_partitions(store, snapshot, states, queue, now)
    for name in [queue] if queue is not None else sorted(states):
        for partition in range(1, states[name].arguments.partitions):
            found.extend(_partition_plan(location, name, partition, now))
    # Spark needs at least one partition; an empty one reads nothing.
    return found or [BrowsePartition(store.location, "", 0, 0, [], [], {}, [], now)]


def _partition_plan(root: Location, queue: str, partition: int, now: int) -> list[BrowsePartition]:
    """The partitions of a browse read of ``queue``'s partition table ``partition``."""
    store = QueueStore(Location(partition_uri(root.uri, queue, partition), root.options))
    snapshot = store.snapshot()
    if snapshot is None:
        raise TableNotFoundError(store.uri)
    states = settled_states(store, snapshot, now, [queue])
    return plan_partitions(store, snapshot, states, queue, now)


def peek_rows(store: QueueStore, snapshot: Snapshot, queue: str, limit: int) -> pa.Table:
    """Up to ``limit`` ready messages of ``queue`` in delivery order, as of now (due
    scheduled messages promoted, as the next commit would), read a file run at a time."""
    now = now_micros()
    states = settled_states(store, snapshot, now, [queue])
    found: list[pa.Table] = []
    remaining = limit
    for partition in plan_partitions(store, snapshot, states, queue, now):
        if remaining <= 0:
            break
        rows = read_partition(partition)
        ready = rows.filter(pc.equal(rows["state"], "ready"))
        found.append(ready.slice(0, remaining))
        remaining -= min(remaining, ready.num_rows)
    return pa.concat_tables(found) if found else BROWSE_ARROW_SCHEMA.empty_table()


def purgeable_seqs(
    store: QueueStore, snapshot: Snapshot, queue: str, now: int, progress: Callable[[str], None]
) -> np.ndarray:
    """Seqs of the ready and scheduled messages of ``queue`` (not leased), read a file run
    at a time and only the ``seq`` column; ``progress`` gets a line per run."""
    states = settled_states(store, snapshot, now, [queue])
    leased = states[queue].leases.seq
    partitions = plan_partitions(store, snapshot, states, queue, now)
    parts = []
    for done, partition in enumerate(partitions, 1):
        parts.append(live_rows(partition, ["seq"])["seq"].to_numpy())
        progress(f"purging queue {queue}: {done}/{len(partitions)} file runs read")
    seqs = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    purgeable: np.ndarray = seqs[~member(seqs, leased)]
    return purgeable


def delivered_rows(store: QueueStore, snapshot: Snapshot, queue: str, leased: Leases) -> pa.Table:
    """The leased messages' rows, in delivery order, with their delivery count, read from
    ``snapshot``, the table as the lease's commit saw it."""
    schema = BROWSE_ARROW_SCHEMA
    if not len(leased):
        return schema.empty_table()
    seqs = leased.seq
    rows = store.read_messages(snapshot, queue, seqs)
    # Delivery order is the lease order: put the rows in it.
    rows = rows.take(pc.index_in(pa.array(seqs), rows["seq"]))
    count = rows.num_rows
    rows = rows.drop_columns(["delivery_count", "consumer"])
    rows = rows.append_column("delivery_count", pa.array(leased.deliveries).cast(pa.int32()))
    rows = rows.append_column("consumer", pa.array(leased.consumer, pa.string()))
    rows = rows.append_column("state", pa.array(["leased"] * count, pa.string()))
    return rows.select(schema.names).cast(schema)
