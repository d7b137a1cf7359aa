"""The queue table on storage: where it lives (``location``), its files and how they are
written (``files``), the table, its log and snapshots (``store``), the queue state's rows
(``state_rows``), the de-duplication window (``dedup_window``), the cache of decoded row
groups (``row_cache``), reads of the messages now in the queues (``browse``), consumer
filters (``filters``), what each commit records of itself (``commit_log``: the operations'
names and the summary's codec) and the history of every commit (``history``). Reads and
writes files; commits nothing.
"""
