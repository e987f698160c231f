"""Suspected label errors (the confident-learning idea): the answers the head, fitted without them,
finds least likely.

Every item is scored by a head that never saw it: the items are split into stratified folds
(`fitting.folds_of`, by the given labels) and each fold is scored by the `slmclassify fit` head
(`fitting.fit`: standardised states, multinomial logistic regression, C chosen by cross-validation
inside the training part) fitted on the other folds. So an item's own label never reaches the head
that scores it: with the folds held fixed, changing `y[i]` changes the heads that score the other
folds, never item i's probabilities (tests/test_suspects.py holds it to that). The suspects are the
items whose given label has the lowest out-of-fold probability, lowest first; ties in a seeded
random order, the same for the same seed.

Small labels. The folds are at most as many as the rarest label's items (`folds_of`), so a label
with 2 items makes it 2 folds. A label with a single item cannot be held out and still be learnt
(no head fitted without that item knows its label): such items are fitted on by nobody, get no
probability (`None`) and come after every scored item, in the seeded order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import FieldError, InputError, TaskError
from ..head.fitting import fit, folds_of
from .refit import LoopHead


@dataclass(frozen=True)
class Suspect:
    """One item's out-of-fold verdict on its given label."""

    index: int
    """The item's row in X / y."""
    given: int
    """Its given label (index)."""
    probability: float | None
    """The out-of-fold head's probability of `given` (None: its label has a single item, see the module docstring)."""
    predicted: int | None
    """The out-of-fold head's most probable label (None with `probability`)."""
    predicted_probability: float | None
    """Its probability."""

    def as_dict(self) -> dict:
        return asdict(self)


def suspects(X: np.ndarray, y: np.ndarray, n_labels: int, *, n: int, folds: int = 5, seed: int = 0) -> list[Suspect]:
    """The `n` items of X [m, d] whose given label y [m] (indices < `n_labels`) has the lowest
    out-of-fold probability, lowest first (fewer when there are fewer items); items of labels with
    a single item last, with no probability. TaskError with fewer than two labels of 2+ items."""
    X, y = _checked(X, y, n_labels, n, folds)
    counts = np.bincount(y, minlength=n_labels)
    scorable = counts[y] >= 2  # [m] a label with one item cannot be held out and learnt
    if int((counts >= 2).sum()) < 2:
        raise TaskError(f"finding suspects needs at least two labels with 2 or more items each (items per label: "
                        f"{counts.tolist()}): with one label, a head has no other label to suspect")
    rows = np.flatnonzero(scorable)
    probs = np.full((len(y), n_labels), np.nan)  # [m, L], NaN where not scored
    probs[rows] = out_of_fold(X[rows], y[rows], n_labels, folds_of(y[rows], folds, seed), seed)
    return ranked(probs, y, n, seed)


def out_of_fold(X: np.ndarray, y: np.ndarray, n_labels: int, splits, seed: int = 0) -> np.ndarray:
    """[m, L] each item's probabilities (0 for labels its head has no items of) from the head fitted
    on the training part of the `splits` pair ((train, test) index arrays) that tests it; NaN rows
    for items in no test part."""
    probs = np.full((len(y), n_labels), np.nan)
    for train, test in splits:
        fitted = fit(X[train], y[train], seed=seed)  # classes named str(index), as `refit.fit_head`'s
        head = LoopHead(fitted, np.array([int(s) for s in fitted.labels]), n_labels)
        probs[test] = head.probabilities(X[test])
    return probs


def ranked(probs: np.ndarray, y: np.ndarray, n: int, seed: int) -> list[Suspect]:
    """The first `n` items by the probability of their given label (probs [m, L], NaN rows unscored,
    last), ties and the unscored in a seeded order."""
    given = np.where(np.isnan(probs[:, 0]), np.inf, probs[np.arange(len(y)), y])  # [m]
    tiebreak = np.random.default_rng(seed).permutation(len(y))
    order = np.lexsort((tiebreak, given))[:n]  # by `given`, then `tiebreak`
    out = []
    for i in order:
        if np.isinf(given[i]):
            out.append(Suspect(int(i), int(y[i]), None, None, None))
        else:
            best = int(probs[i].argmax())
            out.append(Suspect(int(i), int(y[i]), float(given[i]), best, float(probs[i, best])))
    return out


def _checked(X, y, n_labels: int, n: int, folds: int) -> tuple[np.ndarray, np.ndarray]:
    """X as float64 [m, d] and y as int64 [m], or the error that says what is wrong."""
    if n < 0:
        raise FieldError("n", "{field} must be 0 or more, got {value}", value=n)
    if folds < 2:
        raise FieldError("folds", "{field} must be 2 or more, got {value}", value=folds)
    X, y = np.asarray(X, dtype=np.float64), np.asarray(y)
    if X.ndim != 2 or y.ndim != 1 or len(X) != len(y):
        raise InputError(f"suspects need features [m, d] and labels [m]; got shapes {X.shape} and {y.shape}")
    if len(y) and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= n_labels):
        raise InputError(f"labels must be label indices 0 .. {n_labels - 1}; got {np.unique(y)[:10].tolist()}")
    if np.isnan(X).any():
        raise InputError(f"{int(np.isnan(X).any(axis=1).sum())} items have no features (NaN rows: empty items); "
                         "leave them out")
    return X, y.astype(np.int64)
