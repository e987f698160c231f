"""`bench/label_sim.py`'s other learners: fitted on the random strategy's picks, scored on the same
fixed test split, defined from the first answers (one label answered, labels with one answer)."""

from __future__ import annotations

import numpy as np

from slmclassify.bench import label_sim

WORDS = (("refund", "invoice", "charged", "card"), ("crash", "error", "app", "freezes"),
         ("password", "login", "email", "profile"))


def _texts(per: int = 20) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(0)
    gold = np.repeat(np.arange(len(WORDS)), per)
    texts = [" ".join(rng.choice(WORDS[g], 3)) + f" #{i}" for i, g in enumerate(gold)]
    return texts, gold


def test_baselines_fit_the_random_picks_and_separate_plain_words():
    texts, gold = _texts()
    test = label_sim.test_split(len(gold))
    pickable = ~test
    rows = label_sim.random_rows(pickable, seed=3, count=12)
    assert len(rows) == 12 and not test[rows].any()
    assert np.array_equal(rows[:5], label_sim.random_rows(pickable, seed=3, count=5))  # the same order at every size
    curve = label_sim.baseline_curve(label_sim.tfidf_predictor(texts, gold, test), gold, pickable, test, seeds=3,
                                     checkpoints=(12, 30))
    assert sorted(curve) == ["12", "30"] and curve["30"]["mean"] == 1.0  # every test text shares words with its label
    E = np.eye(3)[gold] + 0.01 * np.random.default_rng(1).standard_normal((len(gold), 3))
    embedded = label_sim.baseline_curve(label_sim.features_predictor(E, gold, test, 3), gold, pickable, test,
                                        seeds=2, checkpoints=(30,))
    assert embedded["30"]["mean"] == 1.0


def test_baselines_answer_with_one_label_or_one_answer_per_label():
    texts, gold = _texts()
    test = label_sim.test_split(len(gold))
    only_one = np.flatnonzero((gold == 1) & ~test)[:3]
    assert set(label_sim.tfidf_predictor(texts, gold, test)(only_one)) == {1}
    singles = np.array([np.flatnonzero((gold == g) & ~test)[0] for g in range(3)])
    predicted = label_sim.tfidf_predictor(texts, gold, test)(singles)
    assert predicted.shape == (int(test.sum()),) and set(predicted) <= {0, 1, 2}
    E = np.eye(3)[gold]
    assert set(label_sim.features_predictor(E, gold, test, 3)(only_one)) == {1}
