"""Features for a head, read on the fast path: hidden states at each item's last token from a few
layers (the same forward that scores the labels), and the calibrated label log-probabilities."""

from __future__ import annotations

import numpy as np

from ..classifier import Classifier
from ..core.encode import EncodedItems

DEFAULT_DEPTHS = (0.5, 0.75, 1.0)
"""Which layers a head reads by default, as fractions of the model's depth (1.0 = the final,
normed state). Chosen on the intent data (docs/learned-heads.md)."""


def default_taps(n_layers: int, depths=DEFAULT_DEPTHS) -> tuple[int, ...]:
    """Layer numbers (1 .. n_layers) at the given fractions of the depth, without repeats."""
    return tuple(sorted({max(1, min(n_layers, round(d * n_layers))) for d in depths}))


def collect(classifier: Classifier, encoded: EncodedItems, taps: tuple[int, ...],
            progress=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(raw label scores [n, L], calibrated scores [n, L], states [n, len(taps)*hidden]) in one pass.

    Empty items have NaN rows.
    """
    scores, states = classifier.score(encoded, progress, taps=taps)
    return scores, classifier.calibrated(scores), states
