"""What the queue's values are, before any rule or storage: the one argument specification
(``arguments``), queue arguments and consumer limits (``queue_arguments``), policies
(``policies``), the table's column layouts (``schema``), messages as producers hand them
in (``messages``), what an operation hands back (``results``) and the typed keywords of
the Python API (``keywords``). Imports nothing of the package but
:mod:`spark_queue.errors`.
"""
