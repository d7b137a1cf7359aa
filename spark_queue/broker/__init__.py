"""The queue broker: one process that serves a table's queue operations to many clients
over Arrow Flight (``server``), and its client side: which calls go to a broker
(``client``), how they travel (``wire``), how brokers are found (``discovery``) and how
broker and clients trust each other (``auth``). Only ``server`` sits above
:class:`~spark_queue.QueueTable`; the client side sits below it.
"""
