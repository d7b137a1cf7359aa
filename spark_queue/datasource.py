"""``RingQueueDataSource``: the ``ringqueue`` format.

Spark creates the data source in a driver-side Python worker from the options alone, pickles
it, and makes it again for every micro-batch and every commit, so everything here follows
from the options: no state is kept on the instance. Options are validated before any task
starts, so a bad option or column fails the query with nothing written.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from spark_queue.browse import BrowseReader
from spark_queue.errors import InvalidOptionError
from spark_queue.options import parse_browse_options, parse_sink_options, parse_source_options
from spark_queue.schema import BROWSE_SCHEMA, check_input_schema
from spark_queue.sink import RingQueueBatchWriter, RingQueueStreamWriter
from spark_queue.source import RingQueueStreamReader


class RingQueueDataSource(DataSource):
    """Bounded queues in a Delta table: ``format("ringqueue")``.

    - ``df.writeStream.format("ringqueue")`` / ``df.write.format("ringqueue")`` enqueue.
    - ``spark.read.format("ringqueue")`` browses the messages now in the queue(s).
    - ``spark.readStream.format("ringqueue")`` consumes one queue with leases.
    """

    @classmethod
    def name(cls) -> str:
        return "ringqueue"

    def schema(self) -> StructType:
        return BROWSE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BrowseReader(parse_browse_options(self.options))

    def streamReader(self, schema: StructType) -> RingQueueStreamReader:
        return RingQueueStreamReader(parse_source_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> RingQueueBatchWriter:
        return RingQueueBatchWriter(*self._sink(schema, overwrite))

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
        return options, schema.fieldNames()
