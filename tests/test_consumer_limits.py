"""One parser for a consumer's limits: ``QueueTable.lease`` and the streaming source's options
refuse the same bad values, each naming its own argument or option, and commit nothing."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from spark_queue import InvalidOptionError, QueueTable
from spark_queue.spark.options import parse_source_options

BAD = [
    ("max_messages", -2, "maxMessagesPerTrigger"),
    ("max_bytes", 0, "maxBytesPerTrigger"),
    ("max_bytes", "lots", "maxBytesPerTrigger"),
    ("max_deliveries", -3, "maxDeliveries"),
    ("max_cancels", "x", "maxCancels"),
    ("lease_period", 0, "leasePeriod"),
    ("lease_period", "soon", "leasePeriod"),
    ("consumer", "", "consumer"),
]


@pytest.mark.parametrize(("argument", "value", "option"), BAD)
def test_lease_and_source_refuse_the_same_values(tmp_path, argument, value, option):
    table = QueueTable(str(tmp_path / "queues"))
    table.declare("q")
    table.publish("q", ["a", "b"])
    version = DeltaTable(table.path).version()
    with pytest.raises(InvalidOptionError, match=argument):
        table.lease("q", **{"consumer": "c", argument: value})
    assert DeltaTable(table.path).version() == version  # nothing committed
    assert table.stats("q")["ready"] == 2
    with pytest.raises(InvalidOptionError, match=option):
        parse_source_options({"path": table.path, "queue": "q", option: str(value)})


def test_lease_takes_what_the_source_takes(tmp_path):
    table = QueueTable(str(tmp_path / "queues"))
    table.declare("q")
    table.publish("q", ["a", "bb", "ccc"])
    leased = table.lease("q", "c", max_messages=None, max_bytes=3, lease_period="1 minute")
    assert leased["body"].to_pylist() == [b"a", b"bb"]
    options = parse_source_options(
        {"path": table.path, "queue": "q", "maxBytesPerTrigger": "3", "leasePeriod": "1 minute"}
    )
    assert (options.max_bytes, options.lease_period_us) == (3, 60_000_000)
