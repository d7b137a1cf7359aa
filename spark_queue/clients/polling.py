"""Long polling: how an idle consumer learns that its queue may have messages again.

A commit of this process reaches it at once (:class:`CommitListener`); a commit of another
process is found in the Delta log (:class:`LogWatch`), checked at growing intervals
(:class:`LongPoll`). Commits that cannot feed the queue (another consumer's lease or ack, a
commit of another queue) wake nothing (:func:`may_feed`, :func:`operations_may_feed`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from spark_queue.clients.queue_operations import QueueOperations
from spark_queue.commit.group import group_of
from spark_queue.model.partitions import partition_uri
from spark_queue.storage.commit_log import Operation
from spark_queue.storage.location import Location
from spark_queue.storage.store import QueueStore

LOCAL_POLL_MS = 25  # between two log checks of an idle consumer, at most: local disk
OBJECT_STORE_POLL_MS = 100  # and on an object store, where each is a request
FIRST_POLL_INTERVAL_SECONDS = 0.005  # an idle consumer's first log check comes this soon


def longest_poll_interval_ms(given_ms: float | None, table: QueueOperations) -> float:
    """The longest wait between two log checks: ``given_ms``, or None for
    :data:`LOCAL_POLL_MS` on a local disk and :data:`OBJECT_STORE_POLL_MS` on an object
    store, where each check is a request."""
    if given_ms is not None:
        return given_ms
    local = table.store.location.scheme in ("", "file")
    return LOCAL_POLL_MS if local else OBJECT_STORE_POLL_MS


def may_feed(queue: str, operations: Iterable[str], queues: list[str] | None) -> bool:
    """Whether a commit of ``operations`` (:class:`Operation`, or as the log records them)
    touching ``queues`` (None: not recorded) may have made messages of ``queue`` ready: an
    idle consumer wakes for those only, not for every other consumer's lease and ack."""
    if queues is not None and queue not in queues:
        return False
    return any(Operation(op).feeds for op in operations)


def operations_may_feed(queue: str, operations: Iterable[str]) -> bool:
    """Whether a commit of this process with ``operations`` may have made messages of
    ``queue`` ready. An operation that names no queue may touch any."""
    return any(
        operation.feeds and operation.queue in (None, queue)
        for operation in map(Operation, operations)
    )


class LogWatch:
    """Whether the table has a version after ``version`` (None: its latest now) that may
    feed ``queue`` (:func:`may_feed`): one open of the next log entry per check and one of
    the entry it has read last (local disk: a system call each; object stores: a HEAD
    each), and a read of each new entry. :meth:`moved` moves the watch past every entry it
    reads; a commit that is not the connector's may be anything, so it feeds."""

    def __init__(
        self,
        table: QueueOperations,
        queue: str,
        version: int | None,
        store: QueueStore | None = None,
    ) -> None:
        """``store``: the table watched, where not ``table``'s (a partition's)."""
        store = store or table.store
        if version is None:  # a table object that does not say: load the log (no cache,
            # so that this thread holds no delta-rs object the interpreter's exit would meet)
            version = store.location.delta_table().version()
        self.queue = queue
        self.version = version
        self.store = store

    def moved(self) -> bool:
        """Whether a version after the last one read may feed the queue (I/O)."""
        while True:
            try:
                entry = self.store.read_log_entry(self.version + 1, files=False)
            except FileNotFoundError:
                # Not written yet, or deleted by log cleanup after the others committed
                # past the log's bound: the latter where this version's own entry is gone
                # too (QueueStore.is_latest), and then only a lease can tell.
                return not self.store.has_log_entry(self.version)
            except OSError:
                return True  # unreadable: lease and see
            self.version += 1
            summary = entry.summary
            if summary is None:
                return True  # not a connector commit (or none recorded): it may be anything
            if may_feed(self.queue, summary.operations, summary.queues):
                return True


def partition_location(table: QueueOperations, queue: str, partition: int) -> Location:
    """Where partition ``partition`` of ``table``'s ``queue`` is (docs/PARTITIONS.md)."""
    root = table.store.location
    return Location(partition_uri(root.uri, queue, partition), root.options)


class PartitionsWatch:
    """A :class:`LogWatch` of every partition of a partitioned queue, from the versions a
    lease planned on (None: a partition's latest now): moved where any one moved."""

    def __init__(self, table: QueueOperations, queue: str, versions: list[int | None]) -> None:
        self.watches = [
            LogWatch(table, queue, version, QueueStore(partition_location(table, queue, k)))
            for k, version in enumerate(versions)
        ]

    def moved(self) -> bool:
        return any([watch.moved() for watch in self.watches])  # each moves past what it read


class CommitListener:
    """Calls ``callback`` with the operations of every commit this process makes to
    ``table`` (on the committing thread, after the commit landed), until :meth:`close`."""

    def __init__(
        self,
        table: QueueOperations,
        callback: Callable[[list[Operation]], None],
        location: Location | None = None,
    ) -> None:
        """``location``: the table listened to, where not ``table``'s (a partition's)."""
        self._group = group_of(location or table.store.location)
        self._callback = callback
        self._group.listen(callback)

    def close(self) -> None:
        self._group.unlisten(self._callback)


class LongPoll:
    """An idle consumer's wait for its queue: when it leases again and when it checks the
    log meanwhile.

    - It is idle from a lease that found nothing (:meth:`lease_found` with 0) until a lease
      finds messages. A consumer that is not idle may lease at any time.
    - While idle, a lease is due (:meth:`lease_due`) once it is woken (:meth:`wake`: a
      commit of this process, or a log check, that may feed the queue) or
      ``idle_lease_interval_seconds`` after the lease that found nothing: messages falling
      due and leases running out make no version. A wake lasts until a lease goes
      (:meth:`leasing`): one that comes while the prefetch is full is kept for when
      receivers make room, or the messages it announced would wait for the idle interval.
    - While idle and not woken, the log is checked (:meth:`log_check`) at intervals that
      start at :data:`FIRST_POLL_INTERVAL_SECONDS` and double after each check up to
      ``max_interval_seconds``; a lease that finds messages starts them over. ``checks``
      counts the checks.

    Not thread-safe: its consumer calls it under its lock; the check itself (a read of the
    log) is made outside it, and its outcome given to :meth:`checked`.
    """

    def __init__(self, max_interval_seconds: float, idle_lease_interval_seconds: float) -> None:
        self.max_interval_seconds = max_interval_seconds
        self.idle_lease_interval_seconds = idle_lease_interval_seconds
        self.idle_since: float | None = None  # when a lease last found nothing; None: not idle
        # The log, from the version that lease planned on (each partition's, partitioned).
        self.watch: LogWatch | PartitionsWatch | None = None
        self.interval_seconds = FIRST_POLL_INTERVAL_SECONDS  # the next wait between checks
        self.check_at = 0.0  # time.monotonic() of the next log check, while idle
        self.woken = False
        self.checks = 0

    @property
    def idle(self) -> bool:
        """Whether the last lease found nothing."""
        return self.idle_since is not None

    def wake(self) -> None:
        """Something may feed the queue: lease at the next turn."""
        self.woken = True

    def lease_due(self, now: float) -> bool:
        """Whether a lease may go at ``now``."""
        return (
            self.idle_since is None
            or self.woken
            or now - self.idle_since >= self.idle_lease_interval_seconds
        )

    def leasing(self) -> None:
        """A lease goes: it uses up the wake."""
        self.woken = False

    def log_check(self, now: float) -> LogWatch | PartitionsWatch | None:
        """The watch to read at ``now`` where a log check is due (counted), else None."""
        if self.watch is None or self.idle_since is None or self.woken or now < self.check_at:
            return None
        self.checks += 1
        return self.watch

    def checked(self, moved: bool, now: float) -> None:
        """A log check ended at ``now``: woken where the log ``moved``; the next check
        comes after a longer interval."""
        self.woken = self.woken or moved
        self.interval_seconds = min(self.interval_seconds * 2, self.max_interval_seconds)
        self.check_at = now + self.interval_seconds

    def lease_found(self, got: int, watch: LogWatch | PartitionsWatch | None, now: float) -> None:
        """A lease ended at ``now`` with ``got`` messages; when it got none, ``watch``
        watches the log from the version it planned on (a publish committed while it was
        in flight still wakes the wait)."""
        if got:
            self.idle_since, self.watch = None, None
            self.interval_seconds = FIRST_POLL_INTERVAL_SECONDS
        else:
            self.idle_since, self.watch = now, watch
            self.check_at = now + self.interval_seconds

    def wait_seconds(self, now: float) -> float:
        """How long from ``now`` the background thread may sleep as far as polling goes (0
        or less: not at all)."""
        if self.idle_since is None or self.woken:  # woken: a receiver making room notifies
            return self.idle_lease_interval_seconds
        return min(self.idle_lease_interval_seconds, self.check_at - now)
