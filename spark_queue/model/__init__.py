"""What the queue's values are, before any rule or storage: the one argument specification
(``arguments``) and the kinds of value it parses (``kinds``), queue arguments and consumer
limits (``queue_arguments``), policies (``policies``), the table's column layouts
(``schema``), messages as producers hand them in (``messages``), what an operation hands
back (``results``), the typed keywords of the Python API (``keywords``) and the checks of
every static declaration of arguments against the specification (``declarations``).
Imports nothing of the package but :mod:`spark_queue.errors`.
"""
