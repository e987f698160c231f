"""Fitting a head: standardise, multinomial logistic regression with C chosen by cross-validation,
nested cross-validation for honest figures, and the learning curve (accuracy vs items per label).

Everything is seeded: the same features give the same head, folds and curve.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .model import linear_log_probabilities

C_GRID = tuple(float(c) for c in np.logspace(-3, 0, 7))
"""Inverse regularisation strengths tried by cross-validation (on standardised features)."""
CURVE_SIZES = (4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Fitted:
    """The numbers of a fitted head (see `Head`)."""

    labels: tuple[str, ...]
    mean: np.ndarray  # [F]
    scale: np.ndarray  # [F]
    coef: np.ndarray  # [K, F]
    intercept: np.ndarray  # [K]
    C: float

    def log_probabilities(self, X: np.ndarray) -> np.ndarray:
        return linear_log_probabilities(X, self.mean, self.scale, self.coef, self.intercept)


def fit(X: np.ndarray, y: list[str] | np.ndarray, *, seed: int = 0, folds: int = 5,
        Cs: tuple[float, ...] = C_GRID) -> Fitted:
    """Standardise X [n, F], choose C by stratified `folds`-fold CV (log-loss), refit on all of X."""
    from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold

    y = np.asarray(y)
    labels, counts = np.unique(y, return_counts=True)
    if len(labels) < 2:
        raise InputError(f"a head needs at least two labels in the gold column, got {list(labels)}")
    mean = X.mean(axis=0)
    scale = X.std(axis=0)
    scale[scale < 1e-12] = 1.0
    Z = (X - mean) / scale
    k = int(min(folds, counts.min()))
    from threadpoolctl import threadpool_limits

    # One BLAS thread: these small products gain nothing from more, and on a busy machine the
    # threads' barriers made each fit ~10x slower (docs/learned-heads.md).
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")  # convergence warnings at the weakest regularisation tried
        if k >= 2 and len(Cs) > 1:
            cv = StratifiedKFold(k, shuffle=True, random_state=seed)
            model = LogisticRegressionCV(Cs=list(Cs), cv=cv, scoring="neg_log_loss", max_iter=1000).fit(Z, y)
            C = float(model.C_[0])
        else:  # too few items per label to cross-validate: the middle of the grid
            C = float(Cs[len(Cs) // 2])
            model = LogisticRegression(C=C, max_iter=1000).fit(Z, y)
    coef, intercept = np.asarray(model.coef_, dtype=np.float64), np.asarray(model.intercept_, dtype=np.float64)
    if len(model.classes_) == 2:  # sklearn keeps one row, the second class's logit; softmax([0, z]) = sigmoid
        coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
    return Fitted(labels=tuple(str(c) for c in model.classes_), mean=mean, scale=scale, coef=coef,
                  intercept=intercept, C=C)


def cross_validated(X: np.ndarray, y: np.ndarray, labels: tuple[str, ...], *, folds: int = 5, seed: int = 0,
                    per_label: int | None = None) -> np.ndarray:
    """[n, K] out-of-fold probabilities (columns in `labels` order), C chosen inside each fold.

    With `per_label`, each fold's head is fitted on at most that many items per label of its
    training part (a seeded sample), and tested on the whole held-out part.
    """
    from sklearn.model_selection import StratifiedKFold

    y = np.asarray(y)
    probs = np.zeros((len(y), len(labels)))
    rng = np.random.default_rng(seed)
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(X, y):
        if per_label is not None:
            train = np.concatenate([rng.permutation(train[y[train] == lab])[:per_label] for lab in labels])
        head = fit(X[train], y[train], seed=seed)
        cols = [head.labels.index(lab) if lab in head.labels else None for lab in labels]
        lp = head.log_probabilities(X[test])
        probs[test] = np.stack([np.exp(lp[:, c]) if c is not None else np.zeros(len(test)) for c in cols], axis=1)
    return probs


def learning_curve(X: np.ndarray, y: np.ndarray, labels: tuple[str, ...], *, sizes=CURVE_SIZES, folds: int = 5,
                   seed: int = 0) -> list[tuple[int, float]]:
    """(items per label, cross-validated accuracy) for each size the training folds can supply."""
    y = np.asarray(y)
    smallest = min(int((y == lab).sum()) for lab in labels) * (folds - 1) // folds
    gold = np.array([labels.index(v) for v in y])
    return [(n, float((cross_validated(X, y, labels, folds=folds, seed=seed, per_label=n).argmax(1) == gold).mean()))
            for n in sizes if n <= smallest]
