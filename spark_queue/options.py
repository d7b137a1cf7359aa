"""Options of ``format("ringqueue")`` and the queue arguments they declare.

Spark hands a data source its options lower-cased with string values; the Python API passes
snake_case keyword arguments. Both meet here as :class:`QueueArguments`, so one validator
serves the stream, the batch write and ``QueueTable``. ``docs/OPTIONS.md`` is the table of
every option with its default.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from spark_queue.errors import InvalidOptionError
from spark_queue.storage import OPTION_PREFIX, normalise_options

OVERFLOW_POLICIES = ("drop-head", "ring", "reject-publish", "reject-publish-dlx")
REJECT_POLICIES = ("reject-publish", "reject-publish-dlx")
ON_REJECT_ACTIONS = ("drop", "fail")
EXPIRATION_MODELS = ("default", "queue", "earliest", "latest")
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,255}$")

# camelCase option -> snake_case argument, for the queue arguments a write may declare.
ARGUMENT_OPTIONS = {
    "maxLength": "max_length",
    "maxLengthBytes": "max_length_bytes",
    "overflow": "overflow",
    "deadLetterQueue": "dead_letter_queue",
    "rejectThreshold": "reject_threshold",
    "expiration": "expiration",
    "expirationModel": "expiration_model",
    "maxDeliveries": "max_deliveries",
    "maxCancels": "max_cancels",
    "exclusive": "exclusive",
    "redeliveryDelay": "redelivery_delay",
    "redeliveryMultiplier": "redelivery_multiplier",
    "maxRedeliveryDelay": "max_redelivery_delay",
    "messageGroups": "message_groups",
    "duplicateWindow": "duplicate_window",
}
SINK_OPTIONS = ("path", "queue", "ringSize", "onReject", "policies", *ARGUMENT_OPTIONS)
SOURCE_OPTIONS = (
    "path",
    "queue",
    "consumer",
    "semantics",
    "leasePeriod",
    "maxMessagesPerTrigger",
    "maxBytesPerTrigger",
    "maxDeliveries",
    "maxCancels",
    "maxBacklog",
    "ackMode",
    "filter",
    "readMode",
)
SEMANTICS = ("at-least-once", "at-most-once")
ACK_MODES = ("commit", "manual")
READ_MODES = ("executors", "driver")
BROWSE_OPTIONS = ("path", "queue")
# Keys Spark itself adds to a data source's options.
SPARK_OPTIONS = ("checkpointlocation",)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")
_UNIT_MS = {
    "": 1,
    "ms": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}


@dataclass(frozen=True)
class QueueArguments:
    """A queue's arguments. ``None`` limits mean unlimited."""

    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dead_letter_queue: str | None = None
    reject_threshold: float = 1.0
    expiration: int | None = None  # milliseconds
    expiration_model: str = "default"
    # A leased message returned this many times after delivery / after a cancel is killed
    # (dead-lettered ``delivery_limit`` / ``cancel_limit``); a consumer may set a lower one.
    max_deliveries: int | None = None
    max_cancels: int | None = None
    # One consumer name holds the queue at a time (Artemis exclusive queues, RabbitMQ single
    # active consumer): SEMANTICS §3 "Exclusive queues".
    exclusive: bool = False
    # A cancelled message, or one whose lease ran out, is not leased again before
    # redelivery_delay x redelivery_multiplier^(deliveries - 1) milliseconds, at most
    # max_redelivery_delay (None: 10 x redelivery_delay), as Artemis's address settings of
    # the same names: SEMANTICS §3 "Redelivery backoff".
    redelivery_delay: int | None = None
    redelivery_multiplier: float = 1.0
    max_redelivery_delay: int | None = None
    # Messages with the same ``key`` form a group, leased to one consumer at a time, in
    # order (Artemis message grouping, SQS FIFO message groups): SEMANTICS §3 "Message groups".
    message_groups: bool = False
    # Milliseconds: a message_id enqueued to the queue within this window is not enqueued
    # again (JetStream's Duplicates window): SEMANTICS §2 "De-duplication".
    duplicate_window: int | None = None

    def to_dict(self) -> dict[str, Any]:
        # Every field is a scalar: no deep copy (dataclasses.asdict's) is needed, and a
        # commit writes each queue's arguments with its state.
        return {name: getattr(self, name) for name in ARGUMENT_NAMES}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> QueueArguments:
        return cls(**json.loads(text))

    def merged(self, given: Mapping[str, Any]) -> QueueArguments:
        return replace(self, **given)


ARGUMENT_NAMES = tuple(f.name for f in fields(QueueArguments))
_OPTION_OF = {snake: camel for camel, snake in ARGUMENT_OPTIONS.items()}


def option_name(argument: str) -> str:
    """The camelCase option of a snake_case argument, for messages."""
    return _OPTION_OF.get(argument, argument)


def parse_limit(name: str, value: Any) -> int | None:
    """``maxLength``/``maxLengthBytes``: a whole number >= 0, or -1/unset for unlimited."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidOptionError(f"{name} must be a whole number >= 0 or -1, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    else:
        text = str(value).strip()
        if not re.fullmatch(r"-?\d+", text):
            raise InvalidOptionError(
                f"{name} must be a whole number >= 0, or -1 for unlimited; got {value!r}"
            )
        number = int(text)
    if number == -1:
        return None
    if number < 0:
        raise InvalidOptionError(
            f"{name} must be a whole number >= 0, or -1 for unlimited; got {value!r}"
        )
    return number


def parse_delivery_limit(name: str, value: Any) -> int | None:
    """``maxDeliveries``/``maxCancels`` of a queue: a whole number > 0; 0, -1 or unset for
    none (0 means none for the consumer options of the same name, too)."""
    try:
        number = parse_limit(name, value)
    except InvalidOptionError:
        raise InvalidOptionError(
            f"{name} must be a whole number > 0, or 0 / -1 for no limit; got {value!r}"
        ) from None
    return number or None


def parse_bool(name: str, value: Any) -> bool:
    """``true``/``false`` (any case), or a bool."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise InvalidOptionError(f"{name} must be true or false; got {value!r}")
    return text == "true"


def parse_multiplier(name: str, value: Any) -> float:
    """``redeliveryMultiplier``: a finite number >= 1 (1: every redelivery waits the same)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not (math.isfinite(number) and number >= 1.0):
        raise InvalidOptionError(f"{name} must be a number >= 1; got {value!r}")
    return number


def effective_limit(queue_limit: int | None, consumer_limit: int) -> int:
    """A delivery or cancel limit as it applies: the lower of the queue's (None: none) and
    the consumer's (0: none), so a consumer can tighten its queue's limit, never loosen it.
    0 where neither sets one."""
    limits = [n for n in (queue_limit, consumer_limit) if n]
    return min(limits) if limits else 0


def parse_duration_ms(name: str, value: Any) -> int | None:
    """A duration such as ``30 seconds``, ``5m`` or a plain number of milliseconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0 or not math.isfinite(value):
            raise InvalidOptionError(f"{name} must be a duration >= 0, got {value!r}")
        return int(value)
    match = _DURATION.match(str(value).lower())
    if not match or match.group(2) not in _UNIT_MS:
        raise InvalidOptionError(
            f"{name} must be a duration such as '30 seconds', '5 minutes', '1h' or a number of "
            f"milliseconds; got {value!r}"
        )
    return int(float(match.group(1)) * _UNIT_MS[match.group(2)])


def parse_optional_duration(name: str, value: Any) -> int | None:
    """A duration that may be absent (``redeliveryDelay``, ``duplicateWindow``): as
    :func:`parse_duration_ms`, with 0 meaning none."""
    return parse_duration_ms(name, value) or None


def parse_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise InvalidOptionError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return text


def check_queue_name(name: str, value: Any) -> str:
    if not isinstance(value, str) or not QUEUE_NAME.match(value):
        raise InvalidOptionError(
            f"{name} must be a queue name of 1 to 255 characters from A-Z a-z 0-9 _ . -; "
            f"got {value!r}"
        )
    return value


def parse_threshold(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (0.0 < number <= 1.0):
        raise InvalidOptionError(f"{name} must be a fraction in (0, 1]; got {value!r}")
    return number


def validate_arguments(given: Mapping[str, Any], *, camel: bool = False) -> dict[str, Any]:
    """Validate snake_case queue arguments; returns the parsed values of those given.

    ``ring_size=N`` is shorthand for ``max_length=N, overflow="ring"``. With ``camel`` set,
    messages name the camelCase options, as a stream's user wrote them.
    """

    def label(argument: str) -> str:
        return option_name(argument) if camel else argument

    unknown = sorted(set(given) - set(ARGUMENT_NAMES) - {"ring_size"})
    if unknown:
        valid = ", ".join(label(n) for n in (*ARGUMENT_NAMES, "ring_size"))
        raise InvalidOptionError(f"unknown queue argument {unknown[0]!r}; valid: {valid}")
    parsed: dict[str, Any] = {}
    if given.get("ring_size") is not None:
        size = parse_limit(label("ring_size") if not camel else "ringSize", given["ring_size"])
        if "overflow" in given and str(given["overflow"]).strip().lower() != "ring":
            raise InvalidOptionError(
                f"ringSize means overflow=ring; it cannot be combined with overflow="
                f"{given['overflow']!r}"
            )
        if (
            given.get("max_length") is not None
            and parse_limit(label("max_length"), given["max_length"]) != size
        ):
            raise InvalidOptionError(
                f"ringSize={given['ring_size']!r} and maxLength={given['max_length']!r} disagree"
            )
        parsed["max_length"] = size
        parsed["overflow"] = "ring"
    for argument in ("max_length", "max_length_bytes"):
        if argument in given and argument not in parsed:
            parsed[argument] = parse_limit(label(argument), given[argument])
    if "overflow" in given and "overflow" not in parsed:
        parsed["overflow"] = parse_choice(label("overflow"), given["overflow"], OVERFLOW_POLICIES)
    if "dead_letter_queue" in given:
        value = given["dead_letter_queue"]
        parsed["dead_letter_queue"] = (
            None if value in (None, "") else check_queue_name(label("dead_letter_queue"), value)
        )
    if "reject_threshold" in given:
        parsed["reject_threshold"] = parse_threshold(
            label("reject_threshold"), given["reject_threshold"]
        )
    if "expiration" in given:
        parsed["expiration"] = parse_duration_ms(label("expiration"), given["expiration"])
    for argument in ("redelivery_delay", "max_redelivery_delay", "duplicate_window"):
        if argument in given:
            parsed[argument] = parse_optional_duration(label(argument), given[argument])
    if "redelivery_multiplier" in given:
        parsed["redelivery_multiplier"] = parse_multiplier(
            label("redelivery_multiplier"), given["redelivery_multiplier"]
        )
    for argument in ("exclusive", "message_groups"):
        if argument in given:
            parsed[argument] = parse_bool(label(argument), given[argument])
    for argument in ("max_deliveries", "max_cancels"):
        if argument in given:
            parsed[argument] = parse_delivery_limit(label(argument), given[argument])
    if "expiration_model" in given:
        parsed["expiration_model"] = parse_choice(
            label("expiration_model"), given["expiration_model"], EXPIRATION_MODELS
        )
    if ring_with_byte_limit(parsed.get("overflow"), parsed.get("max_length_bytes")):
        raise InvalidOptionError(
            f"{RING_COUNT_ONLY}; {label('max_length_bytes')} needs drop-head or a reject policy"
        )
    return parsed


RING_COUNT_ONLY = "overflow=ring bounds the message count only"


def ring_with_byte_limit(overflow: str | None, max_length_bytes: int | None) -> bool:
    """The rule every layer (arguments, policy defaults, caps, resolution) checks: a ring
    bounds the count only (it replaces the oldest message, one for one), so it takes no
    byte limit."""
    return overflow == "ring" and max_length_bytes is not None


@dataclass(frozen=True)
class SinkOptions:
    """The parsed options of one ``writeStream``/``write`` to ``format("ringqueue")``."""

    path: str
    queue: str | None
    on_reject: str
    arguments: dict[str, Any]  # validated snake_case queue arguments that were given
    policies: str | None = None  # a policies file (docs/POLICIES.md); None: $SPARK_QUEUE_POLICIES
    # ``storage.*`` options, keys as delta-rs reads them (spark_queue.storage); never in a repr.
    storage: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of ``spark.readStream.format("ringqueue")``."""

    path: str
    queue: str
    consumer: str = "default"
    semantics: str = "at-least-once"
    lease_period: int | None = None  # microseconds; None = leases never expire
    max_messages: int | None = None
    max_bytes: int | None = None
    max_deliveries: int = 0
    max_cancels: int = 0
    max_backlog: int | None = None
    ack_mode: str = "commit"
    filter: str | None = None  # SQL predicate over the message columns
    read_mode: str = "executors"
    storage: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class BrowseOptions:
    path: str
    queue: str | None
    storage: dict[str, str] = field(default_factory=dict, repr=False)


def _lookup(options: Mapping[str, str], allowed: tuple[str, ...]) -> dict[str, str]:
    """Match Spark's lower-cased keys to camelCase names; unknown keys are an error.
    ``storage.*`` keys are not looked up here (:func:`storage_options`)."""
    by_lower = {name.lower(): name for name in allowed}
    found: dict[str, str] = {}
    for key, value in options.items():
        lower = key.lower()
        if lower in SPARK_OPTIONS or lower.startswith(OPTION_PREFIX):
            continue
        if lower not in by_lower:
            raise InvalidOptionError(
                f"unknown option {key!r}; valid options: {', '.join(allowed)}, "
                f"and {OPTION_PREFIX}<KEY> for the store (docs/STORAGE.md)"
            )
        found[by_lower[lower]] = value
    return found


def storage_options(options: Mapping[str, str]) -> dict[str, str]:
    """The ``storage.<KEY>`` options, prefix dropped and keys spelt as delta-rs reads them
    (Spark hands them over lower-cased; :func:`~spark_queue.storage.normalise_options`)."""
    given = {
        key[len(OPTION_PREFIX) :]: value
        for key, value in options.items()
        if key.lower().startswith(OPTION_PREFIX)
    }
    return normalise_options(given, what="option storage.<KEY>")


def _path(found: Mapping[str, str]) -> str:
    path = found.get("path")
    if not path:
        raise InvalidOptionError("option 'path' is required: the queue table's location")
    return path


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    found = _lookup(options, SINK_OPTIONS)
    queue = found.get("queue")
    if queue is not None:
        check_queue_name("queue", queue)
    given = {ARGUMENT_OPTIONS[k]: v for k, v in found.items() if k in ARGUMENT_OPTIONS}
    if "ringSize" in found:
        given["ring_size"] = found["ringSize"]
    return SinkOptions(
        path=_path(found),
        queue=queue,
        on_reject=parse_choice("onReject", found.get("onReject", "drop"), ON_REJECT_ACTIONS),
        arguments=validate_arguments(given, camel=True),
        policies=found.get("policies") or None,
        storage=storage_options(options),
    )


def _count(name: str, value: str | None, *, zero_ok: bool = True) -> int | None:
    if value is None:
        return None
    number = parse_limit(name, value)
    if number is None or (number == 0 and not zero_ok):
        raise InvalidOptionError(f"{name} must be a whole number > 0; got {value!r}")
    return number


# A consumer's limits, by their ``QueueTable.lease`` argument and their source option.
CONSUMER_OPTION_NAMES = {
    "consumer": "consumer",
    "lease_period": "leasePeriod",
    "max_messages": "maxMessagesPerTrigger",
    "max_bytes": "maxBytesPerTrigger",
    "max_deliveries": "maxDeliveries",
    "max_cancels": "maxCancels",
}


@dataclass(frozen=True)
class ConsumerLimits:
    """What a consumer asks of one lease, validated once for ``QueueTable.lease`` and the
    streaming source alike."""

    consumer: str
    lease_period: int | None  # microseconds; None = leases never run out
    max_messages: int | None  # None = no limit
    max_bytes: int | None
    max_deliveries: int  # 0 = no limit
    max_cancels: int


def parse_consumer_limits(
    given: Mapping[str, Any], *, camel: bool, zero_messages_ok: bool = False
) -> ConsumerLimits:
    """Validate a consumer's limits, keyed by ``QueueTable.lease`` argument name; errors name
    the source option (``camel``) or the argument. ``zero_messages_ok``: a lease call may ask
    for no message (it then only settles the queue); a micro-batch may not.

    Raises:
        InvalidOptionError: a value is not valid; the message names it and what is.
    """

    def name(key: str) -> str:
        return CONSUMER_OPTION_NAMES[key] if camel else key

    consumer = given.get("consumer", "default")
    if not isinstance(consumer, str) or not consumer or len(consumer) > 255:
        raise InvalidOptionError(
            f"{name('consumer')} must be a name of 1 to 255 characters; got {consumer!r}"
        )
    period = parse_duration_ms(name("lease_period"), given.get("lease_period"))
    if period == 0:
        raise InvalidOptionError(
            f"{name('lease_period')} must be a duration > 0, or unset for none"
        )
    return ConsumerLimits(
        consumer=consumer,
        lease_period=None if period is None else period * 1000,
        max_messages=_count(
            name("max_messages"), given.get("max_messages"), zero_ok=zero_messages_ok
        ),
        max_bytes=_count(name("max_bytes"), given.get("max_bytes"), zero_ok=False),
        max_deliveries=_count(name("max_deliveries"), given.get("max_deliveries")) or 0,
        max_cancels=_count(name("max_cancels"), given.get("max_cancels")) or 0,
    )


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    found = _lookup(options, SOURCE_OPTIONS)
    if "queue" not in found:
        raise InvalidOptionError("option 'queue' is required: the queue to consume")
    by_argument = {a: found[o] for a, o in CONSUMER_OPTION_NAMES.items() if o in found}
    limits = parse_consumer_limits(by_argument, camel=True)
    return SourceOptions(
        path=_path(found),
        queue=check_queue_name("queue", found["queue"]),
        consumer=limits.consumer,
        semantics=parse_choice("semantics", found.get("semantics", SEMANTICS[0]), SEMANTICS),
        lease_period=limits.lease_period,
        max_messages=limits.max_messages,
        max_bytes=limits.max_bytes,
        max_deliveries=limits.max_deliveries,
        max_cancels=limits.max_cancels,
        max_backlog=_count("maxBacklog", found.get("maxBacklog"), zero_ok=False),
        ack_mode=parse_choice("ackMode", found.get("ackMode", ACK_MODES[0]), ACK_MODES),
        filter=found.get("filter") or None,
        read_mode=parse_choice("readMode", found.get("readMode", READ_MODES[0]), READ_MODES),
        storage=storage_options(options),
    )


def parse_browse_options(options: Mapping[str, str]) -> BrowseOptions:
    found = _lookup(options, BROWSE_OPTIONS)
    queue = found.get("queue")
    if queue is not None:
        check_queue_name("queue", queue)
    return BrowseOptions(path=_path(found), queue=queue, storage=storage_options(options))


def check_read_options(options: Mapping[str, str]) -> None:
    """The options of a read or a readStream, checked at ``load()``, where Spark does not
    say which of the two it is: options only a readStream takes are checked as a
    readStream's (:func:`parse_source_options`), others as a read's.

    Raises:
        InvalidOptionError: an option neither takes, or an invalid value.
    """
    stream_only = {name.lower() for name in SOURCE_OPTIONS} - {n.lower() for n in BROWSE_OPTIONS}
    for key in options:
        lower = key.lower()
        if lower in SPARK_OPTIONS or lower.startswith(OPTION_PREFIX):
            continue
        if lower not in stream_only and lower not in {n.lower() for n in BROWSE_OPTIONS}:
            raise InvalidOptionError(
                f"unknown option {key!r}; a read takes {', '.join(BROWSE_OPTIONS)}; a "
                f"readStream takes {', '.join(SOURCE_OPTIONS)}; both take "
                f"{OPTION_PREFIX}<KEY> for the store (docs/STORAGE.md)"
            )
    if any(key.lower() in stream_only for key in options):
        parse_source_options(options)
    else:
        parse_browse_options(options)
