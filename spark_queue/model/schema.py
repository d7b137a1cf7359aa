"""Column layouts, in Arrow terms: the queue table, the input of the sink and ``publish``, and
what the browse read and the consumer return. Spark-free: ``QueueTable`` runs without
pyspark; ``datasource.py`` derives the Spark schemas from these.

One Delta table holds every queue of a queue table. Its partition column ``record`` says what
a row is:

- ``message``: an enqueued message (immutable once committed);
- ``removal``: the end of a message's life in its queue (``outcome``: replaced, dropped, ...);
- ``queue``: one row per queue: arguments, counters, head positions (``queue_state``, JSON);
- ``scheduled``: the index of messages not yet due;
- ``lease``: the index of messages delivered to a consumer and not yet acknowledged;
- ``extra``: the index of ready messages below their level's head (returned, or fell due);
- ``redelivered``: delivery and cancel counts of returned messages, for their next lease;
- ``seen``: ids a queue with a ``duplicate_window`` enqueued (their digests in ``body``),
  appended by each commit that records some, removed once out of the window.

``queue``, ``scheduled``, ``lease``, ``extra`` and ``redelivered`` rows are rewritten by every
commit (the previous files are removed in the same commit), so they always describe the table
version they belong to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa

from spark_queue.errors import InvalidInputError

UTC_MICROS = pa.timestamp("us", tz="UTC")
HEADERS = pa.map_(pa.string(), pa.string())
PARTITION = "record"
FORMAT_DESCRIPTION = "spark-queue queue table, format 1"

TABLE_SCHEMA = pa.schema(
    [
        (PARTITION, pa.string()),
        ("queue", pa.string()),
        ("seq", pa.int64()),
        ("message_id", pa.string()),
        ("key", pa.string()),
        ("body", pa.binary()),
        ("size", pa.int64()),
        ("headers", HEADERS),
        ("priority", pa.int32()),
        ("enqueued_at", UTC_MICROS),
        ("deliver_at", UTC_MICROS),
        ("expires_at", UTC_MICROS),
        ("delivery_count", pa.int32()),
        ("death_reason", pa.string()),
        ("original_queue", pa.string()),
        ("original_seq", pa.int64()),
        ("died_at", UTC_MICROS),
        ("outcome", pa.string()),
        ("event_at", UTC_MICROS),
        ("queue_state", pa.string()),
        ("consumer", pa.string()),
        ("lease_id", pa.int64()),
        ("lease_until", UTC_MICROS),
        ("cancel_count", pa.int32()),
    ]
)
# Parquet files carry the columns but the partition column, whose value lives in the log; a
# file written in one piece leaves out the columns null in every row of it (see file_columns).
FILE_SCHEMA = pa.schema([f for f in TABLE_SCHEMA if f.name != PARTITION])
STATS_COLUMNS = ("queue", "seq", "priority")

TABLE_CONFIGURATION = {
    # Statistics only where file skipping pays: never on bodies or headers.
    "delta.dataSkippingStatsColumns": ",".join(STATS_COLUMNS),
    # delta-rs defaults to 100 and Spark to 10: say it, so both engines agree.
    "delta.checkpointInterval": "50",
    "delta.logRetentionDuration": "interval 7 days",
    # Every commit removes a file or two, and each removal stays in every checkpoint as a
    # tombstone for this long: a day of a busy table's tombstones makes each checkpoint
    # (every 50 commits) take seconds, and every commit slower. An hour is also vacuum's
    # hard floor (maintenance.MIN_RETENTION_HOURS), so the two agree.
    "delta.deletedFileRetentionDuration": "interval 1 hours",
    "delta.targetFileSize": str(64 * 1024 * 1024),
}

# The input columns of the sink and ``publish``: what each must be, and the test of its
# Arrow type (Spark's types are converted first: ``datasource.check_input_schema``).
REQUIRED_INPUT = "body"


def _text(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _bytes(kind: pa.DataType) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or _text(kind)


def _headers(kind: pa.DataType) -> bool:
    return pa.types.is_map(kind) and _text(kind.key_type) and _text(kind.item_type)


INPUT_TYPES: dict[str, tuple[str, Callable[[pa.DataType], bool]]] = {
    "body": ("binary or string", _bytes),
    "queue": ("string", _text),
    "message_id": ("string", _text),
    "key": ("string", _text),
    "headers": ("map<string,string>", _headers),
    "priority": ("int", pa.types.is_signed_integer),
    # Any unit; a timestamp without a zone is taken as UTC.
    "deliver_at": ("timestamp", pa.types.is_timestamp),
    "expires_at": ("timestamp", pa.types.is_timestamp),
}


def check_input_columns(
    columns: Sequence[tuple[str, pa.DataType | None, str]],
    accepted: Sequence[str],
    *,
    subject: str,
    user: str,
) -> None:
    """Reject input the queue cannot take, naming the column and what it accepts.

    Args:
        columns: (name, Arrow type or None where there is none, the type as the caller's
            user knows it) per column.
        accepted: the column names this caller takes (a subset of :data:`INPUT_TYPES`).
        subject: what holds the columns, for messages ("the DataFrame", "rows").
        user: who takes them, for messages ("the sink", "publish").

    Raises:
        InvalidInputError: no ``body``, an unknown column, or a column of the wrong type.
    """
    names = [name for name, _, _ in columns]
    if REQUIRED_INPUT not in names:
        lowered = {n.lower(): n for n in names}
        hint = (
            f" (found {lowered[REQUIRED_INPUT]!r}; names are case-sensitive)"
            if REQUIRED_INPUT in lowered
            else ""
        )
        raise InvalidInputError(
            f"no 'body' column in {subject}{hint}; {user} needs body (binary or string) "
            f"and accepts {', '.join(accepted)}"
        )
    for name, kind, shown in columns:
        if name not in accepted:
            raise InvalidInputError(
                f"unknown column {name!r}; {user} accepts {', '.join(accepted)}"
            )
        expected, test = INPUT_TYPES[name]
        if kind is None or not test(kind):
            raise InvalidInputError(f"column {name!r} has type {shown}; it must be {expected}")


# What the browse read and the consumer return, exactly as Spark expects it (nullable
# columns, ``timestamp[us, tz=UTC]``): ``datasource.BROWSE_SCHEMA`` is derived from it.
BROWSE_ARROW_SCHEMA = pa.schema(
    [
        ("queue", pa.string()),
        ("seq", pa.int64()),
        ("state", pa.string()),
        ("message_id", pa.string()),
        ("key", pa.string()),
        ("body", pa.binary()),
        ("size", pa.int64()),
        ("headers", HEADERS),
        ("priority", pa.int32()),
        ("enqueued_at", UTC_MICROS),
        ("deliver_at", UTC_MICROS),
        ("expires_at", UTC_MICROS),
        ("delivery_count", pa.int32()),
        ("death_reason", pa.string()),
        ("original_queue", pa.string()),
        ("original_seq", pa.int64()),
        ("died_at", UTC_MICROS),
        ("consumer", pa.string()),
    ]
)
"""The Arrow schema of a browse read's rows and of a lease's (as Spark expects them)."""
BROWSE_COLUMNS = BROWSE_ARROW_SCHEMA.names
"""The columns of a browse read (``spark.read.format("ringqueue")``), in order."""

# The schema metadata key of QueueTable.lease's rows holding the table version the lease
# planned on: where a consumer's long polling starts (a lease that found nothing commits
# nothing, so the table stays at that version until someone else commits).
LEASE_VERSION_KEY = b"spark_queue.version"
# And a lease of a partitioned queue: each partition's version (a JSON list, partition 0
# first; null for a partition the lease did not reach), each where its log is watched.
LEASE_VERSIONS_KEY = b"spark_queue.versions"


def file_columns(rows: pa.Table, names: Sequence[str]) -> pa.Table:
    """``rows`` read from a data file, as its :data:`FILE_SCHEMA` columns ``names`` in that
    order: a column the file leaves out (null in every row it was written with) as nulls
    of its type, as Delta readers (delta-spark, delta-rs) read a column missing from a
    file."""
    held = set(rows.column_names)
    count = rows.num_rows
    return pa.Table.from_arrays(
        [
            rows.column(name) if name in held else pa.nulls(count, FILE_SCHEMA.field(name).type)
            for name in names
        ],
        names=list(names),
    )
