"""Queue arguments and consumer limits as the Python API, the Spark options and the CLI
hand them in, parsed by the one specification (:mod:`spark_queue.model.arguments`) into
:class:`QueueArguments` and :class:`ConsumerLimits`, so one validator serves the stream, the
batch write, ``QueueTable`` and the clients.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from spark_queue.errors import InvalidOptionError
from spark_queue.model.arguments import (
    ARGUMENTS,
    COUNT,
    Argument,
    ExpirationModel,
    Overflow,
    arguments_of,
    parse_queue_name,
    shown,
)

# Re-exported: modules that take these from here (the specification defines them).
from spark_queue.model.arguments import QUEUE_NAME as QUEUE_NAME
from spark_queue.model.arguments import READ_MODES as READ_MODES
from spark_queue.model.arguments import REJECT_POLICIES as REJECT_POLICIES
from spark_queue.model.declarations import attributes_section, check_dataclass

check_queue_name = parse_queue_name


@dataclass(frozen=True)
class QueueArguments:
    """A queue's arguments, as parsed: each field is the queue argument of the same name
    (``docs/ARGUMENTS.md``), durations in milliseconds, and ``None`` for no limit.

    ``QueueTable.declare``, ``alter`` and ``resolve`` take one beside keywords, as every
    argument at once (its defaults included), each value checked as a keyword's:
    ``table.declare("orders", QueueArguments(max_length=10, overflow="ring"))``.
    """

    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: Overflow = "drop-head"
    dead_letter_queue: str | None = None
    reject_threshold: float = 1.0
    expiration: int | None = None
    expiration_model: ExpirationModel = "default"
    max_deliveries: int | None = None
    max_cancels: int | None = None
    exclusive: bool = False
    redelivery_delay: int | None = None
    redelivery_multiplier: float = 1.0
    max_redelivery_delay: int | None = None
    message_groups: bool = False
    duplicate_window: int | None = None
    partitions: int = 1

    def to_dict(self) -> dict[str, Any]:
        """The arguments by name, as stored with the queue; ``partitions`` only where
        above 1, so a queue of one partition is stored as before partitions existed."""
        # Every field is a scalar: no deep copy (dataclasses.asdict's) is needed, and a
        # commit writes each queue's arguments with its state.
        found = {name: getattr(self, name) for name in ARGUMENT_NAMES}
        if self.partitions == 1:
            del found["partitions"]
        return found

    def to_json(self) -> str:
        """The arguments as one JSON object (:meth:`to_dict`'s)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> QueueArguments:
        """The arguments :meth:`to_json` wrote."""
        return cls(**json.loads(text))

    def merged(self, given: Mapping[str, Any]) -> QueueArguments:
        """These arguments with those ``given`` (by name, parsed) in their place."""
        return replace(self, **given)


# Every queue argument is a field but ``ring_size``, a shorthand for two of them.
_FIELDS = [a for a in arguments_of("queue") if a.name != "ring_size"]
check_dataclass(QueueArguments, _FIELDS, "queue")
QueueArguments.__doc__ = f"{(QueueArguments.__doc__ or '').rstrip()}\n{attributes_section(_FIELDS)}"
ARGUMENT_NAMES = tuple(f.name for f in fields(QueueArguments))


def spell(argument: str, surface: str) -> str:
    """``argument`` (snake_case) as ``surface`` spells it: the keyword itself, its Spark
    option (camelCase) or its CLI flag (``--kebab-case``)."""
    spec: Argument | None = ARGUMENTS.get(argument)
    if spec is None or surface == "keyword":
        return argument
    return spec.option if surface == "option" else spec.flag


def option_name(argument: str) -> str:
    """The camelCase option of a snake_case argument, for messages."""
    return spell(argument, "option")


def effective_limit(queue_limit: int | None, consumer_limit: int) -> int:
    """A delivery or cancel limit as it applies: the lower of the queue's (None: none) and
    the consumer's (0: none), so a consumer can tighten its queue's limit, never loosen it.
    0 where neither sets one."""
    limits = [n for n in (queue_limit, consumer_limit) if n]
    return min(limits) if limits else 0


_QUEUE_ARGUMENTS = {a.name: a for a in arguments_of("queue")}


def validate_arguments(given: Mapping[str, Any], *, surface: str = "keyword") -> dict[str, Any]:
    """Validate snake_case queue arguments; returns the parsed values of those given.

    ``ring_size=N`` is shorthand for ``max_length=N, overflow="ring"``. Messages spell each
    argument as ``surface`` does (:func:`spell`). The given arguments alone are checked
    together here; the queue's effective arguments, after any merge with its stored ones
    or a policy's, are checked by :func:`check_effective`.
    """
    queue_arguments = _QUEUE_ARGUMENTS
    for name in given:
        if name not in queue_arguments:
            valid = ", ".join(spell(n, surface) for n in queue_arguments)
            raise InvalidOptionError(
                f"unknown queue argument {spell(name, surface)!r}; valid: {valid}"
            )
    quoted = surface != "flag"  # a command line's values stay out of its messages

    def given_as(name: str) -> str:
        return f"{spell(name, surface)}={given[name]!r}" if quoted else spell(name, surface)

    parsed = {
        name: queue_arguments[name].parse(value, spell(name, surface), quoted=quoted)
        for name, value in given.items()
    }
    if "ring_size" in parsed:
        size = parsed.pop("ring_size")
        ring = spell("ring_size", surface)
        if parsed.get("overflow", "ring") != "ring":
            raise InvalidOptionError(
                f"{ring} means {spell('overflow', surface)}=ring; it cannot be combined with "
                f"{given_as('overflow')}"
            )
        if parsed.get("max_length", size) != size:
            raise InvalidOptionError(
                f"{given_as('ring_size')} and {given_as('max_length')} disagree"
            )
        if size is not None:
            parsed["max_length"], parsed["overflow"] = size, "ring"
    check_effective(parsed, surface)
    return parsed


def given_arguments(
    arguments: QueueArguments | None, keywords: Mapping[str, Any]
) -> dict[str, Any]:
    """The validated queue arguments of a call that takes a :class:`QueueArguments` beside
    keywords (``QueueTable.declare``, ``alter``, ``resolve``): the object gives every
    argument, its defaults included; keywords give those named. Both may name an argument
    only with the same value.

    Raises:
        InvalidOptionError: ``arguments`` is not a QueueArguments; a value is invalid (the
            object's are checked as keywords are); the object and a keyword give an argument
            differently. The message names the argument.
    """
    given = validate_arguments(keywords)
    if arguments is None:
        return given
    if not isinstance(arguments, QueueArguments):
        raise InvalidOptionError(
            "arguments must be a QueueArguments (or give the queue arguments as keywords); "
            f"got {shown(arguments)} ({type(arguments).__name__})"
        )
    whole = validate_arguments(arguments.to_dict())
    for name, value in given.items():
        if whole[name] != value:
            keyword = (
                f"ring_size={keywords['ring_size']!r}"
                if "ring_size" in keywords and name in ("max_length", "overflow")
                else f"{name}={keywords[name]!r}"
            )
            raise InvalidOptionError(
                f"{name} is given twice, differently: {name}={whole[name]!r} by the "
                f"QueueArguments, {keyword} as a keyword"
            )
    return {**whole, **given}


RING_COUNT_ONLY = "overflow=ring bounds the message count only"


def check_effective(
    arguments: QueueArguments | Mapping[str, Any], surface: str = "keyword", queue: str = ""
) -> None:
    """The one check of a queue's arguments taken together, run on what was given, on
    what ``declare`` and ``alter`` end with after merging the queue's stored arguments, and
    on what a policy resolves (which names the origin of each value itself).

    Raises:
        InvalidOptionError: a ring with a byte limit; the message names both arguments.
    """
    values = arguments if isinstance(arguments, Mapping) else arguments.to_dict()
    whose = f"queue {queue!r}: " if queue else ""
    # A partition's dead letters would go to a queue of its own table, which no reader of
    # the queue's table sees.
    if (values.get("partitions") or 1) > 1 and values.get("dead_letter_queue") is not None:
        raise InvalidOptionError(
            f"{whose}a queue of {spell('partitions', surface)}={values['partitions']} takes no "
            f"{spell('dead_letter_queue', surface)}: dead-lettering is not partitioned yet"
        )
    # A ring bounds the count only (it replaces the oldest message, one for one), so it
    # takes no byte limit.
    if values.get("overflow") == "ring" and values.get("max_length_bytes") is not None:
        raise InvalidOptionError(
            f"{whose}{RING_COUNT_ONLY}; {spell('max_length_bytes', surface)}="
            f"{values['max_length_bytes']} needs {spell('overflow', surface)}=drop-head or a "
            "reject policy"
        )


# A consumer's limits: the arguments of ``QueueTable.lease`` and the source's options, but
# the filter, which the lease compiles on the table it reads.
CONSUMER_LIMITS = tuple(a.name for a in arguments_of("lease") if a.name != "filter")


@dataclass(frozen=True)
class ConsumerLimits:
    """What a consumer asks of one lease, validated once for ``QueueTable.lease`` and the
    streaming source alike, and handed whole to the lease planner. Each field is the
    argument of its name as a consumer's limits hold it (:meth:`Argument.held`): its
    sentinel where it sets none, a duration in microseconds."""

    consumer: str
    lease_period_us: int | None
    max_messages: int | None
    max_bytes: int | None
    max_deliveries: int
    max_cancels: int


check_dataclass(ConsumerLimits, [ARGUMENTS[name] for name in CONSUMER_LIMITS], "lease", held=True)


def parse_consumer_limits(
    given: Mapping[str, Any], *, surface: str, zero_messages_ok: bool = False
) -> ConsumerLimits:
    """Validate a consumer's limits, keyed by ``QueueTable.lease`` argument name; errors
    spell each as ``surface`` does (:func:`spell`); one not given is its default.
    ``zero_messages_ok``: a lease call may ask for no message (it then only settles the
    queue); a micro-batch may not.

    Raises:
        InvalidOptionError: a value is not valid; the message names it and what is.
    """
    # A lease's 0 is parsed as a count from 0 (a bool or 0.0 is not 0); others from 1.
    no_messages = (
        zero_messages_ok
        and given.get("max_messages") is not None
        and COUNT.parse(spell("max_messages", surface), given["max_messages"]) == 0
    )
    held = {}
    for field in fields(ConsumerLimits):
        argument = _HELD_LIMITS[field.name]
        name = argument.name
        if name not in given:
            value = argument.default
        elif name == "max_messages" and no_messages:
            value = 0
        else:
            value = argument.parse(given[name], spell(name, surface))
        held[field.name] = argument.held(value)
    return ConsumerLimits(**held)


_HELD_LIMITS = {ARGUMENTS[name].held_name: ARGUMENTS[name] for name in CONSUMER_LIMITS}
