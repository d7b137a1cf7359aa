"""``QueueTable``: the Python API of a queue table, for jobs, notebooks and services.

Runs in the calling process with no SparkSession: it reads and commits through delta-rs.
Thread-safe: the queue operations (``publish``, ``lease``, ``ack``, ``cancel``, ``expire``,
``extend``, ``release``) of every thread, and of every ``QueueTable`` of the same table in
the process, share commits (:mod:`spark_queue.commit.group`: one commit per round, each caller
with its own result or error); ``declare``, ``alter``, ``purge`` and maintenance commit
alone. Do not call it in a process that later forks (delta-rs's runtime does not survive a
fork).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, cast

import numpy as np
import pyarrow as pa

from spark_queue.broker.client import BrokerRouter, routed
from spark_queue.commit.enqueue import PRODUCER_APP_PREFIX
from spark_queue.commit.maintenance import (
    DEFAULT_VACUUM_HOURS,
    Progress,
    checkpoint,
    compact,
    no_progress,
)
from spark_queue.commit.maintenance import vacuum as vacuum_files
from spark_queue.commit.requests import (
    ChangeRequest,
    ExtendRequest,
    LeaseOutcome,
    LeaseRequest,
    Outcome,
    QueuePartitioned,
    Request,
    ack_planner,
    cancel_planner,
    expire_planner,
    release_planner,
)
from spark_queue.commit.transaction import QueueTransaction, run
from spark_queue.errors import InvalidOptionError, PolicyError, QueueError, TableNotFoundError
from spark_queue.model.arguments import (
    ARGUMENTS,
    OnReject,
    parse_consumer_name,
    parse_queue_name,
    parse_seqs,
)
from spark_queue.model.declarations import check_signature
from spark_queue.model.deprecations import (
    CONSUMER_RENAMES,
    PUBLISHER_RENAMES,
    QUEUE_RENAMES,
    RELEASE_ORDER,
    VACUUM_REDEFAULTED,
    first_is_now_keyword,
    redefaulted,
    renamed,
)
from spark_queue.model.keywords import (
    ConsumerOptions,
    DurationLike,
    PublisherOptions,
    QueueArgumentKeywords,
    SeqsLike,
    Unpack,
)
from spark_queue.model.messages import Rows, publish_input
from spark_queue.model.operations import (
    consumer_or_any,
    deliveries_of,
    idempotence,
    results_only,
)
from spark_queue.model.partitions import refuse_lowering
from spark_queue.model.policies import ENV_VAR, Policies, Resolution, load_policies
from spark_queue.model.queue_arguments import (
    QueueArguments,
    given_arguments,
    parse_consumer_limits,
    validate_arguments,
)
from spark_queue.model.results import PublishOutcome, PublishResult, QueueStats
from spark_queue.model.schema import LEASE_VERSION_KEY
from spark_queue.partitioned import Partitions, publish_request, summed
from spark_queue.rules import QueueState
from spark_queue.storage.browse import delivered_rows
from spark_queue.storage.commit_log import CommitOperation
from spark_queue.storage.store import QueueStore, Snapshot, now_micros, require_queue

if TYPE_CHECKING:
    from spark_queue.clients.consumer import Consumer
    from spark_queue.clients.publisher import Publisher

COMPACT_ATTEMPTS = 10


class QueueTable:
    """The queues stored in one Delta table at ``path``.

    Args:
        path: a local path (a string or a ``pathlib.Path``) or a URI (``s3://``,
            ``abfss://``, ``gs://``, ``file://``); a blank one raises ``InvalidOptionError``.
        policies: a policies file, or loaded :class:`Policies` (docs/POLICIES.md), applied
            to every queue this object declares or alters and to dead-letter queues it
            creates; None means the file named by ``$SPARK_QUEUE_POLICIES``, if set. The
            file is read once, here: make a new ``QueueTable`` to pick up an edited file.
        storage_options: delta-rs's storage options for an object store
            (``AWS_ENDPOINT_URL``, ``AZURE_STORAGE_ACCOUNT_KEY``, ...; docs/STORAGE.md);
            keys are case-insensitive. None, or a key left out: the process environment.
        broker: where publish, lease, ack, cancel, expire, extend, release and stats run
            (docs/BROKER.md): ``"auto"`` at the live queue broker the table records, else
            here; ``"off"`` here; ``"host:port"`` (``"tls://host:port"``) at that broker.
            Wherever a broker cannot be reached, here. None: ``$SPARK_QUEUE_BROKER``, else
            ``"auto"``.
        broker_token: the broker's token (printable ASCII, not blank); None:
            ``$SPARK_QUEUE_BROKER_TOKEN``, if set. Never pickled: an unpickled table takes
            ``$SPARK_QUEUE_BROKER_TOKEN``.

    Raises:
        InvalidOptionError: a storage option is not a string (named by its key), an
            invalid ``broker``, or a token that is not printable ASCII or is blank.
        PolicyError: the policies file cannot be read or is invalid.

    Attributes:
        path: the table's location: a local path made absolute, or the URI as given.
        policies: the policies applied, or None.
        store: the Delta table's reads and commits.
        router: where the calls run, at a broker or here.
        partitioned: the calls on partitioned queues (docs/PARTITIONS.md).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        policies: str | os.PathLike[str] | Policies | None = None,
        storage_options: Mapping[str, str] | None = None,
        *,
        broker: str | None = None,
        broker_token: str | None = None,
    ) -> None:
        self.store = QueueStore(path, storage_options)
        self.path = self.store.uri
        self.policies = load_policies(policies)
        self.router = BrokerRouter(self.store.location, broker, broker_token)
        self.partitioned = Partitions(self.store)

    # -- producing -----------------------------------------------------------------------------

    @routed
    def publish_outcome(
        self,
        queue: str,
        rows: Rows,
        *,
        producer: str | None = None,
        sequence: int | None = None,
        on_reject: OnReject = "drop",
        **arguments: Unpack[QueueArgumentKeywords],
    ) -> PublishOutcome:
        """:meth:`publish`, also saying which rows were stored (``accepted[i]`` for row
        ``i``: False where a reject policy refused it or its ``message_id`` was a duplicate),
        as a :class:`~spark_queue.Publisher` needs to answer each message. It declares the
        signature both take. Args and Raises: as for :meth:`publish`."""
        parse_queue_name("queue", queue)
        sequence = idempotence(producer, sequence)
        on_reject = ARGUMENTS["on_reject"].parse(on_reject)
        given = validate_arguments(arguments)
        now = now_micros()
        taken = publish_input(rows, now)
        if not taken.num_rows:
            result = PublishResult(queue, [], 0, 0, 0, duplicate=False, version=None, attempts=0)
            return PublishOutcome(result, np.zeros(0, bool))
        count = self.partitioned.count(queue)
        if given.get("partitions", 1) > count:  # a first use declares the queue, root last
            count = self.declare(queue, **arguments).partitions
        if count == 1:
            request = publish_request(
                queue, taken, now, given, producer, sequence, on_reject, self.policies, whole=True
            )
            try:
                return self._call(request)
            except QueuePartitioned:  # declared partitioned since this process looked
                count = self.partitioned.count(queue, fresh=True)
        return self.partitioned.publish(
            queue, taken, rows, given, count, producer, sequence, on_reject, self.policies
        )

    publish = results_only(
        publish_outcome,
        """Enqueue ``rows`` to ``queue`` in one Delta commit, without Spark.

        Concurrent calls of this process's threads go into one commit where they can
        (:mod:`spark_queue.commit.group`); each gets its own result or error.

        Messages are stored and limited exactly as the sink stores them; concurrent
        producers (this one's other threads, other processes, Spark queries) are fine: a
        publish that loses a commit race is planned again and, if another producer of the
        queue committed first, renumbered after it.

        Args:
            queue: the queue; declared on first use with ``arguments``.
            rows: a pyarrow Table or RecordBatch, a pandas DataFrame, or a list of dicts
                (one per message), of ``bytes`` or of ``str`` (bodies): a
                :data:`~spark_queue.Rows`. Columns: ``body``
                (binary or string, required), ``message_id``, ``key``, ``headers``
                (map of strings), ``priority`` (int), ``deliver_at``, ``expires_at``
                (timestamps; naive ones are UTC).
            producer: with ``sequence``, an idempotent publish: the pair is recorded with
                the commit (a Delta application transaction ``spark-queue-producer-<id>``),
                so a publish retried after a timeout or crash enqueues nothing twice.
            sequence: a whole number that grows with every publish of ``producer``: the
                last committed one again is a duplicate (nothing enqueued), a lower one an
                error.
            on_reject: ``drop`` counts messages a reject policy refuses; ``fail`` raises
                and commits nothing.
            **arguments: queue arguments, as for :meth:`declare`; checked against an
                existing queue's.

        Returns:
            A :class:`PublishResult`: the seqs stored, and what the commit rejected,
            evicted and dead-lettered.

        Raises:
            InvalidInputError: ``rows`` of another kind, without ``body``, with an unknown
                column or one of the wrong type, or a ``sequence`` below the last committed.
            InvalidOptionError: an invalid queue name, argument, ``producer``,
                ``sequence`` or ``on_reject``.
            ArgumentMismatchError: ``arguments`` differ from the existing queue's.
            RejectedMessagesError: ``on_reject='fail'`` and a reject policy refused messages.
            CommitConflictError: every commit attempt lost to another writer.
        """,
    )

    def last_sequence(self, producer: str) -> int | None:
        """The last ``sequence`` committed by ``producer`` with :meth:`publish`, where a
        publishing service resumes after a crash.

        Args:
            producer: the ``producer`` id given to :meth:`publish`.

        Returns:
            The sequence, or None where the producer never committed one.

        Raises:
            TableNotFoundError: no queue table at the path.
        """
        snapshot = self._snapshot()
        own = snapshot.transaction_version(f"{PRODUCER_APP_PREFIX}{producer}")
        queues = self.partitioned.partitioned(snapshot.states)
        found = [own, self.partitioned.last_sequence(producer, queues)]
        return max((f for f in found if f is not None), default=None)

    # -- declaring and changing queues -----------------------------------------------------

    @renamed("declare", QUEUE_RENAMES)
    def declare(
        self,
        queue: str,
        arguments: QueueArguments | None = None,
        **keywords: Unpack[QueueArgumentKeywords],
    ) -> QueueArguments:
        """Create ``queue`` with these arguments, or check them against an existing queue.

        With policies, defaults fill what was not given and caps lower limits; an existing
        queue is resolved again and committed if that changes its arguments (drop-head then
        trims at once, as after :meth:`alter`).

        Args:
            queue: the queue's name (1 to 255 of ``A-Z a-z 0-9 _ . -``).
            arguments: a :class:`QueueArguments`, which gives every argument, its defaults
                included (so no policy default fills one; caps still apply); a table's
                :meth:`arguments` of another queue, say.
            **keywords: the queue arguments (:class:`~spark_queue.QueueArgumentKeywords`),
                the snake_case twins of the sink's options: ``max_length``, ``overflow``,
                ``ring_size``, ``dead_letter_queue``, ``expiration`` ... (docs/ARGUMENTS.md).
                Beside ``arguments``, a keyword must agree with it.

        Returns:
            The queue's effective arguments.

        Raises:
            InvalidOptionError: an invalid queue name, an unknown argument or an invalid
                value, or a keyword that ``arguments`` gives differently.
            ArgumentMismatchError: an argument differs from the queue's explicit one;
                nothing is written (use :meth:`alter`).
            PolicyError: a policy makes the arguments invalid.
            CommitConflictError: every commit attempt lost to another writer.
        """
        parse_queue_name("queue", queue)
        given = given_arguments(arguments, keywords)
        self.partitioned.prepare(queue, given, self.policies, alter=False)

        def work(transaction: QueueTransaction) -> QueueArguments:
            existed = queue in transaction.states
            transaction.declare(queue, given)
            if queue in transaction.touched:
                if existed:
                    transaction.settle(queue)
                transaction.commit(operation=CommitOperation.DECLARE.on(queue))
            return transaction.states[queue].arguments

        return run(self.store, work, policies=self.policies)

    @renamed("alter", QUEUE_RENAMES)
    def alter(
        self,
        queue: str,
        arguments: QueueArguments | None = None,
        **keywords: Unpack[QueueArgumentKeywords],
    ) -> QueueArguments:
        """Change a queue's arguments (SEMANTICS §2 "changing limits").

        A lower limit under ``drop-head`` trims at once (dead-lettering if the queue has a
        dead-letter queue); under ``ring`` the queue shrinks only as messages leave; the
        reject policies remove nothing and start rejecting.

        Args:
            queue: an existing queue.
            arguments: a :class:`QueueArguments`, all of whose arguments become the queue's
                explicit ones.
            **keywords: queue arguments, as for :meth:`declare`; they become the queue's
                explicit ones, and with policies the effective arguments are resolved again.

        Returns:
            The queue's effective arguments.

        Raises:
            QueueNotFoundError: no queue ``queue``.
            InvalidOptionError: an invalid queue name, an unknown argument or an invalid
                value, a keyword that ``arguments`` gives differently, or arguments the queue
                cannot have together once merged with its own (a byte limit on a ring).
            PolicyError: a policy makes the arguments invalid.
            CommitConflictError: every commit attempt lost to another writer.
        """
        parse_queue_name("queue", queue)
        given = given_arguments(arguments, keywords)
        self.partitioned.prepare(queue, given, self.policies, alter=True)

        def work(transaction: QueueTransaction) -> QueueArguments:
            state = self._require(transaction.snapshot, queue)
            refuse_lowering(queue, state.arguments.partitions, given.get("partitions"))
            transaction.declare(queue, given, alter=True)
            transaction.settle(queue)
            transaction.commit(operation=CommitOperation.ALTER.on(queue))
            return transaction.states[queue].arguments

        return run(self.store, work, create=False, policies=self.policies)

    @renamed("purge", QUEUE_RENAMES)
    def purge(self, queue: str, progress: Progress = no_progress) -> int:
        """Remove every ready and scheduled message of ``queue`` (outcome ``purged``);
        leased messages stay with their consumers.

        Args:
            queue: an existing queue.
            progress: gets a line per file read.

        Returns:
            How many messages were removed.

        Raises:
            QueueNotFoundError: no queue ``queue``.
            CommitConflictError: every commit attempt lost to another writer.
        """
        return self.partitioned.purge(queue, self.partitioned.count(queue, fresh=True), progress)

    def compact(self, progress: Progress = no_progress) -> dict[str, int]:
        """Compact small files now (see :mod:`spark_queue.commit.maintenance`). Safe while
        producers and consumers run: one that commits first makes this try again.

        Args:
            progress: gets a line per file read.

        Returns:
            File counts: ``dropped`` (removed unread), ``rewritten``, ``written``.

        Raises:
            TableNotFoundError: no queue table at the path.
            QueueError: every attempt lost a race.
        """
        from deltalake.exceptions import CommitFailedError

        for _ in range(COMPACT_ATTEMPTS):
            snapshot = self._snapshot()
            try:
                return compact(self.store, snapshot, progress)
            except CommitFailedError:
                progress("compaction lost a race with another commit; trying again")
                continue
        raise QueueError(f"compaction of {self.path} lost {COMPACT_ATTEMPTS} races in a row")

    @redefaulted("dry_run", 2, VACUUM_REDEFAULTED)
    def vacuum(
        self,
        retention_hours: float = DEFAULT_VACUUM_HOURS,
        dry_run: bool = True,
        *,
        force: bool = False,
        progress: Progress = no_progress,
    ) -> list[str]:
        """The table's files (never another in its folder) that no current version
        references and that have been unreferenced for ``retention_hours``, deleted with
        ``dry_run=False``: a dry run unless told otherwise, as delta-rs's ``vacuum``. Safe
        while producers and consumers run; time travel to versions older than the retention
        stops working for the files removed (``docs/MAINTENANCE.md``).

        Args:
            retention_hours: how long a file must have been unreferenced.
            dry_run: list the files only, deleting nothing; False deletes them.
            force: allow a retention below the table's ``delta.deletedFileRetentionDuration``
                (1 hour on tables spark-queue creates); never below one hour, because running
                producers and consumers read files of the version they planned on.
            progress: gets a line per step.

        Returns:
            The files deleted (with ``dry_run``, that would be), relative and sorted.

        Raises:
            InvalidOptionError: a retention below the floors above.
            TableNotFoundError: no queue table at the path.
        """
        self._snapshot()  # a queue table, or TableNotFoundError/NotAQueueTableError
        return vacuum_files(self.store.location, retention_hours, dry_run, force, progress)

    def checkpoint(self) -> int:
        """Write a Delta log checkpoint of the current version now, then clean up
        log files past the log retention (``delta.logRetentionDuration``, and at most
        ``spark_queue.logRetentionVersions`` versions back: docs/MAINTENANCE.md).
        Connector commits do this by themselves every ``delta.checkpointInterval``
        versions.

        Returns:
            The version checkpointed.

        Raises:
            TableNotFoundError: no queue table at the path.
            InvalidOptionError: the table's ``spark_queue.logRetentionVersions`` is not a
                whole number >= 1 (the checkpoint is written; no log file is deleted).
        """
        self._snapshot()
        return checkpoint(self.store.location)

    # -- consuming ---------------------------------------------------------------------------

    @routed
    def lease(
        self,
        queue: str,
        consumer: str = "default",
        *,
        max_messages: int | None = 100,
        max_bytes: int | None = None,
        lease_period: DurationLike | None = None,
        max_deliveries: int | None = None,
        max_cancels: int | None = None,
        filter: str | None = None,
        strict_groups: bool = False,
    ) -> pa.Table:
        """Deliver up to ``max_messages`` head messages to ``consumer`` (SEMANTICS §3).

        They stay leased until :meth:`ack` (gone), :meth:`cancel` or :meth:`release` (back
        at their position), or until ``lease_period`` runs out. A lease that finds nothing
        to deliver and nothing to settle commits nothing.

        Args:
            queue: an existing queue.
            consumer: this consumer's name (1 to 255 characters).
            max_messages: at most this many (None: no limit; 0: none, only settle).
            max_bytes: at most this many body bytes; at least one message is always taken.
            lease_period: ``30 seconds``, ``5m`` or milliseconds; None: leases never run out.
            max_deliveries: a message leased this many times is killed instead of returned
                (None: the queue's limit only; a consumer's limit only lowers it).
            max_cancels: a message cancelled this many times is killed (None: the queue's
                limit only).
            filter: a SQL predicate over the message columns: only matching messages are
                leased, the rest stay for others.
            strict_groups: in a queue with message groups, a group with a message leased
                is passed over by this consumer too, not only by others (SQS FIFO queues:
                a group's next message comes once the one in flight is gone or back).

        Returns:
            The leased messages, in delivery order, with their ``delivery_count``; the
            schema's metadata ``spark_queue.version`` is the table version it planned on.

        Raises:
            QueueNotFoundError: no queue ``queue``.
            InvalidOptionError: an invalid limit, period or consumer name (the same rules
                as the streaming source's options).
            CommitConflictError: every commit attempt lost to another writer.
        """
        parse_queue_name("queue", queue)
        limits = parse_consumer_limits(
            {
                "consumer": consumer,
                "lease_period": lease_period,
                "max_messages": max_messages,
                "max_bytes": max_bytes,
                "max_deliveries": max_deliveries,
                "max_cancels": max_cancels,
            },
            surface="keyword",
            zero_messages_ok=True,
        )
        filter = ARGUMENTS["filter"].parse(filter)
        if not isinstance(strict_groups, bool):
            raise InvalidOptionError(f"strict_groups must be True or False; got {strict_groups!r}")

        count = self.partitioned.count(queue)
        if count > 1:
            return self.partitioned.lease(queue, count, limits, filter, strict_groups)
        outcome: LeaseOutcome = self._call(LeaseRequest(queue, limits, filter, strict_groups))
        rows = delivered_rows(self.store, outcome.view, queue, outcome.leased)
        # Where a consumer's long polling starts (a lease that found nothing commits nothing).
        return rows.replace_schema_metadata({LEASE_VERSION_KEY: str(outcome.view.version)})

    @routed
    def ack(
        self,
        queue: str,
        seqs: SeqsLike,
        consumer: str | None = None,
        *,
        deliveries: list[int] | None = None,
    ) -> int:
        """Acknowledge leased messages: they leave the queue (outcome ``acked``).

        Args:
            queue: an existing queue.
            seqs: the messages' ``seq`` values, as :meth:`lease` returned them.
            consumer: only leases of this consumer (None: any); others' are ignored, as
                are seqs not leased (already acked, or their lease ran out). A call that
                ends no lease commits nothing.
            deliveries: only the leases in these deliveries, ``deliveries[i]`` (the
                ``delivery_count`` :meth:`lease` returned) for ``seqs[i]``: a message
                delivered again since, to anyone, is left alone (SQS's stale receipt
                handle). None: whichever delivery.

        Returns:
            How many leases this call ended.

        Raises:
            QueueNotFoundError: no queue ``queue``.
            InvalidOptionError: ``seqs`` is not a list of seqs (whole numbers, not bools or
                fractions, within int64), ``consumer`` not a consumer name, or
                ``deliveries`` not one count per seq.
            CommitConflictError: every commit attempt lost to another writer.
        """
        wanted = parse_seqs("seqs", seqs)
        counts = deliveries_of(wanted, deliveries)
        consumer = consumer_or_any(consumer)
        planner = ack_planner(consumer)
        return self._call(
            ChangeRequest(CommitOperation.ACK, queue, planner, wanted, consumer, counts)
        )

    @routed
    def cancel(
        self,
        queue: str,
        seqs: SeqsLike,
        consumer: str | None = None,
        *,
        delay: DurationLike | None = None,
        deliveries: list[int] | None = None,
    ) -> int:
        """Return leased messages to their position (a nack); each cancel counts toward
        ``max_cancels``. They are ready again after ``delay`` (JetStream ``NakWithDelay``),
        or, without one, after the queue's redelivery backoff (none by default).

        Args:
            queue: an existing queue.
            seqs: the messages' ``seq`` values, as :meth:`lease` returned them.
            consumer: only leases of this consumer (None: whoever holds them).
            delay: ``30 seconds``, ``5m`` or milliseconds; ``0`` returns them at once
                whatever the queue's backoff; None applies the queue's backoff.
            deliveries: only the leases in these deliveries, as for :meth:`ack`.

        Returns:
            How many leases ended.

        Raises:
            QueueNotFoundError: no queue ``queue``.
            InvalidOptionError: ``delay`` is not a duration >= 0, ``seqs`` not a list of
                seqs, or ``consumer`` not a consumer name.
            CommitConflictError: every commit attempt lost to another writer.
        """
        delay_ms = ARGUMENTS["delay"].parse(delay)
        delay_us = None if delay_ms is None else delay_ms * 1000
        wanted = parse_seqs("seqs", seqs)
        counts = deliveries_of(wanted, deliveries)
        consumer = consumer_or_any(consumer)
        planner = cancel_planner(consumer, delay_us)
        return self._call(
            ChangeRequest(CommitOperation.CANCEL, queue, planner, wanted, consumer, counts)
        )

    @routed
    def expire(self, queue: str, seqs: SeqsLike, consumer: str | None = None) -> int:
        """Remove leased messages now as ``expired`` (dead-lettered if the queue has a
        dead-letter queue).

        Args, Returns and Raises: as for :meth:`ack`.
        """
        wanted = parse_seqs("seqs", seqs)
        consumer = consumer_or_any(consumer)
        planner = expire_planner(consumer)
        return self._call(ChangeRequest(CommitOperation.EXPIRE, queue, planner, wanted, consumer))

    @routed
    def extend(
        self,
        queue: str,
        seqs: SeqsLike,
        consumer: str,
        period: DurationLike,
        *,
        deliveries: list[int] | None = None,
    ) -> int:
        """Extend leases for slow work: each of ``consumer``'s leases of ``seqs`` now runs
        out ``period`` from now (JetStream ``AckProgress``, SQS ``ChangeMessageVisibility``).

        A lease that has already run out is not extended (it went back to the queue, and
        may be another consumer's by now); seqs ``consumer`` does not hold are ignored.

        Args:
            queue: an existing queue.
            seqs: the messages' ``seq`` values, as :meth:`lease` returned them.
            consumer: the consumer holding the leases.
            period: ``30 seconds``, ``5m`` or milliseconds; more than 0.
            deliveries: only the leases in these deliveries, as for :meth:`ack`.

        Returns:
            How many leases were extended.

        Raises:
            QueueNotFoundError: no queue ``queue``.
            InvalidOptionError: ``period`` is not a duration above 0, ``seqs`` not a list
                of seqs, or ``consumer`` not a consumer name.
            CommitConflictError: every commit attempt lost to another writer.
        """
        period_ms = ARGUMENTS["period"].parse(period)
        limits = parse_consumer_limits({"consumer": consumer}, surface="keyword")
        wanted = parse_seqs("seqs", seqs)
        counts = deliveries_of(wanted, deliveries)
        return self._call(ExtendRequest(queue, wanted, limits.consumer, period_ms * 1000, counts))

    @first_is_now_keyword("consumer", RELEASE_ORDER)
    @routed
    def release(
        self, queue: str | None = None, *, consumer: str, seqs: SeqsLike | None = None
    ) -> int:
        """Return everything ``consumer`` holds, as a closed Artemis consumer does: ready
        at once (a release hands work over; it is not a failure, so no backoff applies and
        no cancel is counted).

        ``consumer`` is a keyword: ``release("orders", consumer="worker")``, or
        ``release(consumer="worker")`` for every queue.

        Args:
            queue: only this queue (None: every queue, in one commit).
            consumer: the consumer's name.
            seqs: only these of its leases (a client closing hands back what it prefetched
                while other clients of the same name keep theirs); None: all.

        Returns:
            How many leases ended (a release that ends none commits nothing).

        Raises:
            QueueNotFoundError: no queue ``queue``.
            InvalidOptionError: ``consumer`` is not a consumer name, or ``seqs`` not a
                list of seqs.
            CommitConflictError: every commit attempt lost to another writer.
        """
        wanted = None if seqs is None else parse_seqs("seqs", seqs)
        consumer = parse_consumer_name("consumer", consumer)
        planner = release_planner(consumer)
        return self._call(ChangeRequest(CommitOperation.RELEASE, queue, planner, wanted, consumer))

    # -- clients for services ----------------------------------------------------------------

    @renamed("consumer", CONSUMER_RENAMES)
    def consumer(self, queue: str, consumer: str, **options: Unpack[ConsumerOptions]) -> Consumer:
        """A :class:`~spark_queue.Consumer` of ``queue`` named ``consumer``: messages one
        at a time or in batches, with prefetch, batched acknowledgements, lease extension
        and long polling. Close it (or use it as a context manager) to release what it
        prefetched.

        Args:
            queue: an existing queue.
            consumer: the consumer name its leases carry (workers may share one).
            **options: ``max_prefetch``, ``lease_period``, ``ack_batch``,
                ``ack_interval``, ``idle_check_interval``, ``idle_lease_interval``,
                ``max_deliveries``, ``max_cancels``, ``filter`` (see the class;
                docs/CLIENTS.md).

        Raises:
            InvalidOptionError: an invalid queue name, consumer name or option.
        """
        from spark_queue.clients.consumer import CONSUMER_OPTIONS, Consumer

        unknown = sorted(set(options) - set(CONSUMER_OPTIONS))
        if unknown:  # Python would say "unexpected keyword argument", as a TypeError
            raise InvalidOptionError(
                f"unknown consumer option {unknown[0]!r}; valid: {', '.join(CONSUMER_OPTIONS)}"
            )
        return Consumer(self, queue, consumer, **options)

    @renamed("publisher", PUBLISHER_RENAMES)
    def publisher(self, queue: str, **options: Unpack[PublisherOptions]) -> Publisher:
        """A :class:`~spark_queue.Publisher` to ``queue``: single messages of many
        threads, published in batches of up to ``max_batch`` after at most ``linger``;
        ``send`` returns a future per message.

        Args:
            queue: the queue (declared on first use, as by :meth:`publish`).
            **options: ``linger`` (a duration a batch waits for more messages after its
                first; 5 ms), ``max_batch``
                (messages per batch at most; 1000), ``on_reject`` and queue arguments, as
                for :meth:`publish`.

        Raises:
            InvalidOptionError: an invalid queue name or option.
        """
        from spark_queue.clients.publisher import Publisher

        return Publisher(self, queue, **options)

    def _call(self, request: Request[Outcome]) -> Outcome:
        """Run ``request`` in this process's group commit of the table (:mod:`spark_queue.
        group`): one Delta commit with the requests of other threads queued meanwhile. Blocks
        until the commit holding it has landed; raises its own error only."""
        request.policies = self.policies
        return cast(Outcome, self.partitioned.submit(request))

    # -- looking -----------------------------------------------------------------------------

    def queues(self) -> list[str]:
        """The queues declared in this table.

        Returns:
            Their names, sorted; empty where there is no table yet.
        """
        snapshot = self.store.snapshot()
        return sorted(snapshot.states) if snapshot is not None else []

    @renamed("arguments", QUEUE_RENAMES)
    def arguments(self, queue: str) -> QueueArguments:
        """The queue's effective arguments, as stored (see :meth:`resolve` for their origin).

        Args:
            queue: the queue.

        Returns:
            Its :class:`QueueArguments`.

        Raises:
            QueueNotFoundError: no queue ``queue``.
        """
        return self._require(self._snapshot(), queue).arguments

    @renamed("resolve", QUEUE_RENAMES)
    def resolve(
        self,
        queue: str,
        arguments: QueueArguments | None = None,
        **keywords: Unpack[QueueArgumentKeywords],
    ) -> Resolution:
        """The arguments ``queue`` would have if declared now, with each one's origin.

        Needs policies. For an existing queue its explicit arguments are used, with the
        given ones merged in (as ``alter`` would); for a new queue, only the given ones. Reads
        the table only if it exists; writes nothing.

        Args:
            queue: the queue.
            arguments: a :class:`QueueArguments`, as :meth:`declare` takes it.
            **keywords: queue arguments, snake_case, as :meth:`declare` takes them.

        Returns:
            A :class:`~spark_queue.model.policies.Resolution`: each argument's value and origin
            (given, stored, policy default, policy cap, built-in default).

        Raises:
            PolicyError: no policies were given, or they make the arguments invalid.
            InvalidOptionError: an argument is unknown or has an invalid value.
        """
        parse_queue_name("queue", queue)
        given = given_arguments(arguments, keywords)
        if self.policies is None:
            raise PolicyError(
                f"no policies to resolve {queue!r} with: pass policies= or set ${ENV_VAR}"
            )
        snapshot = self.store.snapshot()
        state = snapshot.states.get(queue) if snapshot is not None else None
        explicit = dict(state.explicit) if state is not None else {}
        return self.policies.resolve(queue, {**explicit, **given})

    @renamed("stats", QUEUE_RENAMES)
    @routed
    def stats(self, queue: str) -> QueueStats:
        """Gauges and counters of SEMANTICS §4, as of now (due scheduled messages
        counted as the next commit would).

        Args:
            queue: the queue.

        Returns:
            A :class:`~spark_queue.QueueStats`: ``ready``, ``ready_bytes``, ``leased``,
            ``scheduled``, ``leased_by_consumer``,
            ``groups_by_consumer`` (message groups each consumer holds) and
            every counter (``added``, ``acked``, ``replaced``, ``dropped``, ``rejected``,
            ``expired``, ``killed``, ``dead_lettered``, ``purged``, ``duplicates``).
            ``added = acked + replaced + dropped + expired + killed + purged + ready + leased
            + scheduled`` always holds; ``rejected`` and ``duplicates`` were never added, and
            ``dead_lettered`` counts copies sent to the dead-letter queue (``added`` there).
            A partitioned queue's are its partitions' added up (:meth:`partition_stats`).

        Raises:
            QueueNotFoundError: no queue ``queue``.
        """
        return summed(self.partition_stats(queue))

    def partition_stats(self, queue: str) -> list[QueueStats]:
        """:meth:`stats` of each partition of ``queue``, partition 0 first (one, of the
        whole queue, where it has no partitions).

        Raises:
            QueueNotFoundError: no queue ``queue``.
        """
        snapshot = self._snapshot()
        self._require(snapshot, queue)
        return self.partitioned.stats(queue, snapshot)

    @renamed("peek", QUEUE_RENAMES)
    def peek(self, queue: str, limit: int = 10) -> pa.Table:
        """Up to ``limit`` live messages of ``queue`` in delivery order; commits nothing.

        Args:
            queue: the queue.
            limit: how many messages at most.

        Returns:
            The messages, as the browse read returns them.

        Raises:
            QueueNotFoundError: no queue ``queue``.
            InvalidOptionError: ``limit`` is not a whole number >= 0.
        """
        limit = ARGUMENTS["limit"].parse(limit)
        snapshot = self._snapshot()
        self._require(snapshot, queue)
        return self.partitioned.peek(queue, snapshot, limit)

    def history(self, queue: str | None = None, versions: Iterable[int] | None = None) -> pa.Table:
        """Gauges and counters of queues after each commit, from the Delta log.

        Args:
            queue: one queue; None: every queue.
            versions: the table versions to read, e.g. ``range(10, 20)``; None: every
                version the log still holds.

        Returns:
            One row per queue and version; the columns and their exact meaning are in
            :mod:`spark_queue.storage.history`.

        Raises:
            TableNotFoundError: no queue table at the path.
            QueueNotFoundError: no queue ``queue``.
        """
        from spark_queue.storage.history import queue_history

        return queue_history(self.store, queue, versions)

    # -- helpers -----------------------------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        snapshot = self.store.snapshot()
        if snapshot is None:
            raise TableNotFoundError(self.path)
        return snapshot

    def _require(self, snapshot: Snapshot, queue: str) -> QueueState:
        return require_queue(snapshot.states, queue, self.path)


check_signature(QueueTable.lease, "lease", own=("strict_groups",))
check_signature(QueueTable.publish, "publish", own=("producer", "sequence"))
