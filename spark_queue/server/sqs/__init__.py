"""Amazon SQS's API (AWS JSON 1.0) on a queue table (docs/SQS.md), by concern:

- :mod:`~spark_queue.server.sqs.service`: the actions on the broker's ``QueueTable``, the
  order a request is checked in, long polls, the SQS-only settings beside the table; the
  HTTP server;
- :mod:`~spark_queue.server.sqs.http`: the protocol's framing and the connections' guards;
- :mod:`~spark_queue.server.sqs.signing`: SigV4 and the access keys;
- :mod:`~spark_queue.server.sqs.shapes`: request bodies checked against SQS's service model,
  and the checks it leaves to the actions (ranges, batches);
- :mod:`~spark_queue.server.sqs.names`: queue names, URLs and ARNs;
- :mod:`~spark_queue.server.sqs.attributes`: queue attributes to queue arguments and back;
- :mod:`~spark_queue.server.sqs.messages`: messages to rows and back;
- :mod:`~spark_queue.server.sqs.handles`: receipt handles;
- :mod:`~spark_queue.server.sqs.redrive`: the redrive on time;
- :mod:`~spark_queue.server.sqs.errors`: SQS's errors;
- :mod:`~spark_queue.server.sqs.limits`: SQS's bounds and defaults, and the port's limits.

All but ``service``, ``http`` and ``redrive`` are plain functions over values, with no
server and no table.
"""
