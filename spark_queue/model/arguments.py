"""The one specification of every argument.

Every surface (Spark options, ``QueueTable`` keywords, the consumer and publisher, CLI flags,
the policies file) reads its arguments here: each is defined once, with its kind, unit,
default, scopes, policy keys and doc line, and each surface's spelling is derived from its
snake_case name (camelCase options, ``--kebab-case`` flags, ``default-kebab-case`` policy
keys). A kind (:mod:`spark_queue.model.kinds`) has one parser and one message, which names
the argument as the caller spelled it and the values it takes.

The docs' arguments page, ``docs/ARGUMENTS.md``, is generated from here by a repository
tool, ``tools/argument_docs.py``, which also holds what only the page says (defaults as
shown, what an argument means in one scope, its policy cap).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from spark_queue.errors import InvalidOptionError

# The kinds and their parsers: the package and its tests take them from the specification,
# which gives each argument one.
from spark_queue.model.kinds import BOOL as BOOL
from spark_queue.model.kinds import CONSUMER as CONSUMER
from spark_queue.model.kinds import CONSUMER_NAME as CONSUMER_NAME
from spark_queue.model.kinds import COUNT as COUNT
from spark_queue.model.kinds import DELIVERY_LIMIT as DELIVERY_LIMIT
from spark_queue.model.kinds import FRACTION as FRACTION
from spark_queue.model.kinds import INT32_MAX as INT32_MAX
from spark_queue.model.kinds import INT32_MIN as INT32_MIN
from spark_queue.model.kinds import INT64_MAX as INT64_MAX
from spark_queue.model.kinds import LIMIT as LIMIT
from spark_queue.model.kinds import MAX_DURATION_DAYS as MAX_DURATION_DAYS
from spark_queue.model.kinds import MAX_DURATION_MS as MAX_DURATION_MS
from spark_queue.model.kinds import MULTIPLIER as MULTIPLIER
from spark_queue.model.kinds import POSITIVE as POSITIVE
from spark_queue.model.kinds import PRIORITY as PRIORITY
from spark_queue.model.kinds import QUEUE as QUEUE
from spark_queue.model.kinds import QUEUE_NAME as QUEUE_NAME
from spark_queue.model.kinds import QUEUE_OPTIONAL as QUEUE_OPTIONAL
from spark_queue.model.kinds import SEQ as SEQ
from spark_queue.model.kinds import Bool as Bool
from spark_queue.model.kinds import Choice as Choice
from spark_queue.model.kinds import Count as Count
from spark_queue.model.kinds import Duration as Duration
from spark_queue.model.kinds import Fraction as Fraction
from spark_queue.model.kinds import Kind as Kind
from spark_queue.model.kinds import Limit as Limit
from spark_queue.model.kinds import Multiplier as Multiplier
from spark_queue.model.kinds import Name as Name
from spark_queue.model.kinds import Priority as Priority
from spark_queue.model.kinds import Seq as Seq
from spark_queue.model.kinds import Text as Text
from spark_queue.model.kinds import duration_ms as duration_ms
from spark_queue.model.kinds import flag_type as flag_type
from spark_queue.model.kinds import parse_consumer_name as parse_consumer_name
from spark_queue.model.kinds import parse_count as parse_count
from spark_queue.model.kinds import parse_duration_ms as parse_duration_ms
from spark_queue.model.kinds import parse_queue_name as parse_queue_name
from spark_queue.model.kinds import parse_seq as parse_seq
from spark_queue.model.kinds import parse_seqs as parse_seqs
from spark_queue.model.kinds import shown as shown
from spark_queue.model.partitions import MAX_PARTITIONS

PARTITIONS = Count(minimum=1, maximum=MAX_PARTITIONS)

# The values of each choice: a Literal type, what a type checker accepts, and the tuple of
# its values that the choice's parser accepts (in any case), derived from it.
Overflow = Literal["drop-head", "ring", "reject-publish", "reject-publish-dlx"]
"""What a queue does at a limit: the values of ``overflow``."""
OnReject = Literal["drop", "fail"]
"""What a publish or a write does with messages a reject policy refuses: ``on_reject``."""
ExpirationModel = Literal["default", "queue", "earliest", "latest"]
"""How a message's and its queue's expiry combine: ``expiration_model``."""
Semantics = Literal["at-least-once", "at-most-once"]
"""The streaming source's delivery guarantee: ``semantics``."""
AckMode = Literal["commit", "manual"]
"""Who acknowledges the streaming source's batches: ``ackMode``."""
ReadMode = Literal["executors", "driver"]
"""Who reads the streaming source's leased batches: ``readMode``."""
OVERFLOW_POLICIES: tuple[Overflow, ...] = get_args(Overflow)
REJECT_POLICIES: tuple[Overflow, ...] = ("reject-publish", "reject-publish-dlx")
ON_REJECT_ACTIONS: tuple[OnReject, ...] = get_args(OnReject)
EXPIRATION_MODELS: tuple[ExpirationModel, ...] = get_args(ExpirationModel)
SEMANTICS: tuple[Semantics, ...] = get_args(Semantics)
ACK_MODES: tuple[AckMode, ...] = get_args(AckMode)
READ_MODES: tuple[ReadMode, ...] = get_args(ReadMode)

# Where an argument applies. ``queue``: a queue argument, stored with the queue (declare,
# alter, a sink's options, CLI flags, policies); ``sink``/``source``: an option of a Spark
# write/read; ``lease``: a consumer's limits of ``QueueTable.lease`` and the source;
# ``consumer``/``publisher``: a keyword of ``QueueTable.consumer()`` / ``publisher()``;
# ``publish``: a keyword of ``QueueTable.publish``; ``browse``: an option of a batch read;
# ``call``: what every call of ``QueueTable``, its clients and the CLI names the same way,
# in the same place (the queue first, as the CLI's first argument ``QUEUE``).
SCOPES = (
    "queue",
    "sink",
    "source",
    "browse",
    "lease",
    "consumer",
    "publisher",
    "publish",
    "call",
)


def camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(word.capitalize() for word in rest)


@dataclass(frozen=True)
class Argument:
    """One argument, once: its snake_case name, kind, default (as parsed), unit, scopes,
    policy keys (``default-*`` and a cap), and doc line.

    ``defaults`` maps a scope whose signature gives another default to that default, as the
    signature spells it (``QueueTable.lease`` leases 100 messages at most, the source no
    limit). ``sentinel`` is what a consumer's limits (``ConsumerLimits``, which the lease
    planner takes) hold where the argument sets none: the planner counts a delivery or cancel
    limit of 0 as none."""

    name: str
    kind: Kind[Any]
    doc: str
    scopes: tuple[str, ...]
    default: Any = None
    unit: str = ""
    policy_default: bool = False  # has a ``default-<kebab>`` policy key
    policy_cap: bool = False  # has a ``<kebab>`` cap key
    spark_option: str | None = None  # a Spark option spelt other than camel(name)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    sentinel: Any = None

    @property
    def option(self) -> str:
        """Its Spark option (camelCase, looked up case-insensitively)."""
        return self.spark_option or camel(self.name)

    @property
    def flag(self) -> str:
        """Its CLI flag."""
        return "--" + self.name.replace("_", "-")

    @property
    def policy_keys(self) -> tuple[str, ...]:
        kebab = self.name.replace("_", "-")
        return (
            *((f"default-{kebab}",) if self.policy_default else ()),
            *((kebab,) if self.policy_cap else ()),
        )

    def parse(self, value: object, label: str | None = None, *, quoted: bool = True) -> Any:
        """The parsed value; errors name ``label`` (the caller's spelling) or the name, and
        quote the value unless ``quoted`` is unset. ``None`` is the argument not given
        where its default is None (no such value)."""
        if value is None and self.default is None:
            return None
        return self.kind.parse(label or self.name, value, quoted=quoted)

    def default_in(self, scope: str) -> Any:
        """Its default in ``scope``, as that scope's signature or dataclass gives it."""
        return self.defaults.get(scope, self.default)

    @property
    def held_name(self) -> str:
        """Its name in a consumer's limits: a duration is held in microseconds, the unit of
        the lease planner's clock, as ``<name>_us``."""
        return f"{self.name}_us" if self.unit == "ms" else self.name

    def held(self, parsed: Any) -> Any:
        """A parsed value as a consumer's limits hold it: :attr:`sentinel` for none, a
        duration in microseconds."""
        if parsed is None:
            return self.sentinel
        return parsed * 1000 if self.unit == "ms" else parsed


def _queue(name: str, kind: Kind[Any], doc: str, default: Any = None, **more: Any) -> Argument:
    scopes = more.pop("scopes", ("queue", "sink"))
    return Argument(name, kind, doc, scopes, default, policy_default=True, **more)


SPECIFICATION: tuple[Argument, ...] = (
    Argument(
        "path",
        Text(),
        "the queue table, an absolute local path or a URI (`.start(path)`, `.save(path)`, "
        "`.load(path)` set it)",
        ("sink", "source", "browse"),
    ),
    Argument(
        "queue",
        QUEUE_OPTIONAL,
        "the queue of rows whose `queue` column is null or absent; required when there is "
        "no `queue` column",
        ("sink", "source", "browse", "call"),
    ),
    Argument(
        "consumer",
        CONSUMER,
        "this consumer's name; one query per name. A fresh checkpoint starts a new session "
        "and returns what the name still held",
        ("source", "lease", "call"),
        "default",
    ),
    _queue(
        "max_length",
        LIMIT,
        "limit on **ready** messages; the overflow policy applies beyond it",
        unit="messages",
        policy_cap=True,
    ),
    _queue(
        "max_length_bytes",
        LIMIT,
        "limit on the sum of ready messages' `body` lengths; not with `overflow=ring`",
        unit="bytes",
        policy_cap=True,
    ),
    Argument(
        "ring_size",
        COUNT,
        "shorthand for `maxLength=N, overflow=ring`; with another `overflow` or `maxLength` "
        "it is an error",
        ("queue", "sink"),
        unit="messages",
        policy_default=True,
    ),
    _queue(
        "overflow",
        Choice(OVERFLOW_POLICIES),
        "what happens at a limit (SEMANTICS §2); `ring` bounds the count only",
        "drop-head",
    ),
    _queue(
        "dead_letter_queue",
        QUEUE_OPTIONAL,
        "the queue that receives dropped (`drop-head`) and rejected (`reject-publish-dlx`) "
        "messages, reason `maxlen`, and expired and dead ones",
    ),
    _queue(
        "reject_threshold",
        FRACTION,
        "reject policies refuse a message once the queue would pass this fraction of a limit "
        "(Qpid refuses at 0.8)",
        1.0,
    ),
    Argument(
        "on_reject",
        Choice(ON_REJECT_ACTIONS),
        "`drop` counts rejected messages; `fail`: a batch with a rejected message fails and "
        "commits nothing",
        ("sink", "publish", "publisher"),
        "drop",
    ),
    _queue(
        "expiration",
        Duration(optional=True),
        "the queue's default message time-to-live, from `enqueued_at` (applied when a "
        "consumer reaches the message)",
        unit="ms",
    ),
    _queue(
        "expiration_model",
        Choice(EXPIRATION_MODELS),
        "how a message's `expires_at` and the queue's `expiration` combine (AMPS): `default` "
        "the message's own if set, else the queue's; `queue` the queue's only; "
        "`earliest`/`latest` the earlier/later of those set",
        "default",
    ),
    _queue(
        "max_deliveries",
        DELIVERY_LIMIT,
        "the queue's delivery limit (RabbitMQ `x-delivery-limit`): a message returned after "
        "this many deliveries is killed (dead-lettered `delivery_limit`); a consumer's own "
        "`maxDeliveries` may only lower it",
        unit="deliveries",
        policy_cap=True,
        scopes=("queue", "sink", "source", "lease", "consumer"),
        sentinel=0,
    ),
    _queue(
        "max_cancels",
        DELIVERY_LIMIT,
        "the queue's cancel limit (AMPS `MaxCancels`): the cancel that reaches it kills the "
        "message (`cancel_limit`); a consumer's `maxCancels` may only lower it",
        unit="cancels",
        policy_cap=True,
        scopes=("queue", "sink", "source", "lease", "consumer"),
        sentinel=0,
    ),
    _queue(
        "exclusive",
        BOOL,
        "one consumer name holds the queue at a time (Artemis exclusive queues, RabbitMQ "
        "single active consumer): the last one that leased something, until it releases or "
        "its last lease period runs out; others lease nothing meanwhile",
        False,
    ),
    _queue(
        "redelivery_delay",
        Duration(zero_is_none=True),
        "the queue's redelivery backoff (Artemis `redelivery-delay`): a cancelled message, or "
        "one whose lease ran out, waits this long (counted `scheduled`) before it can be "
        "leased again",
        unit="ms",
    ),
    _queue(
        "redelivery_multiplier",
        MULTIPLIER,
        "each further redelivery waits the previous delay times this (Artemis "
        "`redelivery-delay-multiplier`): delay x multiplier^(deliveries - 1)",
        1.0,
    ),
    _queue(
        "max_redelivery_delay",
        Duration(zero_is_none=True, zero_is_old_none=True),
        "the longest a redelivery waits (Artemis `max-redelivery-delay`, same default)",
        unit="ms",
    ),
    _queue(
        "message_groups",
        BOOL,
        "the messages of one `key` are a group, leased to one consumer at a time and in "
        "order, while other groups go to other consumers (Artemis message grouping, SQS FIFO "
        '`MessageGroupId`): SEMANTICS §3 "Message groups"',
        False,
    ),
    _queue(
        "duplicate_window",
        Duration(zero_is_none=True),
        "de-duplication by `message_id` (JetStream's `Duplicates` window): a message whose id "
        "was enqueued to the queue within this window, by any producer, is not enqueued "
        "again, and is counted `duplicates`",
        unit="ms",
        policy_cap=True,
    ),
    Argument(
        "partitions",
        PARTITIONS,
        "the queue's partitions, each a queue table of its own that takes a share of its "
        "messages (by `key`) and of its commits: docs/PARTITIONS.md. `alter` raises it, "
        "never lowers it; limits hold per partition",
        ("queue", "sink"),
        1,
        unit="partitions",
    ),
    Argument(
        "policies",
        Text(),
        "a policies file (TOML) of defaults and caps for the queues this write declares "
        "(docs/POLICIES.md); an invalid file fails the write before any task runs, naming "
        "file, line and key",
        ("sink",),
    ),
    Argument(
        "semantics",
        Choice(SEMANTICS),
        "at-least-once: leased, acknowledged after Spark commits the batch; at-most-once: "
        "removed (counted `acked`) when leased",
        ("source",),
        "at-least-once",
    ),
    Argument(
        "lease_period",
        Duration(minimum_ms=1, optional=True),
        "an unacknowledged lease older than this returns the message for any consumer, "
        "`delivery_count` + 1",
        ("source", "lease", "consumer"),
        unit="ms",
        defaults={"consumer": "30 seconds"},
    ),
    Argument(
        "max_messages",
        POSITIVE,
        "messages per micro-batch (Spark's `ReadMaxRows`)",
        ("source", "lease"),
        unit="messages",
        spark_option="maxMessagesPerTrigger",
        defaults={"lease": 100},
    ),
    Argument(
        "max_bytes",
        POSITIVE,
        "body bytes per micro-batch; at least one message is always taken",
        ("source", "lease"),
        unit="bytes",
        spark_option="maxBytesPerTrigger",
    ),
    Argument(
        "max_backlog",
        POSITIVE,
        "leases outstanding across all consumers of the queue",
        ("source",),
        unit="messages",
    ),
    Argument(
        "ack_mode",
        Choice(ACK_MODES),
        "`manual`: acknowledge with `QueueTable.ack` (e.g. in `foreachBatch`)",
        ("source",),
        "commit",
    ),
    Argument(
        "read_mode",
        Choice(READ_MODES),
        "who reads a leased batch. `executors`: Python tasks on the executors, in parallel "
        "(for throughput). `driver`: the driver's source worker, as it leases the batch, "
        "handing the rows to Spark with the batch's plan; no executor Python worker starts, "
        "so each micro-batch is ~60 ms shorter on two cores and small batches arrive sooner "
        '(for latency; `docs/DESIGN.md`, "Reading a batch on the driver"). A batch then '
        "passes through the driver whole: without `maxMessagesPerTrigger` or "
        "`maxBytesPerTrigger` it takes at most 64 MiB of bodies",
        ("source",),
        "executors",
    ),
    Argument(
        "filter",
        Text(),
        "a SQL predicate over the message columns, e.g. `headers['region'] = 'eu'`: this "
        "consumer leases only matching messages; the rest stay, in place, for others (an AMPS "
        "filter, a JMS selector). A predicate that does not parse fails, naming `filter`",
        ("source", "lease", "consumer"),
    ),
    Argument(
        "max_prefetch",
        POSITIVE,
        "messages prefetched and in hand (delivered, not settled), at most (pika's "
        "`prefetch_count`)",
        ("consumer",),
        1000,
        unit="messages",
    ),
    Argument(
        "ack_batch",
        POSITIVE,
        "pending acknowledgements that trigger a flush",
        ("consumer",),
        1000,
        unit="messages",
    ),
    Argument(
        "ack_interval",
        Duration(minimum_ms=1, optional=True),
        "the longest an acknowledgement waits for its flush; below half the lease period (an "
        "acknowledged message's lease is no longer extended)",
        ("consumer",),
        unit="ms",
    ),
    Argument(
        "idle_check_interval",
        Duration(minimum_ms=1, optional=True),
        "the longest gap between two checks of the log for new messages by an idle consumer "
        "(they start 5 ms apart and grow to it; a commit of the same process wakes it at "
        "once). Not kafka-python's `max_poll_interval_ms`, the longest gap allowed between "
        "two `poll()` calls",
        ("consumer",),
        unit="ms",
    ),
    Argument(
        "idle_lease_interval",
        Duration(minimum_ms=1),
        "an idle consumer leases at least this often (scheduled messages falling due, leases "
        "running out make no version)",
        ("consumer",),
        1000,
        unit="ms",
    ),
    Argument(
        "linger",
        Duration(),
        "the longest a batch's first message waits for others to share its commit",
        ("publisher",),
        5,
        unit="ms",
    ),
    Argument(
        "max_batch",
        POSITIVE,
        "messages published in one commit at most",
        ("publisher",),
        1000,
        unit="messages",
    ),
    # The durations and counts of single calls, named alike wherever a call takes them.
    Argument(
        "delay",
        Duration(optional=True),
        "how long a returned message waits before it is ready again (JetStream "
        "`NakWithDelay`): `QueueTable.cancel`, `Consumer.nack`, `Message.nack`; 0 returns it "
        "at once whatever the queue's backoff",
        ("call",),
        unit="ms",
    ),
    Argument(
        "period",
        Duration(minimum_ms=1),
        "how long from now an extended lease runs (`QueueTable.extend`; SQS "
        "`ChangeMessageVisibility`)",
        ("call",),
        unit="ms",
    ),
    Argument(
        "wait_time",
        Duration(optional=True),
        "how long `Consumer.receive` waits for its first message (SQS `WaitTimeSeconds`); 0 "
        "takes only what is prefetched",
        ("call",),
        unit="ms",
    ),
    Argument(
        "limit",
        COUNT,
        "how many messages `QueueTable.peek` shows at most",
        ("call",),
        10,
        unit="messages",
    ),
)
ARGUMENTS: dict[str, Argument] = {a.name: a for a in SPECIFICATION}
"""Every argument of the specification by its snake_case name."""


def arguments_of(scope: str) -> tuple[Argument, ...]:
    return tuple(a for a in SPECIFICATION if scope in a.scopes)


def parse_given(
    scope: str, given: Mapping[str, Any], spelling: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Parse the arguments of ``scope`` in ``given`` (keyed by snake_case name); messages
    name each as ``spelling`` maps it (default: the snake_case name)."""
    valid = {a.name: a for a in arguments_of(scope)}
    parsed = {}
    for name, value in given.items():
        if name not in valid:
            label = (spelling or {}).get(name, name)
            raise InvalidOptionError(
                f"unknown argument {label!r}; valid: {', '.join(sorted(valid))}"
            )
        parsed[name] = valid[name].parse(value, (spelling or {}).get(name))
    return parsed
