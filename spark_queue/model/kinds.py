"""The kinds of argument value, and one parser per kind.

A kind (:class:`Kind`) says what values it accepts, in one message that names the argument
as the caller spelled it and the values it takes, and parses them; every parser raises
:class:`InvalidOptionError`. The specification (:mod:`spark_queue.model.arguments`) gives
each argument its kind.

The rules every kind keeps: a bool is never a number; a fraction is never a whole number;
text such as ``"1_000"`` or ``"5.0"`` is not a count; whole numbers fit an int64; durations
are in one grammar (a whole number of milliseconds, or a number with a unit: ``30s``,
``5 minutes``, ``1 week``) and at most :data:`MAX_DURATION_MS`, so that now plus any duration
is a valid timestamp. Out-of-range values are refused, never clamped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Generic, Literal, SupportsIndex, TypeVar, cast, overload

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
