"""One-vs-rest heads for multi-label tasks: one logistic regression per label (does it apply?) on
the same standardised features, C chosen by cross-validation per label as `fitting.fit` does.

A label's head gives the log-odds of "yes"; its probability is their sigmoid, thresholded per label
like zero-shot multi-label scores (`core/multilabel.py`). Seeded: the same features give the same heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .fitting import cross_validated, fit

NO_YES = ("no", "yes")


@dataclass(frozen=True)
class FittedOneVsRest:
    """The numbers of a multi-label head (see `Head`): row j of coef / intercept is label j's log-odds."""

    labels: tuple[str, ...]
    mean: np.ndarray  # [F]
    scale: np.ndarray  # [F]
    coef: np.ndarray  # [L, F]
    intercept: np.ndarray  # [L]
    C: tuple[float, ...]
    """Per label, the C its cross-validation chose."""


def check_counts(gold: np.ndarray, labels: tuple[str, ...], folds: int, source: str) -> None:
    """Each label needs `folds` items with it and `folds` without it, or its head cannot be cross-validated."""
    for j, label in enumerate(labels):
        have = int(gold[:, j].sum())
        if min(have, len(gold) - have) < folds:
            raise InputError("{source}: label {label!r} is on {have} of {n} items; a one-vs-rest head with {folds}-fold "
                             "cross-validation needs at least {folds} items with each label and {folds} without it "
                             "(label more items, or pass {folds_field})", names={"folds_field": "folds"},
                             source=source, label=label, have=have, n=len(gold), folds=folds)


def fit_one_vs_rest(X: np.ndarray, gold: np.ndarray, labels: tuple[str, ...], *, seed: int = 0,
                    folds: int = 5) -> FittedOneVsRest:
    """One binary head per label on X [n, F] against gold [n, L] bool, sharing the standardisation."""
    coef, intercept, Cs, mean, scale = [], [], [], None, None
    for j in range(len(labels)):
        one = fit(X, np.where(gold[:, j], "yes", "no"), seed=seed, folds=folds)
        yes = one.labels.index("yes")  # softmax over [no, yes] with row "no" at zero: the row of "yes" is the log-odds
        coef.append(one.coef[yes] - one.coef[1 - yes])
        intercept.append(one.intercept[yes] - one.intercept[1 - yes])
        Cs.append(one.C)
        mean, scale = one.mean, one.scale  # the same X each time: the same standardisation
    return FittedOneVsRest(labels=tuple(labels), mean=mean, scale=scale, coef=np.stack(coef),
                           intercept=np.array(intercept), C=tuple(Cs))


def cross_validated_one_vs_rest(X: np.ndarray, gold: np.ndarray, *, folds: int = 5, seed: int = 0) -> np.ndarray:
    """[n, L] out-of-fold P(yes) per label (each label's folds stratified on it, C chosen inside each fold)."""
    return np.stack([cross_validated(X, np.where(gold[:, j], "yes", "no"), NO_YES, folds=folds, seed=seed)[:, 1]
                     for j in range(gold.shape[1])], axis=1)

