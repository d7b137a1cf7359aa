"""The queue table on storage: where it lives (``location``), its files and how they are
written (``files``), the table's snapshots, reads and commits (``store``), the log entries
spark-queue writes and reads itself (``delta_log``), the table as a process knows it between
commits (``table_view``), the message files read for a queue's head (``message_files``), the
queue state's rows (``state_rows``), the de-duplication window (``dedup_window``), the cache
of decoded row groups and small files (``row_cache``), reads of the messages now in the
queues (``browse``), consumer filters (``filters``), what each commit records of itself
(``commit_log``: the operations' names and the summary's codec) and the history of every
commit (``history``). Queue rules are not here: that is ``rules``.
"""
