"""A consumer's ``filter``: a SQL predicate over the message columns, run by DataFusion
(delta-rs's ``QueryBuilder``) on one version of the table. Driver side only."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from spark_queue.errors import InvalidOptionError
from spark_queue.rules import member
from spark_queue.storage.files import MESSAGE
from spark_queue.storage.store import QueueStore, Snapshot

# What a filter may name: a message's own columns, not the table's bookkeeping ones.
FILTER_COLUMNS = (
    "queue",
    "seq",
    "message_id",
    "key",
    "body",
    "size",
    "headers",
    "priority",
    "enqueued_at",
    "deliver_at",
    "expires_at",
)
_POSITION = re.compile(r" at Line: (\d+), Column: (\d+)")
_QUALIFIER = re.compile(r"\b(?:m|messages)\.(?=\w)")
_SUGGESTION = re.compile(r" ?Did you mean '(?:\w+\.)?(\w+)'\?")


def filter_matcher(
    store: QueueStore, snapshot: Snapshot, queue: str, predicate: str
) -> Callable[[np.ndarray], np.ndarray]:
    """A consumer's ``filter``: which of some seqs of ``queue`` satisfy ``predicate`` (SQL
    over the message columns, run by DataFusion on ``snapshot``'s version of the table,
    files pruned by their seq statistics). Raises :class:`InvalidOptionError` if the
    predicate does not parse, is more than one expression or names other columns."""
    from deltalake import QueryBuilder

    _check_one_expression(predicate)
    builder = QueryBuilder().register("messages", store.table_at(snapshot.version))

    def query(where: str) -> pa.Table:
        # The predicate filters a subquery of the queue's messages and their columns only,
        # and starts a line of its own, so DataFusion's positions are the user's own.
        try:
            result = builder.execute(
                f"SELECT seq FROM (SELECT {', '.join(FILTER_COLUMNS)} FROM messages "
                f"WHERE record = '{MESSAGE}' AND queue = '{queue}' AND {where}) AS m "
                f"WHERE (\n{predicate}\n)"
            )
        except Exception as error:  # DataFusion's own errors carry the reason
            raise _invalid(predicate, _reason(str(error), predicate)) from None
        return pa.table(result.read_all())

    query("FALSE")  # check it once, before anything is leased

    def matches(seqs: np.ndarray) -> np.ndarray:
        if not len(seqs):
            return np.zeros(0, dtype=bool)
        found = query(f"seq BETWEEN {int(seqs.min())} AND {int(seqs.max())}")["seq"]
        return member(seqs, found.to_numpy())

    return matches


def _invalid(predicate: str, reason: str) -> InvalidOptionError:
    return InvalidOptionError(
        f"filter {predicate!r} is not a SQL predicate over the message columns "
        f"({', '.join(FILTER_COLUMNS)}): {reason}"
    )


def _check_one_expression(predicate: str) -> None:
    """Refuse a predicate that would end the parentheses it is put in, or the statement:
    a filter selects among its queue's messages, nothing else."""
    depth, quote = 0, ""
    for i, char in enumerate(predicate):
        if quote:
            quote = "" if char == quote else quote  # '' (an escaped quote) reopens at once
            continue
        if char in "'\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise _invalid(predicate, f"a ')' at column {i + 1} closes no '('")
        elif char == ";" or predicate[i : i + 2] in ("--", "/*"):
            raise _invalid(predicate, f"{predicate[i : i + 2].strip()!r} at column {i + 1}")
    if depth or quote:
        raise _invalid(predicate, f"an unclosed {quote or '('}")


def _reason(text: str, predicate: str) -> str:
    """DataFusion's error about the query, told about the predicate alone: positions in
    it, and no column it may not name."""
    text = text.split("\nValid fields are", 1)[0].strip()
    text = _SUGGESTION.sub(
        lambda m: f" Did you mean '{m[1]}'?" if m[1] in FILTER_COLUMNS else "", text
    )
    text = _QUALIFIER.sub("", text)
    position = _POSITION.search(text)
    if position is not None:
        line, column = int(position[1]) - 1, int(position[2])
        lines = predicate.split("\n")
        if not 1 <= line <= len(lines):
            where = " at the end of the filter"
        elif len(lines) == 1:
            where = f" at column {column} of the filter"
        else:
            where = f" at line {line}, column {column} of the filter"
        text = text[: position.start()] + where + text[position.end() :]
    return text
