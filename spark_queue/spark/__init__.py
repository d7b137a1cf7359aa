"""Where Spark meets the queue: the ``ringqueue`` data source (``datasource``), its options
(``options``), the sink (``sink``), the streaming source (``source``), session helpers
(``session``) and Spark Connect (``connect``). The only package that imports PySpark.
"""
