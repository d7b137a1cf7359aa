"""``QueueTable``: the Python API of a queue table, for jobs, notebooks and services.

Runs in the calling process with no SparkSession: it reads and commits through delta-rs.
Do not call it in a process that later forks (delta-rs's runtime does not survive a fork).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_queue.core import COUNTERS, gauges, identity_holds
from spark_queue.errors import QueueError, QueueNotFoundError
from spark_queue.maintenance import compact
from spark_queue.options import QueueArguments, check_queue_name, validate_arguments
from spark_queue.reader import plan_partitions, read_partition, settled_states
from spark_queue.store import QueueStore, Snapshot, now_micros
from spark_queue.transaction import QueueTransaction, run

COMPACT_ATTEMPTS = 10


class QueueTable:
    """The queues stored in one Delta table at ``path`` (a local path or a URI)."""

    def __init__(self, path: str) -> None:
        self.store = QueueStore(path)
        self.path = self.store.uri

    # -- declaring and changing queues -----------------------------------------------------

    def declare(self, name: str, **arguments: Any) -> QueueArguments:
        """Create ``name`` with these arguments, or check them against an existing queue.

        Arguments are the snake_case twins of the sink's options (``max_length``,
        ``max_length_bytes``, ``overflow``, ``ring_size``, ``dead_letter_queue``,
        ``reject_threshold``, ``expiration``). An argument given with another value than the
        queue's raises :class:`ArgumentMismatchError`; nothing is written.
        """
        check_queue_name("name", name)
        given = validate_arguments(arguments)

        def work(transaction: QueueTransaction) -> QueueArguments:
            existed = name in transaction.states
            state = transaction.declare(name, given)
            if not existed:
                transaction.commit(operation=f"DECLARE {name}")
            return state.arguments

        return run(self.store, work)

    def alter(self, name: str, **arguments: Any) -> QueueArguments:
        """Change a queue's arguments (SEMANTICS §2 "changing limits").

        A lower limit under ``drop-head`` trims at once (dead-lettering if the queue has a
        dead-letter queue); under ``ring`` the queue shrinks only as messages leave; the
        reject policies remove nothing and start rejecting.
        """
        given = validate_arguments(arguments)

        def work(transaction: QueueTransaction) -> QueueArguments:
            self._require(transaction.snapshot, name)
            transaction.declare(name, given, alter=True)
            transaction.settle(name)
            transaction.commit(operation=f"ALTER {name}")
            return transaction.states[name].arguments

        return run(self.store, work, create=False)

    def purge(self, name: str) -> int:
        """Remove every ready and scheduled message of ``name``; returns how many."""

        def work(transaction: QueueTransaction) -> int:
            snapshot = transaction.snapshot
            self._require(snapshot, name)
            live = self._live(snapshot, name, transaction.now)
            count = transaction.purge(name, live["seq"].to_numpy())
            transaction.commit(operation=f"PURGE {name}")
            return count

        return run(self.store, work, create=False)

    def compact(self) -> dict[str, int]:
        """Compact small files now (see :mod:`spark_queue.maintenance`); returns file counts.

        Safe while producers run: a producer that commits first makes this try again.
        """
        from deltalake.exceptions import CommitFailedError

        for _ in range(COMPACT_ATTEMPTS):
            snapshot = self._snapshot()
            try:
                return compact(self.store, snapshot)
            except CommitFailedError:
                continue
        raise QueueError(f"compaction of {self.path} lost {COMPACT_ATTEMPTS} races in a row")

    # -- looking -----------------------------------------------------------------------------

    def queues(self) -> list[str]:
        """The names of the queues declared in this table."""
        snapshot = self.store.snapshot()
        return sorted(snapshot.states) if snapshot is not None else []

    def arguments(self, name: str) -> QueueArguments:
        return self._require(self._snapshot(), name).arguments

    def stats(self, name: str) -> dict[str, int]:
        """Gauges and counters of SEMANTICS §4, as of now.

        ``added = acked + replaced + dropped + expired + killed + purged + ready + leased +
        scheduled`` always holds; ``rejected`` messages were never added, and
        ``dead_lettered`` counts copies sent to the dead-letter queue (they are also
        ``added`` there).
        """
        snapshot = self._snapshot()
        self._require(snapshot, name)
        state = settled_states(self.store, snapshot, now_micros())[name]
        stats = {counter: state.counters[counter] for counter in COUNTERS}
        stats.update(gauges(state))
        if not identity_holds(stats):
            raise QueueError(f"queue {name!r}: counters break the stats identity: {stats}")
        return stats

    def peek(self, name: str, limit: int = 10) -> pa.Table:
        """Up to ``limit`` live messages of ``name`` in delivery order (no side effects)."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        snapshot = self._snapshot()
        self._require(snapshot, name)
        now = now_micros()
        states = settled_states(self.store, snapshot, now)
        found: list[pa.Table] = []
        remaining = limit
        for partition in plan_partitions(self.store, snapshot, states, name, now):
            if remaining <= 0:
                break
            rows = read_partition(partition)
            ready = rows.filter(pc.equal(rows["state"], "ready"))
            found.append(ready.slice(0, remaining))
            remaining -= min(remaining, ready.num_rows)
        if not found:
            from spark_queue.schema import browse_arrow_schema

            return browse_arrow_schema().empty_table()
        return pa.concat_tables(found)

    # -- helpers -----------------------------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        snapshot = self.store.snapshot()
        if snapshot is None:
            raise QueueError(f"no queue table at {self.path}")
        return snapshot

    def _require(self, snapshot: Snapshot, name: str) -> Any:
        state = snapshot.states.get(name)
        if state is None:
            raise QueueNotFoundError(
                f"queue {name!r} does not exist in {self.path}; queues: {sorted(snapshot.states)}"
            )
        return state

    def _live(self, snapshot: Snapshot, name: str, now: int) -> pa.Table:
        states = settled_states(self.store, snapshot, now)
        parts = [
            read_partition(p) for p in plan_partitions(self.store, snapshot, states, name, now)
        ]
        if not parts:
            return pa.table({"seq": pa.array([], pa.int64())})
        seqs = np.concatenate([p["seq"].to_numpy() for p in parts]) if parts else np.zeros(0)
        return pa.table({"seq": pa.array(seqs, pa.int64())})
