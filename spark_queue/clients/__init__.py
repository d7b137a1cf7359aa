"""Clients for services, over a queue table or its broker: a consumer that prefetches,
acknowledges in batches and renews its leases, and a publisher that batches sends.

Modules, one part each:

- :mod:`~spark_queue.clients.consumer`: :class:`Consumer`, what a user sees (receive,
  iterate, batches, ack, nack, flush, close) and its background thread, which composes the
  parts below under one lock;
- :mod:`~spark_queue.clients.prefetch`: how many messages it holds prefetched
  (:class:`PrefetchBound`);
- :mod:`~spark_queue.clients.acknowledgements`: acknowledgements batched until they are
  flushed (:class:`PendingAcknowledgements`);
- :mod:`~spark_queue.clients.renewal`: which held messages' leases are due for extension
  (:class:`LeaseRenewals`);
- :mod:`~spark_queue.clients.polling`: the long poll of an idle consumer (:class:`LongPoll`,
  the log watch and this process's commits);
- :mod:`~spark_queue.clients.message`: :class:`Message`, what a consumer delivers;
- :mod:`~spark_queue.clients.publisher`: :class:`Publisher`, sends batched by linger and
  size;
- :mod:`~spark_queue.clients.queue_operations`: what the clients use of a table
  (:class:`QueueOperations`).
"""
