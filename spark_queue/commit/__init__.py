"""The commit engine: one Delta commit's worth of queue work (``transaction``), staged
messages becoming messages of their queues (``enqueue``), the queue operations as requests
(``requests``) that a process shares in one commit (``group``), how a writer that lost a
race waits (``backoff``), spark-queue's own maintenance (``maintenance``) and the named
crash points of the exactly-once tests (``failpoints``).
"""
