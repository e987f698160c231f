"""The head of the labelling loop: refitted as answers arrive, from 2 items per label, with a
cross-validated accuracy estimate and the share of the pool it could label on its own.

Honest estimates, or none. Only the random picks are a fair sample of the pool (the cold-start
picks are cluster centres, the uncertain ones the hardest items): the accuracy is cross-validated
on them alone, each held out a fold at a time while every other answer trains the head, with a 95%
Wilson interval; below `MIN_FAIR` random picks, or while a label among them has fewer than
`MIN_PER_LABEL_SEEN` answers, there is no estimate ("not enough answers yet"). The automatic share
is offered only at a confidence threshold where the LOWER bound of the accuracy of the held-out
random picks at or above it reaches the target, over at least `MIN_AUTO` of them.

The loop's head is the `slmclassify fit` head (standardised hidden states, multinomial logistic
regression) with C fixed at `LOOP_C` rather than chosen by cross-validation: with a few dozen
answers, a CV over C is noise and costs ~10 fits per refit. `outputs.fit_head` writes the final
head with C chosen by CV as `slmclassify fit` does. The simulation (`bench/label_sim.py`) uses
these same functions, so its curves are the loop's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core import multilabel
from ..head.fitting import C_GRID, Anchors, Fitted, fit

LOOP_C = C_GRID[len(C_GRID) // 2]
"""Inverse regularisation of the loop's head (on standardised features): the middle of `fit`'s
grid (~0.032), which `fit` also uses when it cannot cross-validate. In the simulation C = 0.03,
0.1 and 1 gave curves within a seed's spread of each other (docs/labelling.md)."""
MIN_PER_LABEL = 2
"""A head is fitted once at least two labels have this many answers each."""
FOLDS = 5


@dataclass(frozen=True)
class LoopHead:
    """A head over some of the task's labels, as [n, L] probabilities in the task's columns."""

    fitted: Fitted
    columns: np.ndarray
    """[K] the task's label index of each of the head's classes."""
    n_labels: int

    def probabilities(self, X: np.ndarray) -> np.ndarray:
        """[n, L] probabilities (0 for labels with no answers yet)."""
        out = np.zeros((len(X), self.n_labels))
        out[:, self.columns] = np.exp(self.fitted.log_probabilities(X.astype(np.float64)))
        return out


def can_fit(y: np.ndarray, n_labels: int) -> bool:
    """At least two labels with `MIN_PER_LABEL` answers each."""
    return int((np.bincount(y, minlength=n_labels) >= MIN_PER_LABEL).sum()) >= 2


def fit_head(X: np.ndarray, y: np.ndarray, n_labels: int, seed: int = 0, anchors: Anchors | None = None) -> LoopHead:
    """The loop's head on [m, d] features and [m] task label indices; `anchors` (label indices too):
    the labels' descriptions read as items (`fitting.Anchors`), learnt from for the labels answered."""
    fitted = fit(X.astype(np.float64), y, seed=seed, Cs=(LOOP_C,), anchors=anchors)  # classes in numeric order, named str(index)
    return LoopHead(fitted, np.array([int(s) for s in fitted.labels]), n_labels)


REPRESENTATIVE = ("random",)
"""Pick kinds whose answers are a fair sample of the pool: the random ones. The uncertain picks are
the hardest items, so an estimate on them says less than the head's accuracy on the pool (on the
intent data, 0.68 against 0.96); cold-start picks are cluster centres, and with them in, the page
read 10% at 10 answers (chance 20%) and 44% at 40 when the truth was 65%."""
MIN_FAIR = 20
"""No estimate from fewer random picks than this."""
MIN_PER_LABEL_SEEN = 3
"""No estimate while a label among the random picks has fewer answers than this."""
MIN_AUTO = 10
"""No automatic share from fewer held-out random picks above its threshold than this."""


@dataclass(frozen=True)
class Estimate:
    """The head's accuracy, cross-validated on the answers so far."""

    mean: float
    low: float
    high: float
    """95% Wilson interval of the accuracy over `n` out-of-fold predictions."""
    n: int
    on: str
    """What was held out: "random picks" (a fold at a time, the other answers always trained on)."""
    tested: np.ndarray
    """[n] indices (into the answers) of the out-of-fold predictions."""
    out_of_fold: np.ndarray
    """[n, L] their out-of-fold probabilities (multi-label: each label's P(yes))."""
    confidence: np.ndarray
    """[n] each one's confidence (`confidence_of`), for the auto-labelling threshold."""
    correct: np.ndarray
    """[n] bool: its out-of-fold prediction is its answer (multi-label: the whole label set)."""

    def as_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n, "on": self.on}


def enough(y: np.ndarray, representative: np.ndarray | None, n_labels: int) -> bool:
    """Whether the answers allow an honest estimate (see the module docstring)."""
    if representative is None or int(representative.sum()) < MIN_FAIR or not can_fit(y, n_labels):
        return False
    seen = np.unique(y[representative])
    return bool((np.bincount(y, minlength=n_labels)[seen] >= MIN_PER_LABEL_SEEN).all())


def estimate(X: np.ndarray, y: np.ndarray, n_labels: int, seed: int = 0,
             representative: np.ndarray | None = None, anchors: Anchors | None = None) -> Estimate | None:
    """Out-of-fold accuracy of the loop's head (up to 5 folds, at least 2 items per fold) on the
    `representative` answers ([m] bool), the others (and the `anchors`) always trained on; None
    without `enough` of them."""
    from sklearn.model_selection import KFold

    if not enough(y, representative, n_labels):
        return None
    tested = np.flatnonzero(representative)
    always = np.flatnonzero(~representative)
    folds = min(FOLDS, len(tested) // 2)
    probs = np.zeros((len(tested), n_labels))
    for train, test in KFold(folds, shuffle=True, random_state=seed).split(tested):
        train = np.concatenate([always, tested[train]])
        if len(np.unique(y[train])) < 2:
            continue  # a fold whose training part has one label: its items count as wrong
        probs[test] = fit_head(X[train], y[train], n_labels, seed, anchors).probabilities(X[tested[test]])
    return _estimate(tested, probs, probs.argmax(1) == y[tested], probs.max(1))


def _estimate(tested: np.ndarray, probs: np.ndarray, correct: np.ndarray, confidence: np.ndarray) -> Estimate:
    low, high = wilson(int(correct.sum()), len(tested))
    return Estimate(float(correct.mean()), low, high, len(tested), "random picks", tested, probs, confidence, correct)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k / n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def auto_threshold(est: Estimate | None, target: float | None) -> float | None:
    """The confidence at or above which the head labels on its own: the lowest threshold at which at
    least `MIN_AUTO` held-out random picks have a 95% Wilson LOWER bound of their accuracy at or
    above `target`; None without an estimate, a target, or such a threshold ("none yet")."""
    if est is None or target is None:
        return None
    confidence, correct = est.confidence, est.correct
    best = None
    for threshold in np.unique(confidence)[::-1]:  # from the most confident down
        above = confidence >= threshold
        if int(above.sum()) >= MIN_AUTO and wilson(int(correct[above].sum()), int(above.sum()))[0] >= target:
            best = float(threshold)
    return best


# ----- multi-label tasks: one binary head per label, answers as [m, L] bool label sets

@dataclass(frozen=True)
class MultiLoopHead:
    """One-vs-rest heads as [n, L] P(yes): a label with too few answers of either kind to fit gets
    its smoothed share of yes answers, (yes + 1) / (answers + 2), for every item."""

    fitted: tuple
    """Per label its `Fitted` binary head (classes "False", "True"), or None."""
    rates: np.ndarray
    """[L] the smoothed share of yes answers (used where `fitted` is None)."""

    def probabilities(self, X: np.ndarray) -> np.ndarray:
        out = np.tile(self.rates, (len(X), 1))
        for j, head in enumerate(self.fitted):
            if head is not None:
                out[:, j] = np.exp(head.log_probabilities(X.astype(np.float64))[:, head.labels.index("True")])
        return out


def _fittable(Y: np.ndarray) -> np.ndarray:
    """[L] bool: labels with `MIN_PER_LABEL` yes answers and as many no answers."""
    yes = Y.sum(0)
    return (yes >= MIN_PER_LABEL) & (len(Y) - yes >= MIN_PER_LABEL)


def can_fit_multi(Y: np.ndarray) -> bool:
    """At least one label with `MIN_PER_LABEL` answers of each kind."""
    return bool(len(Y)) and bool(_fittable(Y).any())


def fit_multi_head(X: np.ndarray, Y: np.ndarray, seed: int = 0) -> MultiLoopHead:
    """The loop's one-vs-rest heads on [m, d] features and [m, L] bool answers (C fixed at `LOOP_C`)."""
    fittable = _fittable(Y)
    fitted = tuple(fit(X.astype(np.float64), Y[:, j].astype(str), seed=seed, Cs=(LOOP_C,)) if fittable[j] else None
                   for j in range(Y.shape[1]))
    return MultiLoopHead(fitted, (Y.sum(0) + 1.0) / (len(Y) + 2.0))


def estimate_multi(X: np.ndarray, Y: np.ndarray, seed: int = 0,
                   representative: np.ndarray | None = None) -> Estimate | None:
    """As `estimate` for [m, L] bool answers: out-of-fold exact label sets (each label at P(yes) ≥
    0.5) on the random picks, the other answers always trained on; None below `MIN_FAIR` of them or
    while no label can be fitted."""
    from sklearn.model_selection import KFold

    if representative is None or int(representative.sum()) < MIN_FAIR or not can_fit_multi(Y):
        return None
    tested = np.flatnonzero(representative)
    always = np.flatnonzero(~representative)
    probs = np.zeros((len(tested), Y.shape[1]))
    for train, test in KFold(min(FOLDS, len(tested) // 2), shuffle=True, random_state=seed).split(tested):
        train = np.concatenate([always, tested[train]])
        probs[test] = fit_multi_head(X[train], Y[train], seed).probabilities(X[tested[test]])
    correct = ((probs >= 0.5) == Y[tested]).all(axis=1)
    return _estimate(tested, probs, correct, multilabel.confidence(probs))
