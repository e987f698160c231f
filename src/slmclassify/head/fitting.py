"""Fitting a head: standardise, multinomial logistic regression with C (and, given candidates, the
feature set) chosen by cross-validation, nested cross-validation for honest figures, and the
learning curve (accuracy vs items per label).

The labels' own words are evidence too: each label's description read as an item gives a row of
states (`Anchors`), added to the training items of every fit, weighted as `ANCHOR_WEIGHT` items, and
never tested on (docs/learned-heads.md, "Anchors").

Everything is seeded: the same features give the same head, folds and curve.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .model import linear_log_probabilities

C_GRID = tuple(float(c) for c in np.logspace(-3, 0, 7))
"""Inverse regularisation strengths tried by cross-validation (on standardised features)."""
CURVE_SIZES = (4, 8, 16, 32, 64)
ANCHOR_WEIGHT = 8
"""How many items each label's anchor counts as in a fit (as that many copies of its row). On the
tickets and bank messages (the ⅘ mean layer, full half, 32 and 8 per label) 4, 8 and 16 were within
a point of each other, 1 was 1.4 to 3.1 points behind at the full half and 32 per label."""


@dataclass(frozen=True)
class Anchors:
    """The states of each label's description read as an item: [k, F] rows and their [k] labels."""

    X: np.ndarray
    y: np.ndarray

    def of(self, labels) -> Anchors | None:
        """The anchors of `labels` only (a head learns the labels its gold holds); None if none."""
        keep = np.isin(self.y, np.asarray(list(labels)))
        return Anchors(self.X[keep], self.y[keep]) if keep.any() else None

    def columns(self, columns) -> Anchors:
        return Anchors(self.X[:, columns], self.y)


@dataclass(frozen=True)
class Fitted:
    """The numbers of a fitted head (see `Head`)."""

    labels: tuple[str, ...]
    mean: np.ndarray  # [F]
    scale: np.ndarray  # [F]
    coef: np.ndarray  # [K, F]
    intercept: np.ndarray  # [K]
    C: float
    choice: str = ""
    """The feature set chosen among `fit`'s candidates ('' without candidates)."""
    columns: np.ndarray | None = None
    """The columns of X that set is (None: all of them)."""

    def log_probabilities(self, X: np.ndarray) -> np.ndarray:
        X = X if self.columns is None else X[:, self.columns]
        return linear_log_probabilities(X, self.mean, self.scale, self.coef, self.intercept)


def fit(X: np.ndarray, y: list[str] | np.ndarray, *, seed: int = 0, folds: int = 5,
        Cs: tuple[float, ...] = C_GRID, candidates: Mapping[str, np.ndarray] | None = None,
        groups: np.ndarray | None = None, anchors: Anchors | None = None) -> Fitted:
    """Standardise X [n, F], choose C by stratified `folds`-fold CV (log-loss), refit on all of X.
    `groups` ([n]): the folds keep each group's items together (`folds_of`). `anchors`: rows added to
    every training part (`ANCHOR_WEIGHT` copies each), never to a tested one.

    `candidates` ({name: columns of X}): fit each and keep the one with the fewest columns among those
    whose cross-validated log-loss is within one standard error (over the folds) of the best (the
    one-standard-error rule: with a few items per label, the best mean is partly luck, and the
    smaller set is the safer bet), of sets as wide the one with the better log-loss (the same layers
    read from the texts once and twice, "Echo" in docs/learned-heads.md); with too few items to
    cross-validate, the first with the fewest columns.
    """
    y = np.asarray(y)
    labels = np.unique(y)
    if len(labels) < 2:
        raise InputError(f"a head needs at least two labels in the gold column, got {list(labels)}")
    anchors = None if anchors is None else anchors.of(labels)
    if not candidates:
        return _fit(X, y, seed, folds, Cs, groups, anchors)[0]
    fits = []
    for name, columns in candidates.items():
        fitted, score, error = _fit(X[:, columns], y, seed, folds, Cs, groups, anchors and anchors.columns(columns))
        fits.append((dataclasses.replace(fitted, choice=name, columns=np.asarray(columns)), score, error))
    _, best, error = max(fits, key=lambda f: f[1])
    return min((f for f in fits if f[1] >= best - error), key=lambda f: (len(f[0].columns), -f[1]))[0]


def folds_of(y: np.ndarray, folds: int, seed: int, groups: np.ndarray | None = None) -> list:
    """Stratified (train, test) index pairs, at most `folds` of them and no more than the rarest
    label (or, with `groups`, the fewest groups of a label) allows; [] when fewer than two. With
    `groups`, every group's items fall in one fold: near copies of an item never test a head that
    learnt from them."""
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

    counts = np.unique(y, return_counts=True)[1]
    if groups is not None:
        counts = np.array([len(np.unique(groups[y == lab])) for lab in np.unique(y)])
    k = int(min(folds, counts.min()))
    if k < 2:
        return []
    if groups is None:
        return list(StratifiedKFold(k, shuffle=True, random_state=seed).split(y, y))
    return list(StratifiedGroupKFold(k, shuffle=True, random_state=seed).split(y, y, groups))


def _fit(X: np.ndarray, y: np.ndarray, seed: int, folds: int, Cs, groups=None,
         anchors: Anchors | None = None) -> tuple[Fitted, float, float]:
    """(the head, its mean cross-validated log-likelihood at the C chosen and that mean's standard
    error over the folds; -inf and 0 without CV)."""
    from sklearn.linear_model import LogisticRegression, LogisticRegressionCV

    splits = folds_of(y, folds, seed, groups)
    if anchors is not None:  # the anchors' copies after the items: in every training part, in no tested one
        extra = np.arange(len(y), len(y) + ANCHOR_WEIGHT * len(anchors.y))
        splits = [(np.concatenate([train, extra]), test) for train, test in splits]
        X = np.concatenate([X] + [anchors.X.astype(X.dtype)] * ANCHOR_WEIGHT)
        y = np.concatenate([y] + [anchors.y] * ANCHOR_WEIGHT)
    mean = X.mean(axis=0)
    scale = X.std(axis=0)
    scale[scale < 1e-12] = 1.0
    Z = (X - mean) / scale
    from threadpoolctl import threadpool_limits

    # One BLAS thread: these small products gain nothing from more, and on a busy machine the
    # threads' barriers made each fit ~10x slower (docs/learned-heads.md).
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")  # convergence warnings at the weakest regularisation tried
        if splits and len(Cs) > 1:
            model = LogisticRegressionCV(Cs=list(Cs), cv=splits, scoring="neg_log_loss", max_iter=1000).fit(Z, y)
            C = float(model.C_[0])
            folds_by_C = next(iter(model.scores_.values()))  # [folds, Cs]: every class's alike
            at = int(folds_by_C.mean(axis=0).argmax())
            score = float(folds_by_C[:, at].mean())
            error = float(folds_by_C[:, at].std() / np.sqrt(len(folds_by_C)))
        else:  # too few items per label to cross-validate: the middle of the grid
            C = float(Cs[len(Cs) // 2])
            model = LogisticRegression(C=C, max_iter=1000).fit(Z, y)
            score, error = -np.inf, 0.0
    coef, intercept = np.asarray(model.coef_, dtype=np.float64), np.asarray(model.intercept_, dtype=np.float64)
    if len(model.classes_) == 2:  # sklearn keeps one row, the second class's logit; softmax([0, z]) = sigmoid
        coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
    return Fitted(labels=tuple(str(c) for c in model.classes_), mean=mean, scale=scale, coef=coef,
                  intercept=intercept, C=C), score, error


def cross_validated(X: np.ndarray, y: np.ndarray, labels: tuple[str, ...], *, folds: int = 5, seed: int = 0,
                    per_label: int | None = None, candidates: Mapping[str, np.ndarray] | None = None,
                    groups: np.ndarray | None = None, anchors: Anchors | None = None) -> np.ndarray:
    """[n, K] out-of-fold probabilities (columns in `labels` order), C (and the feature set among
    `candidates`) chosen inside each fold, the `anchors` in every fold's training part.

    With `per_label`, each fold's head is fitted on at most that many items per label of its
    training part (a seeded sample), and tested on the whole held-out part. With `groups`, the
    folds (outer and inner) keep each group together.
    """
    y = np.asarray(y)
    groups = None if groups is None else np.asarray(groups)
    probs = np.zeros((len(y), len(labels)))
    rng = np.random.default_rng(seed)
    splits = folds_of(y, folds, seed, groups)
    if not splits:
        raise InputError(f"{folds}-fold cross-validation needs at least two items (groups) of every label")
    for train, test in splits:
        if per_label is not None:
            train = np.concatenate([rng.permutation(train[y[train] == lab])[:per_label] for lab in labels])
        head = fit(X[train], y[train], seed=seed, candidates=candidates,
                   groups=None if groups is None else groups[train], anchors=anchors)
        cols = [head.labels.index(lab) if lab in head.labels else None for lab in labels]
        lp = head.log_probabilities(X[test])
        probs[test] = np.stack([np.exp(lp[:, c]) if c is not None else np.zeros(len(test)) for c in cols], axis=1)
    return probs


def learning_curve(X: np.ndarray, y: np.ndarray, labels: tuple[str, ...], *, sizes=CURVE_SIZES, folds: int = 5,
                   seed: int = 0, candidates: Mapping[str, np.ndarray] | None = None,
                   groups: np.ndarray | None = None, anchors: Anchors | None = None) -> list[tuple[int, float]]:
    """(items per label, cross-validated accuracy) for each size the training folds can supply."""
    y = np.asarray(y)
    smallest = min(int((y == lab).sum()) for lab in labels) * (folds - 1) // folds
    gold = np.array([labels.index(v) for v in y])
    return [(n, float((cross_validated(X, y, labels, folds=folds, seed=seed, per_label=n,
                                       candidates=candidates, groups=groups, anchors=anchors).argmax(1)
                                    == gold).mean()))
            for n in sizes if n <= smallest]
