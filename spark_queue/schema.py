"""Column layouts: the queue table, the sink's input, and what the browse read returns.

One Delta table holds every queue of a queue table. Its partition column ``record`` says what
a row is:

- ``message``: an enqueued message (immutable once committed);
- ``removal``: the end of a message's life in its queue (``outcome``: replaced, dropped, ...);
- ``queue``: one row per queue: arguments, counters, head positions (``queue_state``, JSON);
- ``scheduled``: the index of messages not yet due;
- ``lease``: the index of messages delivered to a consumer and not yet acknowledged;
- ``extra``: the index of ready messages below their level's head (returned, or fell due);
- ``redelivered``: delivery and cancel counts of returned messages, for their next lease.

``queue``, ``scheduled``, ``lease``, ``extra`` and ``redelivered`` rows are rewritten by every
commit (the previous files are removed in the same commit), so they always describe the table
version they belong to.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

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
# Parquet files carry every column but the partition column, whose value lives in the log.
FILE_SCHEMA = pa.schema([f for f in TABLE_SCHEMA if f.name != PARTITION])
STATS_COLUMNS = ("queue", "seq", "priority")

TABLE_CONFIGURATION = {
    # Statistics only where file skipping pays: never on bodies or headers.
    "delta.dataSkippingStatsColumns": ",".join(STATS_COLUMNS),
    # delta-rs defaults to 100 and Spark to 10: say it, so both engines agree.
    "delta.checkpointInterval": "50",
    "delta.logRetentionDuration": "interval 7 days",
    "delta.deletedFileRetentionDuration": "interval 1 days",
    "delta.targetFileSize": str(64 * 1024 * 1024),
}

# The sink's input columns and the Spark types each accepts.
REQUIRED_INPUT = "body"
INPUT_TYPES: dict[str, tuple[type[DataType], ...]] = {
    "body": (BinaryType, StringType),
    "queue": (StringType,),
    "message_id": (StringType,),
    "key": (StringType,),
    "headers": (MapType,),
    "priority": (IntegerType, ShortType, ByteType, LongType),
    "deliver_at": (TimestampType,),
    "expires_at": (TimestampType,),
}
_TYPE_NAMES = {
    "body": "binary or string",
    "queue": "string",
    "message_id": "string",
    "key": "string",
    "headers": "map<string,string>",
    "priority": "int",
    "deliver_at": "timestamp",
    "expires_at": "timestamp",
}


def check_input_schema(schema: StructType) -> None:
    """Reject a DataFrame the sink cannot take, naming the column and what it accepts."""
    names = [f.name for f in schema.fields]
    lowered = {n.lower(): n for n in names}
    if REQUIRED_INPUT not in names:
        hint = (
            f" (found {lowered[REQUIRED_INPUT]!r}; names are case-sensitive)"
            if (REQUIRED_INPUT in lowered)
            else ""
        )
        raise InvalidInputError(
            f"the DataFrame has no 'body' column{hint}; the sink needs body (binary or string) "
            f"and accepts {', '.join(INPUT_TYPES)}"
        )
    for field in schema.fields:
        accepted = INPUT_TYPES.get(field.name)
        if accepted is None:
            raise InvalidInputError(
                f"unknown column {field.name!r}; the sink accepts {', '.join(INPUT_TYPES)}"
            )
        ok = isinstance(field.dataType, accepted)
        if ok and isinstance(field.dataType, MapType):
            ok = isinstance(field.dataType.keyType, StringType) and isinstance(
                field.dataType.valueType, StringType
            )
        if not ok:
            raise InvalidInputError(
                f"column {field.name!r} has type {field.dataType.simpleString()}; "
                f"it must be {_TYPE_NAMES[field.name]}"
            )


BROWSE_SCHEMA = StructType(
    [
        StructField("queue", StringType()),
        StructField("seq", LongType()),
        StructField("state", StringType()),
        StructField("message_id", StringType()),
        StructField("key", StringType()),
        StructField("body", BinaryType()),
        StructField("size", LongType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("priority", IntegerType()),
        StructField("enqueued_at", TimestampType()),
        StructField("deliver_at", TimestampType()),
        StructField("expires_at", TimestampType()),
        StructField("delivery_count", IntegerType()),
        StructField("death_reason", StringType()),
        StructField("original_queue", StringType()),
        StructField("original_seq", LongType()),
        StructField("died_at", TimestampType()),
        StructField("consumer", StringType()),
    ]
)
BROWSE_COLUMNS = [f.name for f in BROWSE_SCHEMA.fields]


def browse_arrow_schema() -> pa.Schema:
    """The Arrow schema Spark expects for :data:`BROWSE_SCHEMA`, exactly (nullable, UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(BROWSE_SCHEMA, timezone="UTC")
