"""Options of ``format("ringqueue")``: Spark hands a data source its options lower-cased
with string values; they are matched to the camelCase options of the one specification
(:mod:`spark_queue.model.arguments`) and parsed into :class:`SinkOptions`,
:class:`SourceOptions` and :class:`BrowseOptions`. ``docs/ARGUMENTS.md`` is the table of every
argument with its default, generated from the specification.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from spark_queue.errors import InvalidOptionError
from spark_queue.model.arguments import (
    ARGUMENTS,
    AckMode,
    OnReject,
    ReadMode,
    Semantics,
    arguments_of,
)
from spark_queue.model.declarations import check_dataclass
from spark_queue.model.queue_arguments import (
    CONSUMER_LIMITS,
    ConsumerLimits,
    parse_consumer_limits,
    validate_arguments,
)
from spark_queue.storage.location import OPTION_PREFIX, normalise_options

# The options of a readStream and of a read, as Spark spells them.
SOURCE_OPTIONS = tuple(a.option for a in arguments_of("source"))
BROWSE_OPTIONS = tuple(a.option for a in arguments_of("browse"))

# Keys Spark itself adds to a data source's options.
SPARK_OPTIONS = ("checkpointlocation",)


@dataclass(frozen=True)
class SinkOptions:
    """The parsed options of one ``writeStream``/``write`` to ``format("ringqueue")``."""

    path: str
    queue: str | None
    on_reject: OnReject
    arguments: dict[str, Any]  # validated snake_case queue arguments that were given
    policies: str | None = None  # a policies file (docs/POLICIES.md); None: $SPARK_QUEUE_POLICIES
    # ``storage.*`` options, keys as delta-rs reads them (spark_queue.storage); never in a repr.
    storage: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of ``spark.readStream.format("ringqueue")``: each field is the
    source option of its name, the consumer's limits as :class:`ConsumerLimits` holds them
    (``lease_period_us``, 0 for no delivery or cancel limit of the consumer's own)."""

    path: str
    queue: str
    consumer: str = "default"
    semantics: Semantics = "at-least-once"
    lease_period_us: int | None = None
    max_messages: int | None = None
    max_bytes: int | None = None
    max_deliveries: int = 0
    max_cancels: int = 0
    max_backlog: int | None = None
    ack_mode: AckMode = "commit"
    filter: str | None = None  # SQL predicate over the message columns
    read_mode: ReadMode = "executors"
    storage: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def limits(self) -> ConsumerLimits:
        """The consumer's limits, as ``QueueTable.lease`` takes them."""
        return ConsumerLimits(**{f.name: getattr(self, f.name) for f in fields(ConsumerLimits)})


@dataclass(frozen=True)
class BrowseOptions:
    path: str
    queue: str | None
    storage: dict[str, str] = field(default_factory=dict, repr=False)


# Each dataclass against the specification, at import: a field per option of its scope,
# with the option's default, of its kind's type (``storage.*`` keys are not arguments).
check_dataclass(SourceOptions, arguments_of("source"), "source", held=True, own=("storage",))
check_dataclass(
    SinkOptions,
    [a for a in arguments_of("sink") if "queue" not in a.scopes],
    "sink",
    own=("arguments", "storage"),
)
check_dataclass(BrowseOptions, arguments_of("browse"), "browse", own=("storage",))
# The source's options that are not the consumer's limits, but its path (checked apart).
_SOURCE_OWN = [
    a.name for a in arguments_of("source") if a.name not in CONSUMER_LIMITS and a.name != "path"
]


def _lookup(options: Mapping[str, str], scope: str) -> dict[str, str]:
    """The options of a Spark read or write of ``scope``, by snake_case argument: Spark's
    lower-cased keys matched to the camelCase options; unknown keys are an error.
    ``storage.*`` keys are not looked up here (:func:`storage_options`)."""
    allowed = arguments_of(scope)
    by_lower = {a.option.lower(): a.name for a in allowed}
    found: dict[str, str] = {}
    for key, value in options.items():
        lower = key.lower()
        if lower in SPARK_OPTIONS or lower.startswith(OPTION_PREFIX):
            continue
        if lower not in by_lower:
            raise InvalidOptionError(
                f"unknown option {key!r}; valid options: {', '.join(a.option for a in allowed)}, "
                f"and {OPTION_PREFIX}<KEY> for the store (docs/STORAGE.md)"
            )
        found[by_lower[lower]] = value
    return found


def _parsed(found: Mapping[str, Any], name: str) -> Any:
    """An option's value parsed by the specification, or its default where not given."""
    argument = ARGUMENTS[name]
    return argument.parse(found[name], argument.option) if name in found else argument.default


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
    path = _parsed(found, "path")
    if path is None:
        raise InvalidOptionError("option 'path' is required: the queue table's location")
    # The connector runs in Spark's Python workers, whose working directory is not the
    # driver's (nor, on Spark Connect, the client's): a relative path would name another
    # folder in each process, so it is refused rather than resolved.
    if "://" not in path and not os.path.isabs(path):
        raise InvalidOptionError(
            f"option 'path' must be an absolute local path or a URI such as "
            f"s3://bucket/queues (Spark's Python workers do not share the driver's working "
            f"directory); got {path!r}"
        )
    return path


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    found = _lookup(options, "sink")
    queue_arguments = {n: v for n, v in found.items() if "queue" in ARGUMENTS[n].scopes}
    return SinkOptions(
        path=_path(found),
        queue=_parsed(found, "queue"),
        on_reject=_parsed(found, "on_reject"),
        arguments=validate_arguments(queue_arguments, surface="option"),
        policies=_parsed(found, "policies"),
        storage=storage_options(options),
    )


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    found = _lookup(options, "source")
    if "queue" not in found:
        raise InvalidOptionError("option 'queue' is required: the queue to consume")
    limits = parse_consumer_limits(
        {n: found[n] for n in CONSUMER_LIMITS if n in found}, surface="option"
    )
    path = _path(found)
    others = {name: _parsed(found, name) for name in _SOURCE_OWN}
    return SourceOptions(path, **others, **asdict(limits), storage=storage_options(options))


def parse_browse_options(options: Mapping[str, str]) -> BrowseOptions:
    found = _lookup(options, "browse")
    return BrowseOptions(
        path=_path(found), queue=_parsed(found, "queue"), storage=storage_options(options)
    )


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
