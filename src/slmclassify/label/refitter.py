"""The background refit of a labelling session: whenever the answers (or the scored pool) changed
since the last fit, fit the loop's head on the scored answers (`refit.py`), estimate its accuracy
from the cross-validated predictions, and publish head, estimate and auto-label threshold.

The fit runs without the session's lock, on a copy of the features it was given; the rows scored
while it ran get the new head's probabilities when it is published. The item on screen stays: the
new head ranks the next pick.
"""

from __future__ import annotations

import numpy as np

from . import refit
from .answers import Answers
from .pool import Pool
from .sync import Sync


class Refitter:
    """`run` is the thread's loop; `estimate`, `threshold` and `fitting` are read with the lock held."""

    def __init__(self, pool: Pool, answers: Answers, sync: Sync, *, seed: int, target_accuracy: float | None):
        self.pool, self.answers, self.sync = pool, answers, sync
        self.seed, self.target_accuracy = seed, target_accuracy
        self.estimate: refit.Estimate | None = None
        self.threshold: float | None = None
        self.fitting = False

    def run(self) -> None:
        """Refit whenever the answers changed since the last fit; publish head, estimate, threshold."""
        pool, sync, n_labels = self.pool, self.sync, len(self.pool.labels)
        fitted_version = -1
        while True:
            with sync.lock:
                while not sync.closing and sync.version == fitted_version:
                    sync.changed.wait()
                if sync.closing:
                    return
                fitted_version = sync.version
                pos = pool.scored_among(self.answers.given)
                fair = self.answers.fair(pos)
                if pool.multi:
                    y = self.answers.matrix(pos)
                    if not refit.can_fit_multi(y):
                        continue
                else:
                    y = np.array([self.answers.given[p] for p in pos], dtype=np.int64)
                    if not refit.can_fit(y, n_labels):
                        continue
                X = pool.features[pos].copy()
                self.fitting = True
            try:
                if pool.multi:
                    head = refit.fit_multi_head(X, y, self.seed)
                    est = refit.estimate_multi(X, y, self.seed, fair)
                else:
                    head = refit.fit_head(X, y, n_labels, self.seed)
                    est = refit.estimate(X, y, n_labels, self.seed, fair)
                threshold = refit.auto_threshold(est, self.target_accuracy)
                with sync.lock:
                    scored = np.flatnonzero(pool.scored)
                    feats = pool.features[scored]
                probs = np.full((len(pool), n_labels), np.nan)
                probs[scored] = head.probabilities(feats)
            finally:
                with sync.lock:
                    self.fitting = False
            with sync.lock:
                pool.set_head(head, probs)
                self.estimate, self.threshold = est, threshold
