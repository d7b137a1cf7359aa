"""The one specification of every argument, and one parser per kind of value.

Every surface (Spark options, ``QueueTable`` keywords, the consumer and publisher, CLI flags,
the policies file) reads its arguments here: each is defined once, with its kind, unit,
default, scopes, policy keys and doc line, and each surface's spelling is derived from its
snake_case name (camelCase options, ``--kebab-case`` flags, ``default-kebab-case`` policy
keys). A kind has one parser and one message, which names the argument as the caller spelled
it and the values it takes; every parser raises :class:`InvalidOptionError`.

The rules every kind keeps: a bool is never a number; a fraction is never a whole number;
text such as ``"1_000"`` or ``"5.0"`` is not a count; whole numbers fit an int64; durations
are in one grammar (a whole number of milliseconds, or a number with a unit: ``30s``,
``5 minutes``, ``1 week``) and at most :data:`MAX_DURATION_MS`, so that now plus any duration
is a valid timestamp. Out-of-range values are refused, never clamped.

``python -m spark_queue.arguments --markdown SURFACE`` prints a surface's table; the docs'
tables between ``<!-- arguments:SURFACE -->`` and ``<!-- end -->`` are these, and
``--write`` regenerates them in place.
"""

from __future__ import annotations

import datetime as dt
import math
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np
import pyarrow as pa

from spark_queue.errors import InvalidOptionError

INT64_MAX = 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# Durations end in a timestamp (a lease's expiry, a message's), in microseconds since the
# epoch: 1000 years keeps now + any duration below year 9999, the end of Python's datetime
# and far inside an int64 of microseconds.
MAX_DURATION_DAYS = 365_000
MAX_DURATION_MS = MAX_DURATION_DAYS * 86_400_000
SHOWN_CHARS = 60  # a value quoted in a message is cut to this many characters

_WHOLE = re.compile(r"^\s*[+-]?0*[0-9]{1,30}\s*$")  # beyond 30 digits: past any int64
_DECIMAL = re.compile(r"^\s*[+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*$")
_DURATION = re.compile(r"^\s*0*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([a-z]*)\s*$")
_UNIT_MS = {
    "ms": 1,
    "msec": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "secs": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "mins": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hr": 3_600_000,
    "hrs": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
    "w": 604_800_000,
    "week": 604_800_000,
    "weeks": 604_800_000,
}
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,255}$")
CONSUMER_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,255}$")


def shown(value: Any) -> str:
    """A value as a message quotes it: its repr, cut to :data:`SHOWN_CHARS`."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool | np.bool_)


def _whole(value: Any) -> int | None:
    """The whole number ``value`` is (an int, a numpy integer, or decimal digits), else None.
    A bool, a float (even 5.0) and text like ``"1_000"`` or ``"5.0"`` are not."""
    if _is_bool(value) or isinstance(value, float | np.floating):
        return None
    if isinstance(value, str):
        return int(value) if _WHOLE.match(value) else None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _number(value: Any) -> float | None:
    """The finite real number ``value`` is (int, float, decimal text), else None."""
    if _is_bool(value):
        return None
    if isinstance(value, str):
        number = float(value) if _DECIMAL.match(value) else math.nan
    elif isinstance(value, int | float | np.integer | np.floating):
        number = float(value)
    else:
        return None
    return number if math.isfinite(number) else None


# -- kinds --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A kind of value: what it accepts (:attr:`valid`, quoted by its one message) and its
    parser. Subclasses define :meth:`convert`, returning None where the value is not one."""

    name = "value"

    @property
    def valid(self) -> str:
        raise NotImplementedError

    def convert(self, value: Any) -> Any:
        raise NotImplementedError

    def parse(self, label: str, value: Any) -> Any:
        """The parsed value, or :class:`InvalidOptionError` naming ``label`` and the valid
        values."""
        parsed = self.convert(value)
        if parsed is _INVALID:
            raise InvalidOptionError(f"{label} must be {self.valid}; got {shown(value)}")
        return parsed


_INVALID = object()


@dataclass(frozen=True)
class Count(Kind):
    """A whole number from ``minimum`` to ``maximum`` (an int64 unless narrower)."""

    minimum: int = 0
    maximum: int = INT64_MAX
    name = "count"

    @property
    def valid(self) -> str:
        if self.maximum == INT64_MAX:
            return f"a whole number >= {self.minimum}"
        return f"a whole number from {self.minimum} to {self.maximum}"

    def convert(self, value: Any) -> Any:
        number = _whole(value)
        if number is None or not self.minimum <= number <= self.maximum:
            return _INVALID
        return number


@dataclass(frozen=True)
class Limit(Kind):
    """A whole number >= 0 (an int64), or ``None`` / one of ``none`` for no limit (parsed as
    None). With ``zero_is_none`` 0 also means no limit, and the least limit is 1."""

    zero_is_none: bool = False
    name = "limit"

    @property
    def valid(self) -> str:
        if self.zero_is_none:
            return "a whole number > 0, or 0 or -1 for no limit"
        return "a whole number >= 0, or -1 for no limit"

    def convert(self, value: Any) -> Any:
        if value is None:
            return None
        number = _whole(value)
        if number is None or not -1 <= number <= INT64_MAX:
            return _INVALID
        if number == -1 or (number == 0 and self.zero_is_none):
            return None
        return number


@dataclass(frozen=True)
class Duration(Kind):
    """A duration in milliseconds: a whole number (milliseconds), a ``timedelta``, or text,
    a number with a unit (``250ms``, ``1.5s``, ``5 minutes``, ``2h``, ``1 day``, ``1 week``);
    at most :data:`MAX_DURATION_MS` and at least ``minimum_ms``. With ``zero_is_none``, 0 and
    ``None`` parse as None (no such duration)."""

    minimum_ms: int = 0
    zero_is_none: bool = False
    optional: bool = False  # None is accepted, and parsed as None
    name = "duration"

    @property
    def valid(self) -> str:
        low = "> 0" if self.minimum_ms == 1 else f">= {self.minimum_ms} ms"
        return (
            f"a duration {low} and at most {MAX_DURATION_DAYS} days: a whole number of "
            "milliseconds, or a number with a unit (ms, s, m, h, d, w), e.g. '30s', "
            "'5 minutes', '1 week'" + (" (0: none)" if self.zero_is_none else "")
        )

    def convert(self, value: Any) -> Any:
        if value is None and (self.optional or self.zero_is_none):
            return None
        millis = duration_ms(value)
        if millis is None or not self.minimum_ms <= millis <= MAX_DURATION_MS:
            return _INVALID
        return None if millis == 0 and self.zero_is_none else millis


def duration_ms(value: Any) -> int | None:
    """Milliseconds of a duration in the one grammar (see :class:`Duration`), unbounded, or
    None if ``value`` is not one (a bool, a float, a fraction of a millisecond)."""
    if isinstance(value, dt.timedelta):
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        return micros // 1000 if micros % 1000 == 0 and micros >= 0 else None
    if not isinstance(value, str):
        number = _whole(value)
        return number if number is not None and number >= 0 else None
    match = _DURATION.match(value.lower())
    if not match:
        return None
    amount, unit = match.groups()
    if not unit:
        return int(amount) if amount.isdigit() else None
    if unit not in _UNIT_MS:
        return None
    try:
        millis = Decimal(amount) * _UNIT_MS[unit]
    except InvalidOperation:
        return None
    return int(millis) if millis == millis.to_integral_value() else None


@dataclass(frozen=True)
class Fraction(Kind):
    """A number in (0, 1]."""

    name = "fraction"

    @property
    def valid(self) -> str:
        return "a number above 0 and at most 1"

    def convert(self, value: Any) -> Any:
        number = _number(value)
        return number if number is not None and 0.0 < number <= 1.0 else _INVALID


@dataclass(frozen=True)
class Multiplier(Kind):
    """A finite number >= 1."""

    name = "multiplier"

    @property
    def valid(self) -> str:
        return "a finite number >= 1"

    def convert(self, value: Any) -> Any:
        number = _number(value)
        return number if number is not None and number >= 1.0 else _INVALID


@dataclass(frozen=True)
class Choice(Kind):
    """One of ``values`` (text, any case, surrounding blanks ignored)."""

    values: tuple[str, ...] = ()
    name = "choice"

    @property
    def valid(self) -> str:
        return "one of " + ", ".join(self.values)

    def convert(self, value: Any) -> Any:
        if not isinstance(value, str) or value.strip().lower() not in self.values:
            return _INVALID
        return value.strip().lower()


@dataclass(frozen=True)
class Bool(Kind):
    """``True``/``False``, or the text ``true``/``false`` (any case); never a number."""

    name = "bool"

    @property
    def valid(self) -> str:
        return "true or false"

    def convert(self, value: Any) -> Any:
        if _is_bool(value):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        return _INVALID


@dataclass(frozen=True)
class Name(Kind):
    """A name matching ``pattern`` (described by ``rule``). With ``optional``, ``None`` and
    ``""`` parse as None (not set)."""

    pattern: re.Pattern[str] = QUEUE_NAME
    rule: str = "a queue name of 1 to 255 characters from A-Z a-z 0-9 _ . -"
    optional: bool = False
    name = "name"

    @property
    def valid(self) -> str:
        return self.rule + (", or empty for none" if self.optional else "")

    def convert(self, value: Any) -> Any:
        if self.optional and value in (None, ""):
            return None
        if not isinstance(value, str) or not self.pattern.match(value):
            return _INVALID
        return value


@dataclass(frozen=True)
class Text(Kind):
    """Non-empty text (a path, an SQL predicate). With ``optional``, None and "" are None."""

    optional: bool = True
    name = "text"

    @property
    def valid(self) -> str:
        return "non-empty text"

    def convert(self, value: Any) -> Any:
        if self.optional and value in (None, ""):
            return None
        return value if isinstance(value, str) and value.strip() else _INVALID


@dataclass(frozen=True)
class Seq(Count):
    """A message's sequence number: a whole number from 0, an int64."""

    name = "seq"

    @property
    def valid(self) -> str:
        return "a seq: a whole number from 0 to 2**63-1"


@dataclass(frozen=True)
class Priority(Count):
    """A message priority: a whole number that fits an int32."""

    minimum: int = INT32_MIN
    maximum: int = INT32_MAX
    name = "priority"

    @property
    def valid(self) -> str:
        return "a priority: a whole number from -2**31 to 2**31-1"


COUNT = Count()
POSITIVE = Count(minimum=1)
SEQ = Seq()
PRIORITY = Priority()
LIMIT = Limit()
DELIVERY_LIMIT = Limit(zero_is_none=True)
FRACTION = Fraction()
MULTIPLIER = Multiplier()
BOOL = Bool()
QUEUE = Name()
QUEUE_OPTIONAL = Name(optional=True)
CONSUMER = Name(pattern=CONSUMER_NAME, rule="a name of 1 to 255 characters, no control characters")


# -- the kind parsers: stable names other modules call ------------------------------------


def parse_count(label: str, value: Any, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    """A whole number from ``minimum`` to ``maximum`` (int, numpy integer or digits)."""
    return Count(minimum, maximum).parse(label, value)


def parse_seq(label: str, value: Any) -> int:
    """A seq: a whole number from 0 to 2**63-1."""
    return SEQ.parse(label, value)


def parse_priority(label: str, value: Any) -> int:
    """A priority: a whole number in the int32 range."""
    return PRIORITY.parse(label, value)


def parse_seqs(label: str, value: Any) -> np.ndarray:
    """Seqs to act on (``ack``'s, ``cancel``'s, ...), as int64: a list, tuple, range or set
    of seqs (:func:`parse_seq`), a numpy integer array, or a pyarrow integer array (a leased
    table's ``seq`` column)."""
    if isinstance(value, pa.ChunkedArray | pa.Array):
        if not pa.types.is_integer(value.type) or value.null_count:
            raise InvalidOptionError(
                f"{label} must be a list of seqs, whole numbers from 0 to 2**63-1; got an "
                f"array of {value.type}" + (" with nulls" if value.null_count else "")
            )
        value = value.to_numpy()
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu" and value.ndim == 1:
        if len(value) and not (value.min() >= 0 and value.max() <= INT64_MAX):
            bad = value[(value < 0) | (value > INT64_MAX)][0]
            raise InvalidOptionError(f"{label} must be a list of seqs; {SEQ.valid}, not {bad}")
        return value.astype(np.int64, copy=False)
    if not isinstance(value, list | tuple | range | set | frozenset):
        raise InvalidOptionError(
            f"{label} must be a list of seqs, whole numbers from 0 to 2**63-1; got "
            f"{shown(value)} ({type(value).__name__})"
        )
    if all(type(seq) is int for seq in value):  # the usual list, checked by numpy at once
        try:
            seqs = np.fromiter(value, np.int64, len(value))
        except OverflowError:
            seqs = None  # beyond int64: found and named below
        if seqs is not None and (not len(seqs) or seqs.min() >= 0):
            return seqs
    return np.fromiter(
        (SEQ.parse(f"{label}[{at}]", seq) for at, seq in enumerate(value)), np.int64, len(value)
    )


def parse_limit(label: str, value: Any) -> int | None:
    """A limit: a whole number >= 0, or -1 / None for none (parsed as None)."""
    return LIMIT.parse(label, value)


def parse_delivery_limit(label: str, value: Any) -> int | None:
    """A delivery or cancel limit: a whole number > 0; 0, -1 or None for none (None)."""
    return DELIVERY_LIMIT.parse(label, value)


def parse_duration_ms(
    label: str, value: Any, minimum_ms: int = 0, zero_is_none: bool = False
) -> int | None:
    """A duration in milliseconds (:class:`Duration`); ``None`` only if ``zero_is_none``."""
    return Duration(minimum_ms, zero_is_none).parse(label, value)


def parse_fraction(label: str, value: Any) -> float:
    """A number in (0, 1]."""
    return FRACTION.parse(label, value)


def parse_multiplier(label: str, value: Any) -> float:
    """A finite number >= 1."""
    return MULTIPLIER.parse(label, value)


def parse_choice(label: str, value: Any, choices: tuple[str, ...]) -> str:
    """One of ``choices``, any case."""
    return Choice(choices).parse(label, value)


def parse_bool(label: str, value: Any) -> bool:
    """A bool, or ``true``/``false`` text."""
    return BOOL.parse(label, value)


def parse_queue_name(label: str, value: Any) -> str:
    """A queue name: 1 to 255 characters from A-Z a-z 0-9 _ . -."""
    return QUEUE.parse(label, value)


def parse_consumer_name(label: str, value: Any) -> str:
    """A consumer name: 1 to 255 characters, no control characters."""
    return CONSUMER.parse(label, value)


# -- the specification --------------------------------------------------------------------

OVERFLOW_POLICIES = ("drop-head", "ring", "reject-publish", "reject-publish-dlx")
REJECT_POLICIES = ("reject-publish", "reject-publish-dlx")
ON_REJECT_ACTIONS = ("drop", "fail")
EXPIRATION_MODELS = ("default", "queue", "earliest", "latest")
SEMANTICS = ("at-least-once", "at-most-once")
ACK_MODES = ("commit", "manual")
READ_MODES = ("executors", "driver")

# Where an argument applies. ``queue``: a queue argument, stored with the queue (declare,
# alter, a sink's options, CLI flags, policies); ``sink``/``source``: an option of a Spark
# write/read; ``lease``: a consumer's limits of ``QueueTable.lease`` and the source;
# ``consumer``/``publisher``: a keyword of ``QueueTable.consumer()`` / ``publisher()``;
# ``publish``: a keyword of ``QueueTable.publish``; ``browse``: an option of a batch read.
SCOPES = ("queue", "sink", "source", "browse", "lease", "consumer", "publisher", "publish")


def camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(word.capitalize() for word in rest)


@dataclass(frozen=True)
class Argument:
    """One argument, once: its snake_case name, kind, default (as parsed), unit, scopes,
    policy keys (``default-*`` and a cap), and doc line."""

    name: str
    kind: Kind
    doc: str
    scopes: tuple[str, ...]
    default: Any = None
    unit: str = ""
    policy_default: bool = False  # has a ``default-<kebab>`` policy key
    policy_cap: bool = False  # has a ``<kebab>`` cap key
    spark_option: str | None = None  # a Spark option spelt other than camel(name)

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

    def parse(self, value: Any, label: str | None = None) -> Any:
        """The parsed value; errors name ``label`` (the caller's spelling) or the name.
        ``None`` is the argument not given where its default is None (no such value)."""
        if value is None and self.default is None:
            return None
        return self.kind.parse(label or self.name, value)


def _queue(name: str, kind: Kind, doc: str, default: Any = None, **more: Any) -> Argument:
    scopes = more.pop("scopes", ("queue", "sink"))
    return Argument(name, kind, doc, scopes, default, policy_default=True, **more)


SPECIFICATION: tuple[Argument, ...] = (
    Argument(
        "path",
        Text(),
        "The queue table: a local path or a URI (s3://, abfss://, gs://, file://). Required.",
        ("sink", "source", "browse"),
    ),
    Argument(
        "queue",
        QUEUE_OPTIONAL,
        "The queue (sink: else each row's queue column; source: required; browse: else all).",
        ("sink", "source", "browse"),
    ),
    Argument(
        "policies",
        Text(),
        "A policies file (docs/POLICIES.md); unset: $SPARK_QUEUE_POLICIES.",
        ("sink",),
    ),
    _queue(
        "max_length",
        LIMIT,
        "Ready messages kept at most; the overflow policy applies beyond (-1: no limit).",
        unit="messages",
        policy_cap=True,
    ),
    _queue(
        "max_length_bytes",
        LIMIT,
        "Bytes of ready message bodies kept at most (-1: no limit). Not with overflow=ring.",
        unit="bytes",
        policy_cap=True,
    ),
    _queue(
        "overflow",
        Choice(OVERFLOW_POLICIES),
        "What a full queue does: drop its oldest messages, replace them one for one (ring), "
        "or refuse new ones.",
        "drop-head",
    ),
    Argument(
        "ring_size",
        COUNT,
        "Shorthand for maxLength=N with overflow=ring.",
        ("queue", "sink"),
        unit="messages",
        policy_default=True,
    ),
    _queue(
        "dead_letter_queue",
        QUEUE_OPTIONAL,
        "The queue that receives this queue's dropped, expired and dead messages.",
    ),
    _queue(
        "reject_threshold",
        FRACTION,
        "Under a reject policy, refuse publishes once the queue is this full.",
        1.0,
    ),
    _queue(
        "expiration",
        Duration(optional=True),
        "How long a message stays ready before it expires (unset: never).",
        unit="ms",
    ),
    _queue(
        "expiration_model",
        Choice(EXPIRATION_MODELS),
        "How a message's own expires_at and the queue's expiration combine.",
        "default",
    ),
    _queue(
        "max_deliveries",
        DELIVERY_LIMIT,
        "Deliveries after which a returned message is dead (0 or -1: no limit).",
        unit="deliveries",
        policy_cap=True,
        scopes=("queue", "sink", "source", "lease", "consumer"),
    ),
    _queue(
        "max_cancels",
        DELIVERY_LIMIT,
        "Cancels after which a message is dead (0 or -1: no limit).",
        unit="cancels",
        policy_cap=True,
        scopes=("queue", "sink", "source", "lease", "consumer"),
    ),
    _queue("exclusive", BOOL, "One consumer name holds the queue at a time.", False),
    _queue(
        "redelivery_delay",
        Duration(zero_is_none=True),
        "A returned message waits this long before it is ready again (0: none).",
        unit="ms",
    ),
    _queue(
        "redelivery_multiplier",
        MULTIPLIER,
        "Each further redelivery waits this many times longer.",
        1.0,
    ),
    _queue(
        "max_redelivery_delay",
        Duration(zero_is_none=True),
        "The longest redelivery wait (unset: 10 x redeliveryDelay).",
        unit="ms",
    ),
    _queue(
        "message_groups",
        BOOL,
        "Messages with one key are leased to one consumer at a time, in order.",
        False,
    ),
    _queue(
        "duplicate_window",
        Duration(zero_is_none=True),
        "A message_id seen within this window is not enqueued again (0: none).",
        unit="ms",
        policy_cap=True,
    ),
    Argument(
        "on_reject",
        Choice(ON_REJECT_ACTIONS),
        "When a reject policy refuses messages: drop them, or fail the whole batch.",
        ("sink", "publish", "publisher"),
        "drop",
    ),
    Argument(
        "consumer",
        CONSUMER,
        "The consumer name: leases, acknowledgements and exclusivity are per name.",
        ("source", "lease"),
        "default",
    ),
    Argument(
        "lease_period",
        Duration(minimum_ms=1, optional=True),
        "How long a lease lasts (source and lease: unset, leases never run out).",
        ("source", "lease", "consumer"),
        unit="ms",
    ),
    Argument(
        "max_messages",
        POSITIVE,
        "Messages leased at most per micro-batch / lease call.",
        ("source", "lease"),
        unit="messages",
        spark_option="maxMessagesPerTrigger",
    ),
    Argument(
        "max_bytes",
        POSITIVE,
        "Bytes of bodies leased at most per micro-batch / lease call.",
        ("source", "lease"),
        unit="bytes",
        spark_option="maxBytesPerTrigger",
    ),
    Argument(
        "max_backlog",
        POSITIVE,
        "Messages leased and not yet committed at most, across micro-batches.",
        ("source",),
        unit="messages",
    ),
    Argument(
        "semantics",
        Choice(SEMANTICS),
        "at-least-once: ack after the batch commits; at-most-once: ack when leased.",
        ("source",),
        "at-least-once",
    ),
    Argument(
        "ack_mode",
        Choice(ACK_MODES),
        "commit: ack when the micro-batch commits; manual: the application acks.",
        ("source",),
        "commit",
    ),
    Argument(
        "read_mode",
        Choice(READ_MODES),
        "Where a micro-batch's messages are read: in the executors, or on the driver.",
        ("source",),
        "executors",
    ),
    Argument(
        "filter",
        Text(),
        "An SQL predicate over the message columns: only matching messages are leased.",
        ("source", "lease", "consumer"),
    ),
    Argument(
        "max_prefetch",
        POSITIVE,
        "Messages prefetched and in hand at most.",
        ("consumer",),
        1000,
        unit="messages",
    ),
    Argument(
        "ack_batch",
        POSITIVE,
        "Acknowledgements flushed once this many are pending.",
        ("consumer",),
        1000,
        unit="messages",
    ),
    Argument(
        "ack_interval_ms",
        Duration(minimum_ms=1, optional=True),
        "Acknowledgements flushed once the oldest waited this long (unset: 1 s, or a "
        "quarter of the lease period where shorter; below half of it).",
        ("consumer",),
        unit="ms",
    ),
    Argument(
        "max_poll_interval_ms",
        Duration(minimum_ms=1, optional=True),
        "An idle consumer checks for a new table version at least this often (unset: 25 ms "
        "on a local disk, 100 ms on an object store).",
        ("consumer",),
        unit="ms",
    ),
    Argument(
        "idle_lease_interval_ms",
        Duration(minimum_ms=1),
        "An idle consumer leases again at least this often.",
        ("consumer",),
        1000,
        unit="ms",
    ),
    Argument(
        "linger_ms",
        Duration(),
        "A publisher's message waits at most this long for others to share its commit.",
        ("publisher",),
        5,
        unit="ms",
    ),
    Argument(
        "max_batch",
        POSITIVE,
        "Messages published in one commit at most.",
        ("publisher",),
        1000,
        unit="messages",
    ),
)
ARGUMENTS: dict[str, Argument] = {a.name: a for a in SPECIFICATION}


def arguments_of(scope: str) -> tuple[Argument, ...]:
    return tuple(a for a in SPECIFICATION if scope in a.scopes)


def by_option(scope: str) -> dict[str, Argument]:
    """A scope's arguments by their Spark option, lower-cased (Spark's keys are)."""
    return {a.option.lower(): a for a in arguments_of(scope)}


def by_policy_key() -> dict[str, Argument]:
    return {key: a for a in SPECIFICATION for key in a.policy_keys}


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
