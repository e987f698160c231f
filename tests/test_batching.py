"""Scheduling: every item in exactly one batch, budgets respected, order restored from indices."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slmclassify import Classifier, EngineSettings, Task
from slmclassify.core.batching import collate, plan_batches

lengths_st = st.lists(st.integers(min_value=1, max_value=300), min_size=0, max_size=200)


@given(lengths_st, st.integers(min_value=1, max_value=2000), st.integers(min_value=1, max_value=64))
def test_plan_covers_every_item_once_within_budget(lengths, budget, max_rows):
    lengths = np.array(lengths, dtype=np.int64)
    plan = plan_batches(lengths, budget, max_rows)
    flat = np.concatenate(plan) if plan else np.array([], dtype=np.int64)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    for batch in plan:
        assert 1 <= len(batch) <= max_rows
        width = lengths[batch].max()
        assert len(batch) == 1 or len(batch) * width <= budget  # an over-long item rides alone


@given(lengths_st.filter(bool), st.integers(min_value=1, max_value=16))
def test_fixed_unsorted_batches_keep_input_order(lengths, rows):
    plan = plan_batches(np.array(lengths), None, rows, sort=False)
    assert np.concatenate(plan).tolist() == list(range(len(lengths)))
    assert all(len(b) == rows for b in plan[:-1])


def test_sorted_longest_first():
    plan = plan_batches(np.array([5, 50, 20, 50, 1]), token_budget=100, max_rows=8)
    assert plan[0].tolist() == [1, 3]  # the two longest, ties in input order
    assert [i for b in plan for i in b.tolist()] == [1, 3, 2, 0, 4]


def test_collate_left_pads():
    batch = collate([[7, 8, 9], [5]], np.array([4, 2]), pad_id=0, cached=True)
    assert batch.input_ids.tolist() == [[7, 8, 9], [0, 0, 5]]
    assert batch.lengths.tolist() == [3, 1]
    assert batch.rows.tolist() == [4, 2]
    assert (batch.real_tokens, batch.padded_tokens) == (4, 6)


TEXTS = [("refund " * n).strip() for n in range(1, 13)] + ["", "app crashes on login", " "]


@settings(max_examples=15, deadline=None)
@given(st.permutations(range(len(TEXTS))), st.sampled_from([16, 48, 4096]), st.integers(1, 5))
def test_order_restored_under_any_permutation(llama_loaded, perm, budget, max_rows):
    """Results come back in input order whatever the order, batch size or budget."""
    clf = Classifier(Task(labels=("billing", "technical", "account")), model=llama_loaded,
                     settings=EngineSettings(token_budget=budget, max_rows=max_rows))
    base = _baseline(llama_loaded)
    shuffled = clf.classify([TEXTS[i] for i in perm])
    assert len(shuffled) == len(TEXTS)
    for out_pos, i in enumerate(perm):
        got, want = shuffled[out_pos], base[i]
        assert got.status == want.status and got.label == want.label
        if want.label is not None:
            assert abs(got.confidence - want.confidence) < 1e-5


_BASE = {}


def _baseline(loaded):
    if id(loaded) not in _BASE:
        clf = Classifier(Task(labels=("billing", "technical", "account")), model=loaded,
                         settings=EngineSettings(token_budget=None, max_rows=1, sort=False))
        _BASE[id(loaded)] = clf.classify(TEXTS)
    return _BASE[id(loaded)]
