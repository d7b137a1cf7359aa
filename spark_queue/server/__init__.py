"""The broker's servers (``spark-queue broker PATH``, docs/BROKER.md): one process that
serves a table's queue operations to many clients, above :class:`~spark_queue.QueueTable`.

- :mod:`~spark_queue.server.flight`: the broker itself, over Arrow Flight: the calls it
  takes, its heartbeat record, its start and stop;
- :mod:`~spark_queue.server.sqs`: Amazon SQS's API, served beside it (``--sqs``);
- :mod:`~spark_queue.server.metrics`: Prometheus metrics of the table and the broker
  (``--metrics``).

How calls reach a broker, and how broker and clients find and trust each other, is the
client side's (:mod:`spark_queue.broker`), which this package builds on.
"""
