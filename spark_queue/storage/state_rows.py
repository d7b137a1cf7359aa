"""The queue state's indexes as rows of the table: scheduled messages, extras, redelivery
counts and leases (:mod:`spark_queue.rules.columns`), written column by column with no
Python work per message, and read back the same way.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.model.schema import FILE_SCHEMA, UTC_MICROS
from spark_queue.rules import (
    INDEX_INTS,
    NEVER,
    NO_TIME,
    Leases,
    MessageIndex,
    QueueState,
    Redelivered,
)
from spark_queue.storage.files import EXTRA, LEASE, QUEUE, REDELIVERED, SCHEDULED, record_rows

# Index columns <-> columnar index arrays: (array, column, value when null).
# The scheduled and extras indexes (MessageIndex):
MESSAGE_INDEX_COLUMNS = tuple(
    zip(
        INDEX_INTS,
        ("seq", "priority", "size", "deliver_at", "expires_at"),
        (0, 0, 0, NO_TIME, NEVER),
        strict=True,
    )
)
# Redelivered index columns <-> Redelivered arrays.
REDELIVERED_COLUMNS = (
    ("seq", "seq", 0),
    ("deliveries", "delivery_count", 0),
    ("cancels", "cancel_count", 0),
)
# The lease index (Leases):
LEASE_COLUMNS = (
    ("seq", "seq", 0),
    ("priority", "priority", 0),
    ("size", "size", 0),
    ("lease_id", "lease_id", 0),
    ("until", "lease_until", NEVER),
    ("deliveries", "delivery_count", 0),
    ("cancels", "cancel_count", 0),
    ("expires", "expires_at", NEVER),
)


def _time_column(values: list[int] | np.ndarray) -> pa.Array:
    """Microseconds (NEVER/NO_TIME meaning none) as a UTC timestamp column."""
    array = np.asarray(values, dtype=np.int64)
    none = (array == NEVER) | (array == NO_TIME)
    if none.all():  # no lease period, no expiry: the usual lease index column
        return pa.nulls(len(array), UTC_MICROS)
    return pa.array(array, mask=none if none.any() else None).cast(UTC_MICROS)


def repeated(value: Any, count: int, kind: pa.DataType) -> pa.Array:
    """``value`` ``count`` times: one Arrow fill, where a Python list costs a step per row."""
    return pa.repeat(pa.scalar(value, kind), count)


def _columnar_table(
    held: list[tuple[str, Any]],
    columns: tuple[tuple[str, str, int], ...],
    extra: dict[str, Any] | None = None,
) -> pa.Table:
    """Index rows from each queue's columnar index (:class:`Leases`, :class:`MessageIndex`,
    :class:`Redelivered`), array by array: no Python work per message."""
    found: dict[str, Any] = {
        "queue": pa.chunked_array(
            [repeated(name, len(index), pa.string()) for name, index in held], pa.string()
        ),
        **(extra or {}),
    }
    for array, column, _ in columns:
        parts = [getattr(index, array) for _, index in held]
        # One queue's index is used as it is: copying a large index's columns is the
        # largest cost here.
        values = parts[0] if len(parts) == 1 else np.concatenate(parts or [np.zeros(0, np.int64)])
        is_time = pa.types.is_timestamp(FILE_SCHEMA.field(column).type)
        found[column] = _time_column(values) if is_time else pa.array(values)
    return record_rows(found)


def read_columnar(
    rows: pa.Table, columns: tuple[tuple[str, str, int], ...]
) -> dict[str, tuple[pa.Table, dict[str, np.ndarray]]]:
    """Per queue: its index rows and their arrays (the inverse of :func:`_columnar_table`)."""
    found = {}
    queues = rows.column("queue")
    for name in pc.unique(queues).to_pylist():
        mine = rows.filter(pc.equal(queues, name))
        arrays = {}
        for array, column, null in columns:
            values = mine.column(column)
            if pa.types.is_timestamp(values.type):
                values = values.cast(pa.int64())
            arrays[array] = values.fill_null(null).to_numpy().astype(np.int64)
        found[name] = (mine, arrays)
    return found


def join_redelivered(parts: list[dict[str, np.ndarray]]) -> Redelivered:
    return Redelivered(
        *(np.concatenate([part[k] for part in parts]) for k in ("seq", "deliveries", "cancels"))
    )


def _lease_table(states: dict[str, QueueState]) -> pa.Table:
    """Every queue's leases as index rows (the inverse of :func:`read_leases`)."""
    held = [(name, states[name].leases) for name in sorted(states) if len(states[name].leases)]
    return _lease_rows(held) if held else _no_leases()


def _lease_rows(held: list[tuple[str, Leases]]) -> pa.Table:
    leases = Leases.concat([part for _, part in held])
    consumers = pa.DictionaryArray.from_arrays(
        pa.array(leases.consumer_ids, pa.int32()), pa.array(leases.names, pa.string())
    )
    groups = {}
    if leases.keys is not None:  # a queue with message groups: each lease's group
        groups["key"] = leases.keys
    return _columnar_table(held, LEASE_COLUMNS, {"consumer": consumers.cast(pa.string()), **groups})


@functools.cache
def _no_leases() -> pa.Table:
    # Built once: most commits hold no lease, and each of the ~10 Arrow calls it takes
    # costs the same for no rows as for a few (Arrow tables are immutable: shared safely).
    return _lease_rows([])


def read_leases(rows: pa.Table) -> dict[str, Leases]:
    """Each queue's :class:`Leases` from lease index rows."""
    found: dict[str, Leases] = {}
    for name, (mine, arrays) in read_columnar(rows, LEASE_COLUMNS).items():
        consumers = pc.dictionary_encode(mine.column("consumer").fill_null("")).combine_chunks()
        keys = mine.column("key").combine_chunks() if "key" in mine.column_names else None
        found[name] = Leases(
            tuple(consumers.dictionary.to_pylist()),
            consumers.indices.to_numpy(zero_copy_only=False),
            None if keys is None or keys.null_count == len(keys) else keys.cast(pa.string()),
            **arrays,
        )
    return found


def index_rows(states: dict[str, QueueState]) -> dict[str, pa.Table]:
    """Every queue's indexes as rows, by record: scheduled messages, extras, redelivered
    counts and leases."""
    waiting = [(n, states[n].scheduled) for n in sorted(states) if len(states[n].scheduled)]
    extras = [(n, states[n].extras) for n in sorted(states) if len(states[n].extras)]
    again = [(n, states[n].redelivered) for n in sorted(states) if len(states[n].redelivered)]
    return {
        SCHEDULED: _index_table(waiting, MESSAGE_INDEX_COLUMNS),
        EXTRA: _index_table(extras, MESSAGE_INDEX_COLUMNS),
        REDELIVERED: _index_table(again, REDELIVERED_COLUMNS),
        LEASE: _lease_table(states),
    }


def _index_table(
    held: list[tuple[str, Any]], columns: tuple[tuple[str, str, int], ...]
) -> pa.Table:
    return _columnar_table(held, columns) if held else _no_rows(columns)


@functools.cache
def _no_rows(columns: tuple[tuple[str, str, int], ...]) -> pa.Table:
    """No index rows of ``columns``, built once (as :func:`_no_leases`)."""
    return _columnar_table([], columns)


def states_of(files: list[tuple[str, pa.Table]]) -> dict[str, QueueState]:
    """The queue states held by state files' rows, given as (record, rows): the ``queue``
    rows' JSON with every index record of the same queue joined in.

    Raises:
        UnsupportedFormatError: a state is of another format version.
    """
    queue_rows: list[pa.Table] = []
    scheduled: dict[str, list[MessageIndex]] = {}
    leases: dict[str, list[Leases]] = {}
    extras: dict[str, list[MessageIndex]] = {}
    redelivered: dict[str, list[dict[str, np.ndarray]]] = {}
    for record, rows in files:
        if record == QUEUE:
            queue_rows.append(rows)
        elif record in (SCHEDULED, EXTRA):
            found = scheduled if record == SCHEDULED else extras
            for queue, (_, arrays) in read_columnar(rows, MESSAGE_INDEX_COLUMNS).items():
                found.setdefault(queue, []).append(MessageIndex(**arrays))
        elif record == REDELIVERED:
            for queue, (_, arrays) in read_columnar(rows, REDELIVERED_COLUMNS).items():
                redelivered.setdefault(queue, []).append(arrays)
        else:
            for queue, held in read_leases(rows).items():
                leases.setdefault(queue, []).append(held)
    states: dict[str, QueueState] = {}
    for rows in queue_rows:
        for name, text in zip(
            rows.column("queue").to_pylist(), rows.column("queue_state").to_pylist(), strict=True
        ):
            states[name] = QueueState.from_json(
                name,
                text,
                MessageIndex.concat(scheduled.get(name, [])),
                Leases.concat(leases.get(name, [])),
                MessageIndex.concat(extras.get(name, [])),
                join_redelivered(redelivered[name]) if name in redelivered else None,
            )
    return states
