"""A consumer's ``filter``: a SQL predicate over the message columns, run by DataFusion
(delta-rs's ``QueryBuilder``) on one version of the table. Driver side only."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from spark_queue.core import member
from spark_queue.errors import InvalidOptionError
from spark_queue.files import MESSAGE
from spark_queue.store import Snapshot


def filter_matcher(
    snapshot: Snapshot, queue: str, predicate: str
) -> Callable[[np.ndarray], np.ndarray]:
    """A consumer's ``filter``: which of some seqs of ``queue`` satisfy ``predicate`` (SQL
    over the message columns, run by DataFusion on this version of the table, files
    pruned by their seq statistics). Raises :class:`InvalidOptionError` if the predicate
    does not parse or names unknown columns."""
    from deltalake import QueryBuilder

    builder = QueryBuilder().register("messages", snapshot.table)

    def query(where: str) -> pa.Table:
        try:
            result = builder.execute(
                f"SELECT seq FROM messages WHERE record = '{MESSAGE}' AND queue = '{queue}' "
                f"AND {where} AND ({predicate})"
            )
        except Exception as error:  # DataFusion's own errors carry the reason
            raise InvalidOptionError(
                f"filter {predicate!r} is not a SQL predicate over the message columns "
                f"(queue, seq, message_id, key, body, size, headers, priority, enqueued_at, "
                f"deliver_at, expires_at): {error}"
            ) from None
        return pa.table(result.read_all())

    query("FALSE")  # check it once, before anything is leased

    def matches(seqs: np.ndarray) -> np.ndarray:
        if not len(seqs):
            return np.zeros(0, dtype=bool)
        found = query(f"seq BETWEEN {int(seqs.min())} AND {int(seqs.max())}")["seq"]
        return member(seqs, found.to_numpy())

    return matches
