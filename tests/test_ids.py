"""De-duplication by message id in the pure core (``spark_queue.rules.ids``): the hashes, and
the window against the reference model (``tests/model.py``), without Spark or Delta."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spark_queue.rules import SeenIds, SeenRun, id_hashes
from tests.model import ModelWindow


def test_equal_ids_hash_equal_and_others_apart():
    ids = pa.array(["a", "b", "a", None, "", "é", "0123456789abcdef0", "0123456789abcdef1"])
    first, second, valid = id_hashes(ids)
    assert valid.tolist() == [True, True, True, False, True, True, True, True]
    pairs = list(zip(first.tolist(), second.tolist(), strict=True))
    assert pairs[0] == pairs[2]
    set_pairs = [p for p, ok in zip(pairs, valid, strict=True) if ok]
    assert len(set(set_pairs)) == len(set_pairs) - 1  # only "a" repeats


def test_hashes_do_not_depend_on_the_array_layout():
    """Sliced arrays, large strings, chunked arrays and contiguous equal-length ids (the
    fast path) hash as the same ids one by one."""
    ids = [f"{i:08d}-uuid-like-{i % 7}" for i in range(50)]
    one_by_one = []
    for message_id in ids:
        first, second, _ = id_hashes(pa.array([message_id]))
        one_by_one.append((int(first[0]), int(second[0])))
    whole = pa.array(ids)
    for layout in (
        whole,
        whole.cast(pa.large_string()),
        pa.chunked_array([whole.slice(0, 20), whole.slice(20)]),
    ):
        first, second, _ = id_hashes(layout)
        assert list(zip(first.tolist(), second.tolist(), strict=True)) == one_by_one
    first, second, _ = id_hashes(whole.slice(5, 10))
    assert list(zip(first.tolist(), second.tolist(), strict=True)) == one_by_one[5:15]


def test_a_million_distinct_ids_have_distinct_hashes():
    ids = pa.array([f"order-{i}" for i in range(1_000_000)])
    first, second, _ = id_hashes(ids)
    assert len(np.unique(first)) == 1_000_000
    assert len(np.unique(second)) == 1_000_000


def test_merged_runs_stay_sorted_and_drop_what_left_the_window():
    window = SeenIds()
    for batch in range(6):
        first, second, _ = id_hashes(pa.array([f"{batch}-{i}" for i in range(1000)]))
        run = SeenRun.of(first, second, np.full(1000, batch * 10, np.int64))
        window = window.with_run(run, since=batch * 10 - 25)
    assert len(window.runs) < 6
    for run in window.runs:
        assert bool((run.first[1:] >= run.first[:-1]).all())
    assert min(int(run.seen_at.min()) for run in window.runs) >= 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    window=st.integers(1, 30),
    batches=st.lists(
        st.tuples(
            st.integers(0, 20),  # time passes before the batch
            st.lists(st.one_of(st.none(), st.sampled_from("abcdef")), max_size=8),
        ),
        min_size=1,
        max_size=10,
    ),
)
def test_window_matches_reference_model(window, batches):
    """JetStream's Duplicates window, id by id: an id enqueued within the window is a
    duplicate, the first of a batch wins, nulls never are, and a duplicate does not renew
    its id's time."""
    model = ModelWindow(window)
    seen = SeenIds()
    now = 100
    for wait, ids in batches:
        now += wait
        since = now - window
        first, second, valid = id_hashes(pa.array(ids, pa.string()))
        got, _ = seen.duplicates(first, second, valid, since)
        expected = model.enqueue(ids, now)
        assert got.tolist() == expected
        if any(expected):
            event("a duplicate")
        kept = valid & ~got
        run = SeenRun.of(first[kept], second[kept], np.full(int(kept.sum()), now, np.int64))
        seen = seen.with_run(run, since)
