"""The queue broker: one process that serves a table's queue operations to many clients
over Arrow Flight (``server``), Amazon SQS's API (``sqs_server``, mapping requests by the
plain functions of ``sqs``, ``sqs_messages``, ``sqs_handles`` and ``sqs_shapes``, with the
redrive on time of ``sqs_redrive``) and Prometheus metrics (``metrics``); and its client
side: which calls go to a broker (``client``), how they travel (``wire``), how brokers are
found (``discovery``) and how broker and clients trust each other (``auth``). The servers
and ``sqs_redrive`` sit above :class:`~spark_queue.QueueTable`; the client side and the
SQS mapping sit below it.
"""
