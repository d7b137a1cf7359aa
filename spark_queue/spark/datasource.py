"""``RingQueueDataSource``: the ``ringqueue`` format.

Spark creates the data source in a driver-side Python worker from the options alone, pickles
it, and makes it again for every micro-batch and every commit, so everything here follows
from the options: no state is kept on the instance. Options are validated before any task
starts, so a bad option or column fails the query with nothing written.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_type
from pyspark.sql.types import DataType, StructType

from spark_queue.errors import InvalidInputError, InvalidOptionError
from spark_queue.model.schema import BROWSE_ARROW_SCHEMA, INPUT_TYPES, check_input_columns
from spark_queue.portable import Portable
from spark_queue.spark.options import (
    BrowseOptions,
    check_read_options,
    parse_browse_options,
    parse_sink_options,
    parse_source_options,
)
from spark_queue.spark.sink import RingQueueBatchWriter, RingQueueStreamWriter
from spark_queue.spark.source import DriverReadStreamReader, RingQueueStreamReader
from spark_queue.storage.browse import plan_browse, read_partition
from spark_queue.storage.location import Location

# What the browse read and the consumer return, as Spark's type (the Arrow layout is the
# source of truth: the batches handed to Spark are cast to it).
BROWSE_SCHEMA = from_arrow_schema(BROWSE_ARROW_SCHEMA, prefer_timestamp_ntz=False)


def check_input_schema(schema: StructType) -> None:
    """The sink's input rules (:func:`spark_queue.model.schema.check_input_columns`) on a
    DataFrame's schema, naming types as Spark does.

    Raises:
        InvalidInputError: no ``body``, an unknown column, or a column of the wrong type.
    """
    check_input_columns(
        [(f.name, _arrow_type(f.dataType), f.dataType.simpleString()) for f in schema.fields],
        list(INPUT_TYPES),
        subject="the DataFrame",
        user="the sink",
    )


def _arrow_type(kind: DataType) -> pa.DataType | None:
    try:
        return to_arrow_type(kind, timezone="UTC")
    except Exception:  # a Spark type Arrow cannot hold: no input column takes it
        return None


class BrowseReader(Portable, DataSourceReader):
    """``spark.read.format("ringqueue")``: the messages now in a queue table; commits
    nothing.

    Made on the driver side, where ``partitions`` reads the queue states and settles them in
    memory (:func:`spark_queue.storage.browse.plan_browse`); pickled into executor tasks, where
    ``read`` reads the :class:`~spark_queue.storage.browse.BrowsePartition` of one partition."""

    def __init__(self, options: BrowseOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        location = Location.of(self.options.path, self.options.storage)
        return [InputPartition(p) for p in plan_browse(location, self.options.queue)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(partition.value).to_batches()


class RefusedStreamReader(DataSourceStreamReader):
    """A readStream whose options are invalid: it fails at the query's first call, with
    the :class:`InvalidOptionError` naming the option."""

    def __init__(self, error: InvalidOptionError) -> None:
        self.error = error

    def initialOffset(self) -> dict:
        raise self.error

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        raise self.error

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        raise self.error

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        raise self.error


class RingQueueDataSource(Portable, DataSource):
    """Bounded queues in a Delta table: ``format("ringqueue")``.

    - ``df.writeStream.format("ringqueue")`` / ``df.write.format("ringqueue")`` enqueue.
    - ``spark.read.format("ringqueue")`` browses the messages now in the queue(s).
    - ``spark.readStream.format("ringqueue")`` consumes one queue with leases.
    """

    @classmethod
    def name(cls) -> str:
        return "ringqueue"

    def schema(self) -> StructType:
        # Spark asks for the schema at load(), before any query or job starts: where a bad
        # option of a read or a readStream fails (docs/SPARK.md). Writes never ask.
        check_read_options(self.options)
        return BROWSE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BrowseReader(parse_browse_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            options = parse_source_options(self.options)
        except InvalidOptionError as error:
            # What load() could not tell from a read's options (no queue, say). Raised
            # here, PySpark's source runner would bury it under an error of its own.
            return RefusedStreamReader(error)
        if options.read_mode == "driver":
            # PySpark then asks simpleStreamReader, whose batches skip executor Python.
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )
        return RingQueueStreamReader(options)

    def simpleStreamReader(self, schema: StructType) -> DriverReadStreamReader:
        return DriverReadStreamReader(parse_source_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> RingQueueBatchWriter:
        writer = RingQueueBatchWriter(*self._sink(schema, overwrite))
        writer.reserve()  # the batch commits with this instance, unpickled: made once
        return writer

    def streamWriter(self, schema: StructType, overwrite: bool) -> RingQueueStreamWriter:
        return RingQueueStreamWriter(*self._sink(schema, overwrite))

    def _sink(self, schema: StructType, overwrite: bool) -> tuple:
        if overwrite:
            raise InvalidOptionError(
                "ringqueue only appends: use mode 'append' (or outputMode 'append'); to empty "
                "a queue use QueueTable.purge"
            )
        options = parse_sink_options(self.options)
        check_input_schema(schema)
        if options.queue is None and "queue" not in schema.fieldNames():
            raise InvalidInputError(
                "no queue for the rows: set the option 'queue', or give the DataFrame a "
                "'queue' column"
            )
        return options, schema.fieldNames()
