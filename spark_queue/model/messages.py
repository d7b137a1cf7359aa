"""Messages as producers hand them in: checked, numbered and shaped as they are stored.

The sink's tasks (Arrow batches of a DataFrame whose schema the data source checked) and
:meth:`QueueTable.publish` (a pyarrow table, a pandas DataFrame or Python values, checked
by :func:`as_input_table`) both end in :func:`normalise`, so a message is stored the same
way whoever sent it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, Protocol, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.errors import InvalidInputError, InvalidOptionError
from spark_queue.model.arguments import PRIORITY, shown
from spark_queue.model.queue_arguments import QUEUE_NAME
from spark_queue.model.schema import (
    FILE_SCHEMA,
    HEADERS,
    INPUT_TYPES,
    UTC_MICROS,
    check_input_columns,
)

# What a publish may carry: the sink's input columns except ``queue`` (publish names one).
PUBLISH_COLUMNS = [name for name in INPUT_TYPES if name != "queue"]


class DataFrameLike(Protocol):
    """A pandas DataFrame as a type checker sees :data:`Rows` (pandas is imported only when
    one is published): its ``columns`` and ``dtypes``, what pyarrow converts."""

    @property
    def columns(self) -> Any: ...

    @property
    def dtypes(self) -> Any: ...


Rows: TypeAlias = (
    pa.Table
    | pa.RecordBatch
    | DataFrameLike
    | list[dict[str, Any]]
    | list[bytes]
    | list[str]
    | tuple[dict[str, Any], ...]
    | tuple[bytes, ...]
    | tuple[str, ...]
)
"""The messages :meth:`~spark_queue.QueueTable.publish` takes: a pyarrow Table or
RecordBatch or a pandas DataFrame of the message columns, or a list (or tuple) of dicts, one
per message, keyed by column, of ``bytes`` or of ``str`` (bodies alone)."""


def normalise(
    batch: pa.RecordBatch | pa.Table,
    first_seq: int,
    enqueued_at: int | np.ndarray,
    default_queue: str | None,
) -> pa.Table:
    """``batch`` as stored message rows (:data:`FILE_SCHEMA`), numbered from ``first_seq``
    in row order; rows without a ``queue`` go to ``default_queue``. ``enqueued_at``: one
    time for every row, or one per row (microseconds since the epoch, UTC).

    Raises:
        InvalidInputError: a null body, a row with no queue, an invalid queue name, or a
            priority that does not fit an int.
    """
    n = batch.num_rows
    columns_in = batch.schema.names
    body = batch.column("body")
    if body.null_count:
        raise InvalidInputError(
            "column 'body' is null in a row; every message needs a body (binary or string)"
        )
    if pa.types.is_string(body.type) and isinstance(body, pa.Array):
        body = body.view(pa.binary())  # the same buffers, without a cast's overhead
    elif pa.types.is_string(body.type) or pa.types.is_large_string(body.type):
        body = body.cast(pa.binary())
    queue = batch.column("queue") if "queue" in columns_in else None
    default: pa.Array | None = None
    if queue is None or queue.null_count:
        if default_queue is None:
            raise InvalidInputError(
                "a row has no queue: give the DataFrame a non-null 'queue' column or set "
                "the option 'queue'"
            )
        default = pa.array([default_queue] * n, pa.string())
        queue = default if queue is None else pc.coalesce(queue, default)
    # One queue for every row (a publish's, as a rule) is checked without a pass over them.
    names: list[str] = (
        [default_queue]
        if queue is default and default_queue is not None
        else pc.unique(queue).to_pylist()
    )
    for name in names:
        if not QUEUE_NAME.fullmatch(name):
            raise InvalidInputError(
                f"column 'queue' holds {name!r}, not a queue name (1 to 255 characters "
                "from A-Z a-z 0-9 _ . -, not dots alone)"
            )
    columns: dict[str, Any] = {
        "queue": queue,
        "seq": pa.array(np.arange(first_seq, first_seq + n, dtype=np.int64)),
        "body": body,
        "size": pc.binary_length(body).cast(pa.int64()),
        "enqueued_at": pa.array(np.broadcast_to(np.int64(enqueued_at), n), UTC_MICROS),
        "delivery_count": pa.array(np.zeros(n, dtype=np.int32)),
    }
    for name in ("message_id", "key"):
        if name in columns_in:
            columns[name] = batch.column(name)
    if "headers" in columns_in:
        columns["headers"] = batch.column("headers").cast(HEADERS)
    priority = pa.array(np.zeros(n, dtype=np.int32))
    if "priority" in columns_in:
        try:
            given = batch.column("priority").cast(pa.int32())
        except pa.ArrowInvalid as error:
            raise InvalidInputError(f"column 'priority' does not fit an int: {error}") from None
        priority = pc.coalesce(given, priority)  # no priority means 0 (SEMANTICS §1)
    columns["priority"] = priority
    for name in ("deliver_at", "expires_at"):
        if name in columns_in:
            columns[name] = batch.column(name).cast(UTC_MICROS)
    arrays = [
        _as_type(columns[f.name], f.type) if f.name in columns else pa.nulls(n, f.type)
        for f in FILE_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=FILE_SCHEMA)


class Bodies:
    """A publish of bodies only (no other column, no null), kept as given until the group
    commit's leader shapes it (:meth:`normalised`): nothing in it can fail, and the
    publishes of one round are then shaped together, once, off their callers' threads
    (shaping costs ~70 us a call, most of it fixed, and 32 callers pay it in turn under the
    GIL)."""

    def __init__(self, arrays: list[pa.Array | list[bytes]], stamps: list[tuple[int, int]]) -> None:
        # Arrow arrays (binary or string, no nulls), or lists of bytes (:meth:`of_values`).
        self.arrays = arrays
        self.stamps = stamps  # (enqueued_at, rows), in row order
        self.num_rows = sum(rows for _, rows in stamps)

    @classmethod
    def of_values(cls, values: object, enqueued_at: int) -> Bodies | None:
        """A list (or tuple) of bytes, or of str, as bodies, no Arrow array made for it:
        the leader makes one for the round's (~20 us a call less, in the caller's thread);
        None for anything else, and for a str that is not UTF-8 (:func:`as_input_table`
        names its row)."""
        if not isinstance(values, list | tuple) or not values:
            return None
        if all(type(value) is bytes for value in values):
            data = list(values)
        elif all(type(value) is str for value in values):
            try:
                data = [value.encode() for value in values]
            except UnicodeEncodeError:
                return None
        else:
            return None
        return cls([data], [(enqueued_at, len(data))])

    @classmethod
    def of(cls, table: pa.Table, enqueued_at: int) -> Bodies | None:
        """``table``'s bodies, where it is bodies only (:func:`as_input_table`'s checks
        passed); else None."""
        if table.column_names != ["body"]:
            return None
        body = table.column("body")
        if body.null_count or not body.num_chunks:
            return None
        return cls(body.chunks, [(enqueued_at, table.num_rows)])

    @classmethod
    def concat(cls, parts: list[Bodies]) -> Bodies:
        return cls(
            [array for part in parts for array in part.arrays],
            [stamp for part in parts for stamp in part.stamps],
        )

    def normalised(self, queue: str) -> pa.Table:
        """The stored rows (:func:`normalise`), numbered from 0, each with its own
        publish's ``enqueued_at``."""
        binary: list[pa.Array] = []
        values: list[bytes] = []  # of neighbouring lists: one Arrow array for them all
        for part in self.arrays:
            if isinstance(part, list):
                values += part
                continue
            if values:
                binary.append(pa.array(values, pa.binary()))
                values = []
            binary.append(_as_binary(part))
        if values:
            binary.append(pa.array(values, pa.binary()))
        body = binary[0] if len(binary) == 1 else pa.concat_arrays(binary)
        times, counts = zip(*self.stamps, strict=True)
        enqueued_at = times[0] if len(times) == 1 else np.repeat(times, counts)
        return normalise(pa.table({"body": body}), 0, enqueued_at, queue)


def publish_input(rows: object, enqueued_at: int) -> Bodies | pa.Table:
    """What :meth:`QueueTable.publish` was given: :class:`Bodies` where it is bodies only
    (a list of bytes or of str, or a table of one ``body`` column without nulls), for the
    group commit's leader to shape; else :func:`as_input_table`'s table, which raises for
    what publish does not take."""
    bodies = Bodies.of_values(rows, enqueued_at)
    if bodies is not None:
        return bodies
    table = as_input_table(rows)
    return Bodies.of(table, enqueued_at) or table


def _as_binary(array: pa.Array) -> pa.Array:
    if pa.types.is_string(array.type):
        return array.view(pa.binary())  # the same buffers, without a cast's overhead
    return _as_type(array, pa.binary())


def _as_type(column: pa.Array | pa.ChunkedArray, type: pa.DataType) -> Any:
    # A cast to the type a column has already costs as much as one that converts.
    return column if column.type == type else column.cast(type)


def as_input_table(rows: object) -> pa.Table:
    """What :meth:`QueueTable.publish` was given, as an Arrow table of input columns.

    ``rows``: a pyarrow Table or RecordBatch, a pandas DataFrame, or a list of dicts (one per
    message, keys among :data:`PUBLISH_COLUMNS`), of ``bytes`` or of ``str`` (bodies).

    Raises:
        InvalidInputError: another kind of ``rows``, no ``body`` column, an unknown column,
            or a column of a type the sink does not take (named, with what it accepts).
    """
    if isinstance(rows, pa.RecordBatch):
        table = pa.Table.from_batches([rows])
    elif isinstance(rows, pa.Table):
        table = rows
    elif _is_pandas(rows):
        table = pa.Table.from_pandas(rows, preserve_index=False)
    elif isinstance(rows, list | tuple):
        table = _from_values(list(rows))
    else:
        raise InvalidInputError(
            f"rows is a {type(rows).__name__}; publish takes a pyarrow Table or RecordBatch, "
            "a pandas DataFrame, or a list of dicts, bytes or str"
        )
    _check_columns(table.schema)
    return table


def _is_pandas(rows: object) -> bool:
    module = type(rows).__module__
    return module.startswith("pandas") and type(rows).__name__ == "DataFrame"


# The Arrow type each input column takes from Python values (body: from its values).
_PYTHON_TYPES: dict[str, pa.DataType] = {
    "message_id": pa.string(),
    "key": pa.string(),
    "headers": HEADERS,
    "priority": pa.int32(),
    "deliver_at": UTC_MICROS,
    "expires_at": UTC_MICROS,
}


def _is_priority(value: object) -> bool:
    if isinstance(value, str):  # a column of numbers, as a DataFrame's must be
        return False
    try:
        PRIORITY.parse("priority", value)
    except InvalidOptionError:
        return False
    return True


def _is_text(value: object) -> bool:
    """A str UTF-8 can hold: no lone surrogate (which JSON's ``\\ud800`` makes)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_headers(value: object) -> bool:
    return isinstance(value, Mapping) and all(
        _is_text(k) and (v is None or _is_text(v)) for k, v in value.items()
    )


_EXACT = {"priority": int, "deliver_at": datetime, "expires_at": datetime}
# Microseconds since the epoch of 0001-01-01 and of the last microsecond of 9999, UTC.
_FIRST_TIME = -62_135_596_800_000_000
_LAST_TIME = 253_402_300_799_999_999


def _is_time(value: object) -> bool:
    """A datetime (naive: UTC) that is a time in UTC that Python can read back (year 1 to
    9999): a later one would be stored, and then fail every reader that makes datetimes."""
    if not isinstance(value, datetime):
        return False
    if value.tzinfo is not None:
        try:
            value.astimezone(timezone.utc)
        except OverflowError:
            return False
    return True


# What each column takes from Python values (naming the row at fault): Arrow would store a
# priority of 1.5 as 1 and an int as a time in microseconds, so columns with values of
# other types than _EXACT's are checked value by value before conversion; the others
# where Arrow refuses them, or where a time is out of the years Python reads back. Every
# column but the body may be None.
_VALUE_CHECKS: dict[str, tuple[Callable[[object], bool], str]] = {
    "body": (lambda v: isinstance(v, bytes | bytearray) or _is_text(v), "bytes or UTF-8 strings"),
    "message_id": (_is_text, "UTF-8 strings"),
    "key": (_is_text, "UTF-8 strings"),
    "headers": (_is_headers, "dicts of UTF-8 string keys to UTF-8 string values"),
    "priority": (_is_priority, "whole numbers from -2**31 to 2**31-1"),
    "deliver_at": (_is_time, "datetimes of years 1 to 9999 in UTC"),
    "expires_at": (_is_time, "datetimes of years 1 to 9999 in UTC"),
}


def _from_values(values: list[Any]) -> pa.Table:
    if all(isinstance(v, bytes | bytearray) for v in values):
        return pa.table({"body": pa.array(values, pa.binary())})
    if all(isinstance(v, str) for v in values):
        try:
            return pa.table({"body": pa.array(values, pa.string())})
        except UnicodeEncodeError:
            _check_values("body", values)  # names the row
            raise
    if not all(isinstance(v, dict) for v in values):
        kinds = sorted({type(v).__name__ for v in values})
        raise InvalidInputError(
            f"rows holds {', '.join(kinds)}; a list of rows must be all dicts (one per "
            "message), all bytes or all str (bodies)"
        )
    names: list[str] = []
    for value in values:
        names += [name for name in value if name not in names]
    columns = {}
    for name in names:
        if name not in PUBLISH_COLUMNS:
            raise _unknown_column(name)
        column = [value.get(name) for value in values]
        if name == "body" and None in column:
            raise InvalidInputError(_problem("body", None, f"row {column.index(None)}"))
        exact = _EXACT.get(name)
        if exact is not None and not all(type(v) is exact or v is None for v in column):
            _check_values(name, column)  # values Arrow might convert into others
        try:
            array = pa.array(column, _PYTHON_TYPES.get(name))
        except (pa.ArrowException, TypeError, OverflowError, UnicodeEncodeError) as error:
            _check_values(name, column)  # the row at fault, where a check names it
            raise InvalidInputError(
                f"column {name!r} has a value of the wrong type: {error}"
            ) from None
        if pa.types.is_timestamp(array.type) and not _readable_times(array):
            _check_values(name, column)
        columns[name] = array
    return pa.table(columns)


def _unknown_column(name: str) -> InvalidInputError:
    return InvalidInputError(
        f"unknown column {name!r}; publish accepts {', '.join(PUBLISH_COLUMNS)}"
    )


def _check_values(name: str, column: list[object]) -> None:
    """Raise for the first value of ``column`` that :data:`_VALUE_CHECKS` refuses."""
    for row, item in enumerate(column):
        problem = _problem(name, item, f"row {row}")
        if problem is not None:
            raise InvalidInputError(problem)


def _problem(name: str, value: object, holder: str | None) -> str | None:
    """What is wrong with ``value`` as column ``name``'s, held by ``holder`` (``row 3``;
    None: a message on its own), or None where nothing is."""
    if value is None:
        if name != "body":
            return None
        return (
            f"{holder or 'the message'} has no 'body'; every message needs one (bytes or a string)"
        )
    check, takes = _VALUE_CHECKS[name]
    if check(value):
        return None
    nullable = "" if name == "body" else " (or None)"
    has = f"{holder} has" if holder else "got"
    return f"column {name!r} takes {takes}{nullable}; {has} {shown(value)} ({type(value).__name__})"


def check_message(message: Mapping[str, object]) -> None:
    """One message given as a dict of its columns (a row of :meth:`QueueTable.publish`'s
    list), checked on its own, as :func:`as_input_table` checks a list of them.

    Raises:
        InvalidInputError: an unknown column, no body, or a value of a type its column does
            not take (naming the column and what it takes).
    """
    for name in message:
        if name not in PUBLISH_COLUMNS:
            raise _unknown_column(name)
    for name in PUBLISH_COLUMNS:
        problem = _problem(name, message.get(name), None)
        if problem is not None:
            raise InvalidInputError(problem)


def _readable_times(array: pa.Array) -> bool:
    """Whether every time of ``array`` is one Python reads back (years 1 to 9999)."""
    bounds = pc.min_max(array.cast(pa.int64()))
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    return low is None or (low >= _FIRST_TIME and high <= _LAST_TIME)


def _check_columns(schema: pa.Schema) -> None:
    """The sink's input rules (:func:`check_input_columns`) on ``publish``'s rows."""
    check_input_columns(
        [(field.name, field.type, str(field.type)) for field in schema],
        PUBLISH_COLUMNS,
        subject="the rows",
        user="publish",
    )
