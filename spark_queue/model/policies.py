"""Queue policies (SEMANTICS §5): defaults and caps for queue arguments, by queue name.

A policies file is TOML with one table per policy under ``policy``::

    [policy.rings]
    match = "ring.#"            # Artemis wildcards: "." between words, "*" one, "#" any
    default-ring-size = 1000    # applies only where the queue has no explicit value

    [policy.audit]
    pattern = "^audit-"         # a regex, searched in the name (RabbitMQ)
    priority = 10
    max-length-bytes = 1073741824   # a cap: effective = min(argument, cap)

Exactly one policy applies to a queue: the highest ``priority``; at equal priority a
``match`` entry before a ``pattern`` entry; among ``match`` entries the most specific
(Artemis's order: no ``#`` before ``#``, then exact before ``*``); then file order.
``docs/POLICIES.md`` gives every rule and the reasons.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spark_queue.errors import InvalidOptionError, PolicyError
from spark_queue.model.arguments import ARGUMENTS, SPECIFICATION, Duration
from spark_queue.model.deprecations import warn_deprecated
from spark_queue.model.queue_arguments import (
    ARGUMENT_NAMES,
    RING_COUNT_ONLY,
    QueueArguments,
    check_effective,
    option_name,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

ENV_VAR = "SPARK_QUEUE_POLICIES"
POLICY_NAME = re.compile(r"^[A-Za-z0-9_\-]{1,255}$")
_WORD = re.compile(r"^[A-Za-z0-9_\-]+$")
ANY_WORDS, ONE_WORD, DELIMITER = "#", "*", "."

# policy key -> queue argument, from the specification: ``default-<argument>`` keys (a
# default, parsed as the argument is) and ``<argument>`` keys (a cap).
DEFAULT_KEYS = {
    f"default-{a.name.replace('_', '-')}": a.name
    for a in SPECIFICATION
    if a.policy_default and a.name != "ring_size"
}
CAP_KEYS = {a.name.replace("_", "-"): a.name for a in SPECIFICATION if a.policy_cap}
# Caps on something a queue may go without: a queue without one keeps none (a missing
# de-duplication window is no window, not an endless one).
OPTIONAL_CAPS = ("duplicate_window",)
SELECTOR_KEYS = ("match", "pattern")
POLICY_KEYS = (
    *SELECTOR_KEYS,
    "priority",
    "default-ring-size",
    *DEFAULT_KEYS,
    *CAP_KEYS,
)


@dataclass(frozen=True)
class Policy:
    """One ``[policy.<name>]`` table, validated.

    ``defaults`` and ``caps`` map snake_case queue arguments to parsed values (a cap of
    ``None`` means the file said none: no cap). ``index`` is the position in the file.
    """

    name: str
    match: str | None = None
    pattern: str | None = None
    priority: int = 0
    defaults: dict[str, Any] = field(default_factory=dict)
    caps: dict[str, int | None] = field(default_factory=dict)
    index: int = 0

    def matches(self, queue: str) -> bool:
        if self.match is not None:
            return match_words(self.match, queue)
        assert self.pattern is not None
        return re.search(self.pattern, queue) is not None

    @property
    def selector(self) -> str:
        return f"match {self.match!r}" if self.match is not None else f"pattern {self.pattern!r}"


@dataclass(frozen=True)
class Origin:
    """Where one effective argument came from.

    ``kind``: ``queue`` (an explicit value), ``default`` (the policy's ``default-*``),
    ``cap`` (the policy's cap, lower than ``before``, the value it replaced) or
    ``built-in`` (the connector's default).
    """

    kind: str
    policy: str | None = None
    before: Any = None

    def __str__(self) -> str:
        if self.kind == "queue":
            return "queue"
        if self.kind == "default":
            return f"policy {self.policy!r} default"
        if self.kind == "cap":
            shown = "unlimited" if self.before is None else self.before
            return f"policy {self.policy!r} cap (was {shown})"
        return "built-in default"


@dataclass(frozen=True)
class Resolution:
    """A queue's effective arguments, the policy that applied, and each argument's origin."""

    queue: str
    arguments: QueueArguments
    policy: str | None
    origins: dict[str, Origin]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: per argument its value, origin kind, policy and replaced value."""
        values = asdict(self.arguments)
        return {
            "queue": self.queue,
            "policy": self.policy,
            "arguments": {
                name: {"value": values[name], **asdict(self.origins[name])}
                for name in ARGUMENT_NAMES
            },
        }


# -- Artemis wildcards ----------------------------------------------------------------------


def check_match(text: str) -> list[str]:
    """The words of a ``match`` expression, or ValueError naming what is wrong."""
    if not isinstance(text, str) or not text:
        raise ValueError("must be a non-empty string")
    words = text.split(DELIMITER)
    for word in words:
        if word in (ANY_WORDS, ONE_WORD):
            continue
        if not word:
            raise ValueError(f"{text!r} has an empty word (a leading, trailing or double '.')")
        if not _WORD.match(word):
            raise ValueError(
                f"{text!r}: word {word!r} must be '*', '#' or characters from A-Z a-z 0-9 _ -"
                " ('*' and '#' stand for whole words only)"
            )
    return words


def match_words(expression: str, queue: str) -> bool:
    """Whether ``queue`` matches an Artemis wildcard expression.

    Words are separated by ``.``; ``*`` matches exactly one word, ``#`` any number of words,
    zero included (``news.#`` matches ``news``).
    """
    pattern = expression.split(DELIMITER)
    words = queue.split(DELIMITER)

    @functools.cache
    def fits(p: int, w: int) -> bool:
        if p == len(pattern):
            return w == len(words)
        token = pattern[p]
        if token == ANY_WORDS:
            return any(fits(p + 1, k) for k in range(w, len(words) + 1))
        if w == len(words):
            return False
        return (token == ONE_WORD or token == words[w]) and fits(p + 1, w + 1)

    return fits(0, 0)


def compare_specificity(left: str, right: str) -> int:
    """Negative if ``left`` is the more specific match expression (Artemis's order).

    As ``HierarchicalObjectRepository.MatchComparator``: an expression without ``#`` beats
    one with ``#``; between two with ``#`` the longer wins; otherwise one without ``*``
    (exact) beats one with ``*``; between two with ``*`` the first word where only one of
    them has ``*`` decides (the literal word wins); then the longer expression wins (Artemis
    ends on the shorter; both matching one name, that case only differs by a ``#``, ruled
    above).
    """
    left_any, right_any = ANY_WORDS in left, ANY_WORDS in right
    if left_any != right_any:
        return 1 if left_any else -1
    if left_any:
        return len(right) - len(left)
    left_one, right_one = ONE_WORD in left, ONE_WORD in right
    if left_one != right_one:
        return 1 if left_one else -1
    if left_one:
        left_words, right_words = left.split(DELIMITER), right.split(DELIMITER)
        for i, word in enumerate(left_words):
            if i >= len(right_words):
                return -1
            if (word == ONE_WORD) != (right_words[i] == ONE_WORD):
                return 1 if word == ONE_WORD else -1
    return len(right) - len(left)


def _precedence(left: Policy, right: Policy) -> int:
    """Negative if ``left`` wins: priority, then match before pattern, then specificity,
    then file order."""
    if left.priority != right.priority:
        return right.priority - left.priority
    if (left.match is None) != (right.match is None):
        return 1 if left.match is None else -1
    if left.match is not None and right.match is not None:
        order = compare_specificity(left.match, right.match)
        if order:
            return order
    return left.index - right.index


# -- loading ------------------------------------------------------------------------------


class _Lines:
    """Finds the line of a table or key in a TOML text.

    tomllib reports lines for syntax errors only, so for a bad key or value we scan the text:
    each ``[table]`` header sets the current table, each ``key = value`` line is recorded
    under it (dotted keys included). Good enough for the documented layout; a key written
    inside an inline table falls back to its table's line.
    """

    _HEADER = re.compile(r"^\s*\[(?!\[)\s*([^\]]+?)\s*\]\s*(#.*)?$")
    _PART = r"""(?:[A-Za-z0-9_\-]+|"[^"]*"|'[^']*')"""
    _KEY = re.compile(rf"^\s*({_PART}(?:\s*\.\s*{_PART})*)\s*=")

    def __init__(self, text: str) -> None:
        self.where: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        for number, line in enumerate(text.splitlines(), start=1):
            header = self._HEADER.match(line)
            if header:
                table = _split_key(header.group(1))
                self.where.setdefault(table, number)
                continue
            key = self._KEY.match(line)
            if key:
                path = (*table, *_split_key(key.group(1)))
                for end in range(len(table) + 1, len(path) + 1):
                    self.where.setdefault(path[:end], number)

    def line(self, *path: str) -> int | None:
        """The line of ``path``, else of the nearest enclosing table that has one."""
        for end in range(len(path), 0, -1):
            if path[:end] in self.where:
                return self.where[path[:end]]
        return None


def _split_key(text: str) -> tuple[str, ...]:
    parts = re.findall(r"""\s*("[^"]*"|'[^']*'|[^.\s]+)\s*(?:\.|$)""", text)
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in parts)


class _Loader:
    def __init__(self, source: str, text: str) -> None:
        self.source = source
        self.lines = _Lines(text)

    def error(self, message: str, *path: str) -> PolicyError:
        line = self.lines.line(*path) if path else None
        where = f"{self.source}:{line}" if line is not None else self.source
        key = f" key {'.'.join(path)!r}:" if path else ""
        return PolicyError(f"{where}:{key} {message}")

    def policies(self, data: Mapping[str, Any]) -> list[Policy]:
        unknown = sorted(set(data) - {"policy"})
        if unknown:
            raise self.error("unknown top-level key; valid: policy", unknown[0])
        tables = data.get("policy", {})
        if not isinstance(tables, dict):
            raise self.error("must be tables, one per policy: [policy.<name>]", "policy")
        policies = [self.policy(name, body, i) for i, (name, body) in enumerate(tables.items())]
        seen: dict[str, str] = {}
        for policy in policies:
            if policy.selector in seen:
                key = "match" if policy.match is not None else "pattern"
                raise self.error(
                    f"policy {seen[policy.selector]!r} has the same {key}: only one policy "
                    "applies to a queue, so one of the two would never apply",
                    "policy",
                    policy.name,
                    key,
                )
            seen[policy.selector] = policy.name
        return policies

    def policy(self, name: str, body: object, index: int) -> Policy:
        path = ("policy", name)
        if not POLICY_NAME.match(name):
            raise self.error("a policy name is 1 to 255 characters from A-Z a-z 0-9 _ -", *path)
        if not isinstance(body, dict):
            raise self.error("must be a table of policy keys", *path)
        unknown = sorted(set(body) - set(POLICY_KEYS))
        if unknown:
            raise self.error(
                f"unknown policy key; valid keys: {', '.join(POLICY_KEYS)}", *path, unknown[0]
            )
        selectors = [k for k in SELECTOR_KEYS if k in body]
        if len(selectors) != 1:
            which = "both" if selectors else "neither"
            raise self.error(
                f"a policy needs exactly one of 'match' (Artemis wildcards) or 'pattern' "
                f"(a regex); it has {which}",
                *path,
                *(selectors[1:] if selectors else ()),
            )
        match = pattern = None
        if "match" in body:
            try:
                check_match(body["match"])
            except ValueError as error:
                raise self.error(str(error), *path, "match") from None
            match = body["match"]
        else:
            pattern = body["pattern"]
            if not isinstance(pattern, str) or not pattern:
                raise self.error("must be a non-empty regex string", *path, "pattern")
            try:
                re.compile(pattern)
            except re.error as error:
                raise self.error(f"not a valid regex: {error}", *path, "pattern") from None
        priority = body.get("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise self.error(f"must be an integer, got {priority!r}", *path, "priority")
        defaults = self.defaults(body, path)
        caps: dict[str, int | None] = {}
        for key, argument in CAP_KEYS.items():
            if key in body:
                parse = (
                    _parse_window if argument in OPTIONAL_CAPS else ARGUMENTS[argument].kind.parse
                )
                caps[argument] = self.value(parse, body[key], path, key)
        if "max_length_bytes" in caps and defaults.get("overflow") == "ring":
            raise self.error(
                f"{RING_COUNT_ONLY}: a max-length-bytes cap cannot apply to the ring queues "
                "this policy makes (default-ring-size / default-overflow = ring)",
                *path,
                "max-length-bytes",
            )
        return Policy(name, match, pattern, priority, defaults, caps, index)

    def defaults(self, body: Mapping[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
        defaults: dict[str, Any] = {}
        if "default-ring-size" in body:
            clash = [k for k in ("default-max-length", "default-overflow") if k in body]
            if clash:
                raise self.error(
                    f"default-ring-size means default-max-length = N and default-overflow = "
                    f"'ring'; give it or {clash[0]}, not both",
                    *path,
                    clash[0],
                )
            defaults["max_length"] = self.value(
                ARGUMENTS["ring_size"].kind.parse,
                body["default-ring-size"],
                path,
                "default-ring-size",
            )
            defaults["overflow"] = "ring"
        for key, argument in DEFAULT_KEYS.items():
            if key in body:
                defaults[argument] = self.value(
                    ARGUMENTS[argument].kind.parse, body[key], path, key
                )
        try:
            check_effective(defaults)
        except InvalidOptionError:
            raise self.error(
                f"{RING_COUNT_ONLY}; drop default-max-length-bytes or use another default-overflow",
                *path,
                "default-max-length-bytes",
            ) from None
        return defaults

    def value(
        self, parse: Callable[[str, Any], Any], value: object, path: tuple[str, ...], key: str
    ) -> Any:
        """Run an option validator; its message names the key, ours adds file and line."""
        try:
            return parse(key, value)
        except PolicyError:
            raise
        except ValueError as error:  # InvalidOptionError is a ValueError
            message = str(error)
            message = message[len(key) :].lstrip() if message.startswith(key) else message
            raise self.error(message, *path, key) from None


class Policies:
    """The policies of one file, in file order. :meth:`resolve` applies them to a queue."""

    def __init__(self, policies: list[Policy], source: str = "<policies>") -> None:
        self.policies = policies
        self.source = source

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Policies:
        """Read and validate a policies file; :class:`PolicyError` names file, line and key."""
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PolicyError(f"{source}: policies file does not exist") from None
        except (OSError, UnicodeDecodeError) as error:
            raise PolicyError(f"{source}: cannot read the policies file: {error}") from None
        return cls.parse(text, source)

    @classmethod
    def parse(cls, text: str, source: str = "<policies>") -> Policies:
        """Policies from TOML text (``source`` names it in messages)."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            found = re.search(r"\(at line (\d+), column \d+\)", str(error))
            reason = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", str(error))
            line = found.group(1) if found else len(text.splitlines()) or 1  # end of document
            where = f"{source}:{line}"
            raise PolicyError(f"{where}: not valid TOML: {reason}") from None
        return cls(_Loader(source, text).policies(data), source)

    def select(self, queue: str) -> Policy | None:
        """The one policy that applies to ``queue``, or None."""
        found = [p for p in self.policies if p.matches(queue)]
        if not found:
            return None
        return min(found, key=functools.cmp_to_key(_precedence))

    def resolve(self, queue: str, explicit: Mapping[str, Any]) -> Resolution:
        """The effective arguments of ``queue`` given its explicit (validated, snake_case)
        arguments: explicit values, else the policy's defaults, else the built-in defaults;
        then the policy's caps (the minimum of value and cap). An effective combination that
        is invalid (a byte limit on a ring queue) is a :class:`PolicyError`."""
        return _resolve(queue, explicit, self.select(queue), self.source)


WINDOW_CAP = Duration(zero_is_none=True, zero_is_old_none=True)


def _parse_window(name: str, value: object) -> int | None:
    """A duration cap; ``none``: no cap (-1 and 0, its old spellings, with a warning)."""
    if isinstance(value, int | str) and not isinstance(value, bool) and str(value) == "-1":
        warn_deprecated(f"{name}=-1 for none is deprecated: use none")
        return None
    return WINDOW_CAP.parse(name, value)


def _resolve(
    queue: str, explicit: Mapping[str, Any], policy: Policy | None, source: str
) -> Resolution:
    built_in = asdict(QueueArguments())
    values: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    defaults = dict(policy.defaults) if policy else {}
    if defaults.get("dead_letter_queue") == queue:
        del defaults["dead_letter_queue"]  # a dead-letter queue does not dead-letter into itself
    for argument in ARGUMENT_NAMES:
        if argument in explicit:
            values[argument], origins[argument] = explicit[argument], Origin("queue")
        elif argument in defaults:
            assert policy is not None
            values[argument] = defaults[argument]
            origins[argument] = Origin("default", policy.name)
        else:
            values[argument], origins[argument] = built_in[argument], Origin("built-in")
    for argument, cap in (policy.caps if policy else {}).items():
        assert policy is not None
        current = values[argument]
        if current is None and argument in OPTIONAL_CAPS:
            continue
        if cap is not None and (current is None or current > cap):
            values[argument], origins[argument] = cap, Origin("cap", policy.name, current)
    try:
        check_effective(values, "option", queue)
    except InvalidOptionError:
        raise PolicyError(
            f"{source}: queue {queue!r}: overflow=ring (from {origins['overflow']}) bounds the "
            f"message count only, but {option_name('max_length_bytes')}="
            f"{values['max_length_bytes']} "
            f"(from {origins['max_length_bytes']}); give ring queues a policy without a byte "
            "limit"
        ) from None
    return Resolution(queue, QueueArguments(**values), policy.name if policy else None, origins)


def resolve_without_policies(queue: str, explicit: Mapping[str, Any]) -> Resolution:
    """What a queue gets when no policies are configured: explicit, else built-in."""
    return _resolve(queue, explicit, None, "<no policies>")


def load_policies(source: str | os.PathLike[str] | Policies | None) -> Policies | None:
    """The policies a process uses: ``source`` if given (a path or loaded policies), else
    the file named by ``$SPARK_QUEUE_POLICIES``, else None (no policies: arguments as given).
    """
    if isinstance(source, Policies):
        return source
    if source is None or source == "":
        source = os.environ.get(ENV_VAR) or None
        if source is None:
            return None
    return Policies.load(source)
