"""`label/suspects.py`: the flipped labels of separable clusters rank first, every probability is
out-of-fold (an item's own label never reaches the head that scores it), and the small-label and
one-label cases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from slmclassify.errors import FieldError, InputError, TaskError
from slmclassify.head.fitting import folds_of
from slmclassify.label.suspects import Suspect, out_of_fold, ranked, suspects

LABELS, PER, DIM = 4, 30, 6


def clusters(per: int = PER, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """X [LABELS * per, DIM]: one seeded Gaussian cluster per label, centres 6·√2 apart; y the labels."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(LABELS), per)
    centres = 6.0 * np.eye(LABELS, DIM)
    return centres[y] + rng.standard_normal((len(y), DIM)), y


def flipped(y: np.ndarray, count: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(y with `count` items moved to another label, those items)."""
    rng = np.random.default_rng(seed)
    items = rng.choice(len(y), count, replace=False)
    noisy = y.copy()
    noisy[items] = (y[items] + rng.integers(1, LABELS, count)) % LABELS
    return noisy, items


def test_flipped_labels_rank_first():
    X, y = clusters()
    noisy, items = flipped(y, 8)
    found = suspects(X, noisy, LABELS, n=8)
    assert {s.index for s in found} == set(items.tolist())
    assert all(s.given == noisy[s.index] and s.predicted == y[s.index] for s in found)  # the head names the truth
    probabilities = [s.probability for s in found]
    assert probabilities == sorted(probabilities) and probabilities[-1] < 0.5
    assert json.loads(json.dumps([s.as_dict() for s in found]))[0] == found[0].as_dict()
    assert suspects(X, noisy, LABELS, n=8) == found  # seeded: the same list again


def test_an_items_own_label_never_reaches_the_head_that_scores_it():
    """With the folds fixed, changing y[i] refits the heads of the other folds, not the one that
    scores i: i's fold is unchanged to the bit, the other folds are not (so the change did reach
    the heads, and the assertion could fail). With the folds drawn from the labels (`suspects`),
    a changed label may move items between folds; hence the folds fixed here."""
    X, y = clusters()
    splits = folds_of(y, 5, 0)
    before = out_of_fold(X, y, LABELS, splits)
    for i in (0, 45, 119):
        changed = y.copy()
        changed[i] = (y[i] + 1) % LABELS
        after = out_of_fold(X, changed, LABELS, splits)
        fold = next(test for _, test in splits if i in test)
        assert np.array_equal(after[fold], before[fold]), (i, before[i], after[i])
        others = np.setdiff1d(np.arange(len(y)), fold)
        assert not np.array_equal(after[others], before[others])


def test_suspects_score_with_the_projects_folds():
    X, y = clusters()
    noisy, _ = flipped(y, 6)
    expected = out_of_fold(X, noisy, LABELS, folds_of(noisy, 5, 3), 3)
    for s in suspects(X, noisy, LABELS, n=len(y), seed=3):
        assert s.probability == expected[s.index, s.given] and s.predicted == int(expected[s.index].argmax())


def test_ties_in_a_seeded_order():
    probs = np.full((6, 2), 0.5)
    y = np.zeros(6, np.int64)
    first = [s.index for s in ranked(probs, y, 6, seed=0)]
    assert sorted(first) == list(range(6)) and first == [s.index for s in ranked(probs, y, 6, seed=0)]
    assert any([s.index for s in ranked(probs, y, 6, seed=k)] != first for k in range(1, 5))
    probs[4] = (0.1, 0.9)
    assert ranked(probs, y, 6, seed=0)[0].index == 4  # a lower probability comes before every tie


def test_fewer_items_of_a_label_than_folds_gives_fewer_folds():
    X, y = clusters()
    keep = np.concatenate([np.flatnonzero(y != 3), np.flatnonzero(y == 3)[:3]])  # label 3: 3 items, folds=5
    found = suspects(X[keep], y[keep], LABELS, n=1000)
    assert len(found) == len(keep) and all(s.probability is not None for s in found)  # n beyond the items: all of them
    assert sorted(s.index for s in found) == list(range(len(keep)))


def test_a_label_with_one_item_is_listed_last_without_a_probability():
    X, y = clusters()
    keep = np.concatenate([np.flatnonzero(y != 3), np.flatnonzero(y == 3)[:1]])
    found = suspects(X[keep], y[keep], LABELS, n=len(keep))
    assert found[-1] == Suspect(len(keep) - 1, 3, None, None, None)
    assert all(s.probability is not None and s.predicted != 3 for s in found[:-1])
    assert found[-1].as_dict()["probability"] is None
    assert len(suspects(X[keep], y[keep], LABELS, n=5)) == 5


def test_one_label_raises_and_says_why():
    X, y = clusters()
    with pytest.raises(TaskError, match="at least two labels with 2 or more items"):
        suspects(X, np.zeros_like(y), LABELS, n=5)
    lone = np.zeros_like(y)
    lone[0] = 1  # a second label, but of one item: still nothing to hold out
    with pytest.raises(TaskError, match=r"items per label: \[119, 1, 0, 0\]"):
        suspects(X, lone, LABELS, n=5)


def test_bad_arguments():
    X, y = clusters()
    assert suspects(X, y, LABELS, n=0) == []
    with pytest.raises(FieldError, match="n must be 0 or more, got -1"):
        suspects(X, y, LABELS, n=-1)
    with pytest.raises(FieldError, match="folds must be 2 or more"):
        suspects(X, y, LABELS, n=3, folds=1)
    with pytest.raises(InputError, match="label indices 0 .. 3"):
        suspects(X, y + 1, LABELS, n=3)
    X[2, 0] = np.nan
    with pytest.raises(InputError, match="1 items have no features"):
        suspects(X, y, LABELS, n=3)
