"""The background refit of a labelling session: whenever the answers (or the scored pool) changed
since the last fit, fit the loop's head on the scored answers (`refit.py`), estimate its accuracy
from the cross-validated predictions, and publish head, estimate and auto-label threshold.

The fit runs without the session's lock, on a copy of the features it was given; the rows scored
while it ran get the new head's probabilities when it is published. The item on screen stays: the
new head ranks the next pick.

A task of questions has a head per question (`Pool.parts`, `Answers.parts`): each refit fits them
one after another in this one thread, on the same features of the same answered items, and
publishes each as it is done; `estimates` and `thresholds` are per question.
"""

from __future__ import annotations

import numpy as np

from . import refit
from .answers import Answers
from .pool import Pool
from .sync import Sync


class Refitter:
    """`run` is the thread's loop; `estimates`, `thresholds` (one per head: per question in a task of
    questions) and `fitting` are read with the lock held."""

    def __init__(self, pool: Pool, answers: Answers, sync: Sync, *, seed: int, target_accuracy: float | None):
        self.sync, self.seed, self.target_accuracy = sync, seed, target_accuracy
        self.parts = list(zip(pool.parts, answers.parts)) if pool.parts else [(pool, answers)]
        self.estimates: list[refit.Estimate | None] = [None] * len(self.parts)
        self.thresholds: list[float | None] = [None] * len(self.parts)
        self.fitting = False

    @property
    def estimate(self) -> refit.Estimate | None:
        """The head's estimate (a task of questions: the first question's; see `estimates`)."""
        return self.estimates[0]

    @property
    def threshold(self) -> float | None:
        return self.thresholds[0]

    def run(self) -> None:
        """Refit whenever the answers changed since the last fit; publish head, estimate, threshold."""
        sync = self.sync
        fitted_version = -1
        while True:
            with sync.lock:
                while not sync.closing and sync.version == fitted_version:
                    sync.changed.wait()
                if sync.closing:
                    return
                fitted_version = sync.version
                work = [(k, taken) for k, (pool, answers) in enumerate(self.parts)
                        if (taken := self._take(pool, answers)) is not None]
                if not work:
                    continue
                self.fitting = True
            try:
                for k, (X, y, fair, anchors) in work:
                    self._fit(k, X, y, fair, anchors)
            finally:
                with sync.lock:
                    self.fitting = False

    @staticmethod
    def _take(pool: Pool, answers) -> tuple | None:
        """(features, answers, which are random picks, the labels' anchor states) of the scored answers,
        or None while too few to fit (lock held)."""
        pos = pool.scored_among(answers.given)
        fair = answers.fair(pos)
        if pool.multi:
            y = answers.matrix(pos)
            if not refit.can_fit_multi(y):
                return None
        else:
            y = np.array([answers.given[p] for p in pos], dtype=np.int64)
            if not refit.can_fit(y, len(pool.labels)):
                return None
        return pool.features[pos].copy(), y, fair, pool.anchor_rows()

    def _fit(self, k: int, X: np.ndarray, y: np.ndarray, fair: np.ndarray, anchors) -> None:
        """Fit head `k` and its estimate without the lock, then publish them."""
        pool, sync, n_labels = self.parts[k][0], self.sync, len(self.parts[k][0].labels)
        if pool.multi:
            head = refit.fit_multi_head(X, y, self.seed)
            est = refit.estimate_multi(X, y, self.seed, fair)
        else:
            head = refit.fit_head(X, y, n_labels, self.seed, anchors)
            est = refit.estimate(X, y, n_labels, self.seed, fair, anchors)
        threshold = refit.auto_threshold(est, self.target_accuracy)
        with sync.lock:
            scored = np.flatnonzero(pool.scored)
            feats = pool.features[scored]
        probs = np.full((len(pool), n_labels), np.nan)
        probs[scored] = head.probabilities(feats)
        with sync.lock:
            pool.set_head(head, probs)
            self.estimates[k], self.thresholds[k] = est, threshold
