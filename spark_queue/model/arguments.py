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

The docs' arguments page, ``docs/ARGUMENTS.md``, is generated from here
(:mod:`spark_queue.argument_docs`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Generic, Literal, SupportsIndex, TypeVar, cast, get_args, overload

import numpy as np
import pyarrow as pa

from spark_queue.errors import InvalidOptionError
from spark_queue.model.deprecations import warn_deprecated

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
# Not "." or ".." (nor any name of dots alone): a name is never a path step.
QUEUE_NAME = re.compile(r"(?!\.+\Z)[A-Za-z0-9_.\-]{1,255}")
CONSUMER_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,255}")


def shown(value: object) -> str:
    """A value as a message quotes it: its repr, cut to :data:`SHOWN_CHARS`."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _is_bool(value: object) -> bool:
    return isinstance(value, bool | np.bool_)


def _whole(value: object) -> int | None:
    """The whole number ``value`` is (an int, a numpy integer, or decimal digits), else None.
    A bool, a float (even 5.0) and text like ``"1_000"`` or ``"5.0"`` are not."""
    if _is_bool(value) or isinstance(value, float | np.floating):
        return None
    if isinstance(value, str):
        return int(value) if _WHOLE.match(value) else None
    try:  # what has no __index__ raises TypeError
        return operator.index(cast(SupportsIndex, value))
    except TypeError:
        return None


def _number(value: object) -> float | None:
    """The finite real number ``value`` is (int, float, decimal text), else None."""
    if _is_bool(value):
        return None
    if isinstance(value, str):
        number = float(value) if _DECIMAL.match(value) else math.nan
    elif isinstance(value, int | float | np.integer | np.floating):
        try:
            number = float(value)
        except OverflowError:  # an int beyond a float's range
            return None
    else:
        return None
    return number if math.isfinite(number) else None


# -- kinds --------------------------------------------------------------------------------


Parsed = TypeVar("Parsed")


class _Invalid:
    """What :meth:`Kind.convert` returns for a value that is not of its kind."""


_INVALID = _Invalid()


@dataclass(frozen=True)
class Kind(Generic[Parsed]):
    """A kind of value: what it accepts (:attr:`valid`, quoted by its one message) and its
    parser, whose values are of type ``Parsed``. Subclasses define :meth:`convert`,
    returning :data:`_INVALID` where the value is not one."""

    name = "value"

    @property
    def valid(self) -> str:
        raise NotImplementedError

    @property
    def doc_valid(self) -> str:
        """The valid values as the docs' tables show them (Markdown, short)."""
        return self.valid

    def convert(self, value: object) -> Parsed | _Invalid:
        raise NotImplementedError

    def old_spelling(self, value: object) -> bool:
        """Whether ``value`` is an old spelling of "none" (``-1`` for no limit), taken for
        one release with a warning."""
        return False

    def parse(self, label: str, value: object, *, quoted: bool = True) -> Parsed:
        """The parsed value, or :class:`InvalidOptionError` naming ``label`` and the valid
        values, and quoting the value unless ``quoted`` is unset (a command line's flags:
        a shell's history and logs keep what a message prints)."""
        parsed = self.convert(value)
        if isinstance(parsed, _Invalid):
            got = f"; got {shown(value)}" if quoted else ""
            raise InvalidOptionError(f"{label} must be {self.valid}{got}")
        if self.old_spelling(value):
            warn_deprecated(
                f"{label}={shown(value)} for none is deprecated: use None (as text: none)"
            )
        return parsed


@dataclass(frozen=True)
class Count(Kind[int]):
    """A whole number from ``minimum`` to ``maximum`` (an int64 unless narrower)."""

    minimum: int = 0
    maximum: int = INT64_MAX
    name = "count"

    @property
    def valid(self) -> str:
        if self.maximum == INT64_MAX:
            return f"a whole number >= {self.minimum}"
        return f"a whole number from {self.minimum} to {self.maximum}"

    @property
    def doc_valid(self) -> str:
        return self.valid.removeprefix("a ")

    def convert(self, value: object) -> int | _Invalid:
        number = _whole(value)
        if number is None or not self.minimum <= number <= self.maximum:
            return _INVALID
        return number


@dataclass(frozen=True)
class Limit(Kind[int | None]):
    """A whole number >= 0 (an int64), or ``None`` (the text ``none``, any case) for no
    limit, parsed as None. With ``zero_is_none`` the least limit is 1. The old spellings of
    no limit, -1 (and 0 with ``zero_is_none``), are taken for one release with a warning."""

    zero_is_none: bool = False
    name = "limit"

    @property
    def valid(self) -> str:
        low = "> 0" if self.zero_is_none else ">= 0"
        return f"a whole number {low}, or None (as text: none) for no limit"

    @property
    def doc_valid(self) -> str:
        return f"whole number {'> 0' if self.zero_is_none else '>= 0'}, or `none`"

    def convert(self, value: object) -> int | _Invalid | None:
        if value is None or _is_none_text(value):
            return None
        number = _whole(value)
        if number is None or not -1 <= number <= INT64_MAX:
            return _INVALID
        return None if self.old_spelling(value) else number

    def old_spelling(self, value: object) -> bool:
        number = None if value is None or _is_none_text(value) else _whole(value)
        return number == -1 or (number == 0 and self.zero_is_none)


def _is_none_text(value: object) -> bool:
    """The text spelling of None (no limit, unset): ``none``, any case."""
    return isinstance(value, str) and value.strip().lower() == "none"


@dataclass(frozen=True)
class Duration(Kind[int | None]):
    """A duration in milliseconds: a whole number (milliseconds), a ``timedelta``, or text,
    a number with a unit (``250ms``, ``1.5s``, ``5 minutes``, ``2h``, ``1 day``, ``1 week``);
    at most :data:`MAX_DURATION_MS` and at least ``minimum_ms``. With ``zero_is_none``, 0 and
    ``None`` parse as None (no such duration: none is 0 long); with ``optional``, ``None``.
    Where None is taken, so is the text ``none``. ``zero_is_old_none``: 0 is an old spelling
    of None that means something else (unset), taken for one release with a warning."""

    minimum_ms: int = 0
    zero_is_none: bool = False
    optional: bool = False  # None is accepted, and parsed as None
    zero_is_old_none: bool = False
    name = "duration"

    @property
    def valid(self) -> str:
        low = "> 0" if self.minimum_ms == 1 else f">= {self.minimum_ms} ms"
        none = ", or None (as text: none)" if self.optional or self.zero_is_none else ""
        zero = " (0: none)" if self.zero_is_none and not self.zero_is_old_none else ""
        return (
            f"a duration {low} and at most {MAX_DURATION_DAYS} days: a whole number of "
            "milliseconds, or a number with a unit (ms, s, m, h, d, w), e.g. '30s', "
            f"'5 minutes', '1 week'{zero}{none}"
        )

    @property
    def doc_valid(self) -> str:
        low = " > 0" if self.minimum_ms else ""
        zero = "; 0: none" if self.zero_is_none and not self.zero_is_old_none else ""
        none = "; or `none`" if self.optional or self.zero_is_none else ""
        return f"a duration{low}: `30s`, `5 minutes`, `1 week`, or milliseconds{zero}{none}"

    def convert(self, value: object) -> int | _Invalid | None:
        if (value is None or _is_none_text(value)) and (self.optional or self.zero_is_none):
            return None
        millis = duration_ms(value)
        if millis is None or not self.minimum_ms <= millis <= MAX_DURATION_MS:
            return _INVALID
        return None if millis == 0 and self.zero_is_none else millis

    def old_spelling(self, value: object) -> bool:
        return self.zero_is_old_none and duration_ms(value) == 0


def duration_ms(value: object) -> int | None:
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
class Fraction(Kind[float]):
    """A number in (0, 1]."""

    name = "fraction"

    @property
    def valid(self) -> str:
        return "a number above 0 and at most 1"

    @property
    def doc_valid(self) -> str:
        return "fraction in (0, 1]"

    def convert(self, value: object) -> float | _Invalid:
        number = _number(value)
        return number if number is not None and 0.0 < number <= 1.0 else _INVALID


@dataclass(frozen=True)
class Multiplier(Kind[float]):
    """A finite number >= 1."""

    name = "multiplier"

    @property
    def valid(self) -> str:
        return "a finite number >= 1"

    def convert(self, value: object) -> float | _Invalid:
        number = _number(value)
        return number if number is not None and number >= 1.0 else _INVALID


@dataclass(frozen=True)
class Choice(Kind[str]):
    """One of ``values`` (text, any case, surrounding blanks ignored)."""

    values: tuple[str, ...] = ()
    name = "choice"

    @property
    def valid(self) -> str:
        return "one of " + ", ".join(self.values)

    @property
    def doc_valid(self) -> str:
        return ", ".join(f"`{v}`" for v in self.values)

    def convert(self, value: object) -> str | _Invalid:
        if not isinstance(value, str) or value.strip().lower() not in self.values:
            return _INVALID
        return value.strip().lower()


@dataclass(frozen=True)
class Bool(Kind[bool]):
    """``True``/``False``, or the text ``true``/``false`` (any case); never a number."""

    name = "bool"

    @property
    def valid(self) -> str:
        return "true or false"

    @property
    def doc_valid(self) -> str:
        return "`true`, `false`"

    def convert(self, value: object) -> bool | _Invalid:
        if _is_bool(value):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        return _INVALID


@dataclass(frozen=True)
class Name(Kind[str | None]):
    """A name matching ``pattern`` (described by ``rule``). With ``optional``, ``None`` and
    ``""`` parse as None (not set)."""

    pattern: re.Pattern[str] = QUEUE_NAME
    rule: str = "a queue name of 1 to 255 characters from A-Z a-z 0-9 _ . -, not dots alone"
    optional: bool = False
    name = "name"

    @property
    def valid(self) -> str:
        return self.rule + (", or empty for none" if self.optional else "")

    @property
    def doc_valid(self) -> str:
        if self.pattern is QUEUE_NAME:
            return "a queue name, `[A-Za-z0-9_.-]{1,255}`, not dots alone"
        return self.rule.removeprefix("a name of ")

    def convert(self, value: object) -> str | _Invalid | None:
        if self.optional and value in (None, ""):
            return None
        if not isinstance(value, str) or not self.pattern.fullmatch(value):
            return _INVALID
        return value


@dataclass(frozen=True)
class Text(Kind[str | None]):
    """Non-empty text (a path, an SQL predicate). With ``optional``, None and "" are None."""

    optional: bool = True
    name = "text"

    @property
    def valid(self) -> str:
        return "non-empty text"

    @property
    def doc_valid(self) -> str:
        return "text"

    def convert(self, value: object) -> str | _Invalid | None:
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


def flag_type(kind: Kind[Parsed], flag: str = "value") -> Callable[[str], Parsed]:
    """An argparse ``type`` parsing a flag's text as ``kind``: a bad value is a usage error
    that argparse prefixes with the flag, saying the valid values and never the value (a
    flag may carry a secret); a warning of an old spelling names ``flag``."""

    def parse(text: str) -> Parsed:
        try:
            return kind.parse(flag, text)
        except InvalidOptionError:
            raise argparse.ArgumentTypeError(f"must be {kind.valid}") from None

    return parse


def parse_count(label: str, value: object, minimum: int = 0, maximum: int = INT64_MAX) -> int:
    """A whole number from ``minimum`` to ``maximum`` (int, numpy integer or digits)."""
    return Count(minimum, maximum).parse(label, value)


def parse_seq(label: str, value: object) -> int:
    """A seq: a whole number from 0 to 2**63-1."""
    return SEQ.parse(label, value)


def parse_seqs(label: str, value: object) -> np.ndarray:
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


@overload
def parse_duration_ms(
    label: str, value: object, minimum_ms: int = 0, zero_is_none: Literal[False] = False
) -> int: ...


@overload
def parse_duration_ms(
    label: str, value: object, minimum_ms: int = 0, *, zero_is_none: bool
) -> int | None: ...


def parse_duration_ms(
    label: str, value: object, minimum_ms: int = 0, zero_is_none: bool = False
) -> int | None:
    """A duration in milliseconds (:class:`Duration`); ``None`` only if ``zero_is_none``."""
    return Duration(minimum_ms, zero_is_none).parse(label, value)


def parse_queue_name(label: str, value: object) -> str:
    """A queue name: 1 to 255 characters from A-Z a-z 0-9 _ . -, not dots alone."""
    return cast(str, QUEUE.parse(label, value))  # not optional: never None


def parse_consumer_name(label: str, value: object) -> str:
    """A consumer name: 1 to 255 characters, no control characters."""
    return cast(str, CONSUMER.parse(label, value))  # not optional: never None


# -- the specification --------------------------------------------------------------------

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

    ``per_scope`` maps a scope where the argument means something more, or has another
    default, to ``(default as shown, doc line)`` there (a consumer's ``maxDeliveries`` can
    only lower the queue's). ``cap_doc`` says what its policy cap does."""

    name: str
    kind: Kind[Any]
    doc: str
    scopes: tuple[str, ...]
    default: Any = None
    unit: str = ""
    policy_default: bool = False  # has a ``default-<kebab>`` policy key
    policy_cap: bool = False  # has a ``<kebab>`` cap key
    spark_option: str | None = None  # a Spark option spelt other than camel(name)
    per_scope: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    cap_doc: str = ""
    shown_default: str = ""  # the default as the docs show it, where not the value itself

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

    def described(self, scope: str) -> tuple[str, str]:
        """``(default as shown, doc line)`` in ``scope``."""
        default, doc = self.per_scope.get(scope, ("", ""))
        return default or self.shown_default or _shown_default(self), doc or self.doc


def _shown_default(argument: Argument) -> str:
    value = argument.default
    if value is None and isinstance(argument.kind, Limit):
        return "none"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`"
    if argument.unit == "ms":
        for unit, size in (("s", 1000), ("ms", 1)):
            if value % size == 0:
                return f"{value // size} {unit}"
    return str(value)


def _queue(name: str, kind: Kind[Any], doc: str, default: Any = None, **more: Any) -> Argument:
    scopes = more.pop("scopes", ("queue", "sink"))
    return Argument(name, kind, doc, scopes, default, policy_default=True, **more)


_LOWER_ONLY = "with a queue limit too, the lower applies"
SPECIFICATION: tuple[Argument, ...] = (
    Argument(
        "path",
        Text(),
        "the queue table, an absolute local path or a URI (`.start(path)`, `.save(path)`, "
        "`.load(path)` set it)",
        ("sink", "source", "browse"),
        shown_default="required",
    ),
    Argument(
        "queue",
        QUEUE_OPTIONAL,
        "the queue of rows whose `queue` column is null or absent; required when there is "
        "no `queue` column",
        ("sink", "source", "browse", "call"),
        per_scope={
            "source": ("required", "the queue to consume"),
            "browse": ("all queues", "read one queue; an unknown name is an error listing them"),
            "call": (
                "required",
                "the queue a call acts on, its first argument (`release`: None, every queue)",
            ),
        },
    ),
    Argument(
        "consumer",
        CONSUMER,
        "this consumer's name; one query per name. A fresh checkpoint starts a new session "
        "and returns what the name still held",
        ("source", "lease", "call"),
        "default",
        per_scope={
            "call": (
                "any consumer (`ack`, `cancel`, `expire`); required by `consumer`, `extend` "
                "and `release`",
                "the consumer whose leases a call acts on, after the queue",
            )
        },
    ),
    _queue(
        "max_length",
        LIMIT,
        "limit on **ready** messages; the overflow policy applies beyond it",
        unit="messages",
        policy_cap=True,
        cap_doc="cap on the ready-message count (`none`: no cap)",
    ),
    _queue(
        "max_length_bytes",
        LIMIT,
        "limit on the sum of ready messages' `body` lengths; not with `overflow=ring`",
        unit="bytes",
        policy_cap=True,
        cap_doc="cap on the ready bodies' bytes (`none`: no cap); not on ring queues",
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
        per_scope={
            "source": (
                "none (the queue's limit only)",
                "a message delivered this many times without an ack is killed (dead-lettered "
                f"`delivery_limit`) instead of returned; {_LOWER_ONLY}",
            ),
            "lease": ("none (the queue's limit only)", "as for the source"),
            "consumer": ("none (the queue's limit only)", "as for `QueueTable.lease`"),
        },
        cap_doc="cap on the queue's delivery limit (`none`: no cap): a queue without one "
        "gets the cap",
    ),
    _queue(
        "max_cancels",
        DELIVERY_LIMIT,
        "the queue's cancel limit (AMPS `MaxCancels`): the cancel that reaches it kills the "
        "message (`cancel_limit`); a consumer's `maxCancels` may only lower it",
        unit="cancels",
        policy_cap=True,
        scopes=("queue", "sink", "source", "lease", "consumer"),
        per_scope={
            "source": (
                "none (the queue's limit only)",
                "a message cancelled this many times is killed (dead-lettered "
                f"`cancel_limit`); {_LOWER_ONLY}",
            ),
            "lease": ("none (the queue's limit only)", "as for the source"),
            "consumer": ("none (the queue's limit only)", "as for `QueueTable.lease`"),
        },
        cap_doc="cap on the queue's cancel limit (`none`: no cap): a queue without one gets "
        "the cap",
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
        shown_default="10 x `redeliveryDelay`",
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
        cap_doc="the longest `duplicateWindow` a queue may have (`none`: no cap), which "
        "bounds what de-duplication stores; a queue without a window keeps none",
    ),
    Argument(
        "policies",
        Text(),
        "a policies file (TOML) of defaults and caps for the queues this write declares "
        "(docs/POLICIES.md); an invalid file fails the write before any task runs, naming "
        "file, line and key",
        ("sink",),
        shown_default="`$SPARK_QUEUE_POLICIES`, else none",
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
        per_scope={
            "source": ("unset (leases never expire)", ""),
            "consumer": (
                "30 s",
                "each lease's period; leases of messages prefetched or in hand are extended "
                "at half of it",
            ),
        },
    ),
    Argument(
        "max_messages",
        POSITIVE,
        "messages per micro-batch (Spark's `ReadMaxRows`)",
        ("source", "lease"),
        unit="messages",
        spark_option="maxMessagesPerTrigger",
        per_scope={
            "source": ("unlimited", ""),
            "lease": ("100", "messages per lease; 0 leases none and only settles"),
        },
    ),
    Argument(
        "max_bytes",
        POSITIVE,
        "body bytes per micro-batch; at least one message is always taken",
        ("source", "lease"),
        unit="bytes",
        spark_option="maxBytesPerTrigger",
        per_scope={"source": ("unlimited", "")},
    ),
    Argument(
        "max_backlog",
        POSITIVE,
        "leases outstanding across all consumers of the queue",
        ("source",),
        unit="messages",
        per_scope={"source": ("unlimited", "")},
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
        per_scope={"consumer": ("unset", "as for `QueueTable.lease`")},
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
        per_scope={"consumer": ("1 s, or a quarter of `lease_period` where shorter", "")},
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
        per_scope={"consumer": ("25 ms local, 100 ms object store", "")},
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
        shown_default="the queue's redelivery backoff",
    ),
    Argument(
        "period",
        Duration(minimum_ms=1),
        "how long from now an extended lease runs (`QueueTable.extend`; SQS "
        "`ChangeMessageVisibility`)",
        ("call",),
        unit="ms",
        shown_default="required",
    ),
    Argument(
        "wait_time",
        Duration(optional=True),
        "how long `Consumer.receive` waits for its first message (SQS `WaitTimeSeconds`); 0 "
        "takes only what is prefetched",
        ("call",),
        unit="ms",
        shown_default="until a message comes",
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
