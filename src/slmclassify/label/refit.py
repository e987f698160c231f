"""The head of the labelling loop: refitted as answers arrive, from 2 items per label, with a
cross-validated accuracy estimate and the share of the pool it could label on its own.

The loop's head is the `slmclassify fit` head (standardised hidden states, multinomial logistic
regression) with C fixed at `LOOP_C` rather than chosen by cross-validation: with a few dozen
answers, a CV over C is noise and costs ~10 fits per refit. `LabelSession.fit` writes the final
head with C chosen by CV as `slmclassify fit` does. The simulation (`bench/label_sim.py`) uses
these same functions, so its curves are the loop's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.metrics import Evaluation
from ..head.fitting import C_GRID, Fitted, fit

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


def fit_head(X: np.ndarray, y: np.ndarray, n_labels: int, seed: int = 0) -> LoopHead:
    """The loop's head on [m, d] features and [m] task label indices."""
    fitted = fit(X.astype(np.float64), y, seed=seed, Cs=(LOOP_C,))  # classes in numeric order, named str(index)
    return LoopHead(fitted, np.array([int(s) for s in fitted.labels]), n_labels)


REPRESENTATIVE = ("cold", "random")
"""Pick kinds whose answers are a fair sample of the pool: the first, diverse picks (cluster
centres) and the random ones. The uncertain picks are the hardest items, so an estimate on them
says less than the head's accuracy on the pool (on the intent data, 0.68 against 0.96)."""
MIN_HONEST = 10
"""With fewer representative answers than this, the estimate is cross-validated on all answers."""


@dataclass(frozen=True)
class Estimate:
    """The head's accuracy, cross-validated on the answers so far."""

    mean: float
    low: float
    high: float
    """95% Wilson interval of the accuracy over `n` out-of-fold predictions."""
    n: int
    on: str
    """"representative answers" (held out a fold at a time, the other answers always trained on) or
    "all answers" (plain cross-validation, pessimistic once the picks follow the head's uncertainty)."""
    tested: np.ndarray
    """[n] indices (into the answers) of the out-of-fold predictions."""
    out_of_fold: np.ndarray
    """[n, L] their out-of-fold probabilities, for the auto-labelling threshold."""

    def as_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n, "on": self.on}


def estimate(X: np.ndarray, y: np.ndarray, n_labels: int, seed: int = 0,
             representative: np.ndarray | None = None) -> Estimate | None:
    """Out-of-fold accuracy of the loop's head (up to 5 folds, at least 2 items per fold) on the
    `representative` answers ([m] bool) when there are `MIN_HONEST` of them, else on all answers."""
    from sklearn.model_selection import KFold

    if not can_fit(y, n_labels) or len(y) < 4:
        return None
    honest = representative is not None and int(representative.sum()) >= MIN_HONEST
    tested = np.flatnonzero(representative) if honest else np.arange(len(y))
    always = np.flatnonzero(~representative) if honest else np.zeros(0, np.int64)
    folds = min(FOLDS, len(tested) // 2)
    probs = np.zeros((len(tested), n_labels))
    for train, test in KFold(folds, shuffle=True, random_state=seed).split(tested):
        train = np.concatenate([always, tested[train]])
        if len(np.unique(y[train])) < 2:
            continue  # a fold whose training part has one label: its items count as wrong
        probs[test] = fit_head(X[train], y[train], n_labels, seed).probabilities(X[tested[test]])
    correct = int((probs.argmax(1) == y[tested]).sum())
    low, high = wilson(correct, len(tested))
    return Estimate(correct / len(tested), low, high, len(tested),
                    "representative answers" if honest else "all answers", tested, probs)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k / n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def auto_threshold(est: Estimate, y: np.ndarray, labels: tuple[str, ...], target: float | None,
                   min_confidence: float) -> float | None:
    """The confidence above which the head labels on its own: the lowest threshold whose
    out-of-fold predictions reach `target` accuracy (`evaluate --target-accuracy`'s rule), or
    the task's `min_confidence` without a target; None when no threshold reaches the target."""
    if target is None:
        return min_confidence
    oof = est.out_of_fold
    ev = Evaluation(labels, y[est.tested], oof.argmax(1), oof.max(1))
    threshold, _ = ev.threshold_for(target)
    return threshold
