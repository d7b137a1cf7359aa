"""The broker's client side: which ``QueueTable`` calls go to a broker and how they fall
back (``client``), how they travel (``wire``), how brokers are found (``discovery``), and
how broker and clients trust each other (``auth``, ``sessions``). It sits below the clients
and :class:`~spark_queue.QueueTable`; the servers that answer it are
:mod:`spark_queue.server`'s.
"""
