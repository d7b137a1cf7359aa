"""The SQS redrive, when SQS acts it (docs/SQS.md "Receiving"): a message received for the
last time its queue allows (``maxReceiveCount``, the queue's ``max_deliveries``) goes to the
dead-letter queue when that receive's visibility timeout runs out, not at the next commit
that happens to touch its queue, which may be long after or never.

A table changes only by commits: a lease that runs out is returned (here: killed and
dead-lettered) by the next commit to its queue. :class:`RedriveWatch` makes that commit on
time: a thread that finds each queue's last-attempt leases of the SQS consumer in the
table's state and settles the queue (a lease of no message) once one has run out. A receive
through this broker tells it of a last-attempt lease at once, so that one is settled when
its visibility timeout ends; a lease it was not told of (another broker's receive, one
before a restart, a visibility timeout changed) it finds by reading the state again every
:data:`CHECK_SECONDS`. Two brokers settling one queue at once commit once: the second finds
nothing left to settle.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from spark_queue.errors import QueueError
from spark_queue.model.partition_calls import one_partition
from spark_queue.rules.columns import Leases
from spark_queue.server.sqs.names import CONSUMER
from spark_queue.storage.store import now_micros
from spark_queue.table import QueueTable

log = logging.getLogger(__name__)

CHECK_SECONDS = 2.0  # the state is read at least this often for leases no receive reported


class RedriveWatch:
    """Settles ``table``'s queues as the last allowed receives of their messages run out.
    Runs in a thread of its own from construction until :meth:`stop`."""

    def __init__(self, table: QueueTable, check_seconds: float = CHECK_SECONDS) -> None:
        self.table = table
        self.check_seconds = check_seconds
        self._limits: dict[str, int] = {}  # queue: maxReceiveCount, as last read
        self._due = float("inf")  # Unix time (s) of the next last-attempt lease's end
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sqs-redrive", daemon=True)
        self._thread.start()

    def received(self, queue: str, deliveries: int, until_seconds: float) -> None:
        """A receive leased a message of ``queue`` in delivery ``deliveries`` (the highest of
        the receive) until ``until_seconds`` (Unix time); cheap, no I/O."""
        with self._lock:
            limit = self._limits.get(queue)
            if limit is not None and (not limit or deliveries < limit):
                return  # no redrive, or not the last receive it allows
            self._due = min(self._due, until_seconds)
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def _watch(self) -> None:
        while not self._stopping.is_set():
            try:
                due = self._settle_due()
            except (QueueError, OSError) as error:  # storage away: again at the next check
                log.warning("the SQS redrive check failed: %s: %s", type(error).__name__, error)
                due = float("inf")
            # The broker's own failure, or delta-rs's panic (pyo3's PanicException is a
            # BaseException, raised when a process runs out of descriptors): logged, the
            # watch goes on.
            except BaseException as error:
                if isinstance(error, (KeyboardInterrupt, SystemExit)):
                    raise
                log.error("the SQS redrive check failed: %s: %s", type(error).__name__, error)
                log.debug("the failure's traceback", exc_info=True)
                due = float("inf")
            with self._lock:
                self._due = min(self._due, due)
                wait = min(self._due - time.time(), self.check_seconds)
            self._wake.wait(max(wait, 0.0))
            self._wake.clear()

    def _settle_due(self) -> float:
        """Settle every queue (each partition of a partitioned one) with a last-attempt SQS
        lease that has run out; the Unix time (s) the next one runs out (inf: none)."""
        with self._lock:
            self._due = float("inf")  # what this reading finds replaces what was reported
        snapshot = self.table.store.snapshot()
        states = snapshot.states if snapshot is not None else {}
        now = now_micros()
        limits: dict[str, int] = {}
        running = np.iinfo(np.int64).max
        for name, state in sorted(states.items()):
            limit = limits[name] = state.arguments.max_deliveries or 0
            if not limit:
                continue
            for partition in range(state.arguments.partitions):
                held = state.leases
                if partition:
                    found = self.table.partitioned.store_of(name, partition).snapshot()
                    part = found.states.get(name) if found is not None else None
                    if part is None:  # declared by the root's commit, not yet here
                        continue
                    held = part.leases
                ends = last_attempts_until(held, limit)
                if (ends <= now).any():
                    with one_partition(partition):  # commits the redrive in its table
                        self.table.lease(name, CONSUMER, max_messages=0)
                later = ends[ends > now]
                if len(later):
                    running = min(running, int(later.min()))
        with self._lock:
            self._limits = limits
        return float("inf") if running == np.iinfo(np.int64).max else running / 1e6


def last_attempts_until(leases: Leases, limit: int) -> np.ndarray:
    """When the SQS consumer's leases in their last allowed delivery (``limit``) end."""
    if not len(leases):
        return np.empty(0, dtype=np.int64)
    return leases.until[leases.held(consumer=CONSUMER) & (leases.deliveries >= limit)]
