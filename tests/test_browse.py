"""The browse reader's column helpers, without Spark."""

from __future__ import annotations

import numpy as np

from spark_queue.storage.browse import leased_consumers


def test_leased_consumers_marks_each_leased_seq_with_its_consumer() -> None:
    leased = {9: "b", 2: "a", 5: "b"}  # not in seq order, as the lease index may be
    seqs = np.array([1, 2, 3, 5, 9, 10], dtype=np.int64)
    assert leased_consumers(leased, seqs).to_pylist() == [None, "a", None, "b", "b", None]


def test_leased_consumers_without_leases_or_rows() -> None:
    assert leased_consumers({}, np.array([1, 2], dtype=np.int64)).to_pylist() == [None, None]
    assert leased_consumers({3: "x"}, np.zeros(0, dtype=np.int64)).to_pylist() == []
