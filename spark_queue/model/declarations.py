"""Static declarations of arguments, checked against the specification as they are made.

A type checker needs some arguments spelt out where they are taken: the fields of a
dataclass (:class:`~spark_queue.model.queue_arguments.QueueArguments`, ``ConsumerLimits``,
the Spark options), the keys of a ``TypedDict`` (:mod:`spark_queue.model.keywords`), the
keywords of a signature (``QueueTable.lease``, the clients). Each declaring module calls a
check of this module right after the declaration, so a declaration that drifts from the
specification (:mod:`spark_queue.model.arguments`) fails at import, in every process: a name
missing or extra, another default, a choice whose ``Literal`` has other values, a type of
another kind, or ``None`` admitted where the argument cannot be none.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import textwrap
import typing
from collections.abc import Callable, Iterable
from typing import Any

from spark_queue.errors import InvalidOptionError
from spark_queue.model.arguments import Argument, arguments_of
from spark_queue.model.kinds import Bool, Choice, Count, Duration, Fraction, Limit, Multiplier


class DeclarationError(TypeError):
    """A static declaration of arguments differs from the specification."""


def check_dataclass(
    declared: type,
    arguments: Iterable[Argument],
    scope: str,
    *,
    held: bool = False,
    own: tuple[str, ...] = (),
) -> None:
    """``declared``'s fields are ``arguments`` (besides its ``own`` fields), each with its
    default in ``scope`` as parsed, or none (required), and a type of its kind. ``held``:
    the fields hold values as a consumer's limits do (:meth:`Argument.held`).

    Raises:
        DeclarationError: naming the dataclass, the field and what the specification says.
    """
    where = declared.__qualname__
    fields = {f.name: f for f in dataclasses.fields(declared) if f.name not in own}
    by_name = {a.held_name if held else a.name: a for a in arguments}
    _same_names(where, fields, by_name, "field")
    hints = typing.get_type_hints(declared)
    for name, argument in by_name.items():
        default = fields[name].default
        if default is not dataclasses.MISSING:
            parsed = argument.parse(argument.default_in(scope))
            _same_default(f"{where}.{name}", default, argument.held(parsed) if held else parsed)
        _check_type(f"{where}.{name}", argument, hints[name], held=held, keyword=False)


def check_keywords(declared: type, *scopes: str) -> None:
    """``declared`` (a ``TypedDict``) has a key for each argument of ``scopes``, and no
    other, each typed as a keyword of its kind.

    Raises:
        DeclarationError: naming the type, the key and what the specification says.
    """
    where = declared.__qualname__
    hints = typing.get_type_hints(declared)
    by_name = {a.name: a for scope in scopes for a in arguments_of(scope)}
    _same_names(where, hints, by_name, "key")
    for name, argument in by_name.items():
        _check_type(f"{where}.{name}", argument, hints[name], held=False, keyword=True)


def check_signature(
    function: Callable[..., Any], scope: str, *, own: tuple[str, ...] = (), typed: bool = True
) -> None:
    """The keywords of ``function`` (its keyword-only parameters and those with a default,
    besides its ``own``) are the arguments of ``scope``, each with its default in ``scope``
    (a stub's ``...`` aside) and, if ``typed``, typed as a keyword of its kind.

    Raises:
        DeclarationError: naming the function, the keyword and what the specification says.
    """
    where = function.__qualname__
    parameters = {
        name: p
        for name, p in inspect.signature(function).parameters.items()
        if name not in own
        and p.kind is not p.VAR_KEYWORD
        and (p.kind is p.KEYWORD_ONLY or p.default is not p.empty)
    }
    by_name = {a.name: a for a in arguments_of(scope)}
    _same_names(where, parameters, by_name, "keyword")
    hints = typing.get_type_hints(function) if typed else {}
    for name, argument in by_name.items():
        default = parameters[name].default
        if default is not ...:
            _same_default(f"{where}({name}=)", default, argument.default_in(scope))
        if typed:
            _check_type(f"{where}({name}=)", argument, hints[name], held=False, keyword=True)


def _same_names(where: str, declared: Iterable[str], specified: Iterable[str], what: str) -> None:
    extra = sorted(set(declared) - set(specified))
    missing = sorted(set(specified) - set(declared))
    if extra or missing:
        raise DeclarationError(
            f"{where} differs from the argument specification: "
            + "; ".join(
                [
                    *([f"{what}s {extra} are no arguments of it"] if extra else []),
                    *([f"arguments {missing} have no {what}"] if missing else []),
                ]
            )
        )


def _same_default(where: str, declared: object, specified: object) -> None:
    if declared != specified or type(declared) is not type(specified):
        raise DeclarationError(
            f"{where} defaults to {declared!r}; the argument specification's default is "
            f"{specified!r}"
        )


_DURATION_LIKE = (int, str, dt.timedelta)  # what a keyword takes for a duration: DurationLike
_UNION_TYPE = type(int | None)


def _value_types(argument: Argument, *, keyword: bool) -> tuple[Any, ...]:
    """The Python types (``None`` aside) a declaration of ``argument`` gives it: what its
    kind parses to, or, for a keyword, what the kind takes; a choice, its ``Literal`` (with
    its values in the specification's order)."""
    kind = argument.kind
    if isinstance(kind, Choice):
        return (typing.Literal[kind.values],)
    if isinstance(kind, Duration):
        return _DURATION_LIKE if keyword else (int,)
    if isinstance(kind, Count | Limit):
        return (int,)
    if isinstance(kind, Fraction | Multiplier):
        return (float,)
    if isinstance(kind, Bool):
        return (bool,)
    return (str,)  # a name, a text


def _check_type(where: str, argument: Argument, hint: Any, *, held: bool, keyword: bool) -> None:
    union = typing.get_origin(hint) in (typing.Union, _UNION_TYPE)
    types = typing.get_args(hint) if union else (hint,)
    admits_none = type(None) in types
    given = {_spelt(t) for t in types if t is not type(None)}
    expected = _value_types(argument, keyword=keyword)
    if given != {_spelt(t) for t in expected}:
        raise DeclarationError(
            f"{where} is typed {_spelt(hint)}; the argument specification's kind "
            f"({argument.kind.name}) gives {' | '.join(map(_spelt, expected))}"
        )
    if admits_none and not _may_be_none(argument, held=held):
        raise DeclarationError(
            f"{where} admits None; the argument specification parses no None for it"
        )


def _spelt(hint: Any) -> str:
    """A type as a declaration spells it; a ``Literal``'s values in their order (two
    ``Literal`` types with the same values compare equal in any order)."""
    if typing.get_origin(hint) is typing.Literal:
        return f"Literal{list(typing.get_args(hint))}"
    return getattr(hint, "__name__", None) or repr(hint)


def _may_be_none(argument: Argument, *, held: bool) -> bool:
    """Whether ``argument``'s value may be None (held: as a consumer's limits hold it)."""
    try:
        parsed = argument.parse(None)
    except InvalidOptionError:
        return False
    return (argument.held(parsed) if held else parsed) is None


def attributes_section(arguments: Iterable[Argument]) -> str:
    """A docstring's ``Attributes:`` section (Google style, indented as a class's
    docstring is) of ``arguments``: each one's doc line and unit."""
    lines = ["", "    Attributes:"]
    for argument in arguments:
        unit = f" (unit: {argument.unit})" if argument.unit else ""
        lines += textwrap.wrap(
            f"{argument.name}: {argument.doc}{unit}.",
            width=92,
            initial_indent=" " * 8,
            subsequent_indent=" " * 12,
            break_on_hyphens=False,
        )
    return "\n".join(lines) + "\n"
