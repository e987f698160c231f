"""Features for a head, read on the fast path: hidden states from a few layers (the same forward that
scores the labels), mean-pooled over the item's own tokens or at its last token (`core/taps.py`),
and the calibrated label log-probabilities.

`fit` reads every candidate in its one pass and lets cross-validation choose among the feature
sets (`feature_sets`): the mean-pooled states win on topic-like tasks (support tickets, intents,
bank messages, news), the last token's on some reasoning tasks (docs/learned-heads.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..classifier import Classifier
from ..core.encode import EncodedItems
from ..core.taps import Taps

MEAN_DEPTHS = (0.2, 0.4, 0.6, 0.8)
"""Layers whose mean-pooled states a head reads, as fractions of the model's depth."""
LAST_DEPTHS = (0.5, 0.75, 1.0)
"""Layers whose last-token states a head reads (1.0 = the final, normed state)."""


def layers_at(n_layers: int, depths, top: int | None = None) -> tuple[int, ...]:
    """Layer numbers (1 .. top, default n_layers) at the given fractions of the depth, without repeats."""
    top = n_layers if top is None else top
    return tuple(sorted({max(1, min(top, round(d * n_layers))) for d in depths}))


def candidate_taps(n_layers: int) -> Taps:
    """Everything `fit` reads in its one pass: the mean-pooled and the last-token layers."""
    return Taps(last=layers_at(n_layers, LAST_DEPTHS), mean=layers_at(n_layers, MEAN_DEPTHS, n_layers - 1))


def default_taps(n_layers: int) -> Taps:
    """What a head reads without a choice (a multi-label task's one-vs-rest heads): the mean-pooled
    layers, the better features at a few labels per class on every data set measured."""
    return Taps(mean=layers_at(n_layers, MEAN_DEPTHS, n_layers - 1))


def loop_taps(n_layers: int) -> Taps:
    """What the labelling loop's refits read: the deepest mean layer alone (⅘ of the depth). With the
    loop's fixed regularisation and a few answers per label, it beat the four mean layers on three
    of four data sets and stayed within a point of them on the fourth (docs/learned-heads.md, "Few labels"), with a quarter
    of their width to hold for every item of the pool."""
    return Taps(mean=default_taps(n_layers).mean[-1:])


def feature_sets(blocks: Taps | Sequence[Taps], hidden: int, extra: int = 0) -> dict[str, tuple[Taps, np.ndarray]]:
    """The feature sets a head chooses among, from the states of one pass per block of taps ([n,
    len(taps) * hidden] each, `last` layers first, the blocks side by side) and `extra` columns
    appended after them (the label scores): {name: (the taps it reads, its columns)}, in order of
    preference. With several mean layers, the deepest one alone is a set too (`mean-deep`): fewer
    features to fit, it won at 8 items per label on three of four data sets (docs/learned-heads.md,
    "Few labels"). An echoed block's sets are named with " (echo)" (`fit` reads the texts once and
    twice: "Echo")."""
    blocks = [blocks] if isinstance(blocks, Taps) else list(blocks)
    total = sum(len(taps) for taps in blocks) * hidden
    tail = np.arange(total, total + extra)
    sets, start = {}, 0
    for taps in blocks:
        end, width, suffix = start + len(taps) * hidden, len(taps.last) * hidden, " (echo)" if taps.echo else ""
        if taps.mean:
            sets["mean" + suffix] = (Taps(mean=taps.mean, echo=taps.echo), np.concatenate([np.arange(start + width, end), tail]))
        if taps.last:
            sets["last" + suffix] = (Taps(last=taps.last, echo=taps.echo), np.concatenate([np.arange(start, start + width), tail]))
        if taps.mean and taps.last:
            sets["mean+last" + suffix] = (taps, np.concatenate([np.arange(start, end), tail]))
        if len(taps.mean) > 1:
            sets["mean-deep" + suffix] = (Taps(mean=taps.mean[-1:], echo=taps.echo),
                                          np.concatenate([np.arange(end - hidden, end), tail]))
        start = end
    return sets


def anchor_texts(task) -> dict[str, str]:
    """{label: its description} for the labels of `task` that have one: each read as an item gives
    that label's anchor (`fitting.Anchors`). A name alone is no anchor: on BIG-bench's yes/no tasks
    the states of 'Yes' or 'True' told a head nothing of the items and cost up to 4 points at 8 items
    per label (docs/learned-heads.md, "Few labels"). None for a template of several fields: a
    description is not a record of them."""
    if task.multi_field or not task.descriptions:
        return {}
    return {label: d.strip() for label, d in zip(task.labels, task.descriptions) if d.strip()}


def collect(classifier: Classifier, encoded: EncodedItems, taps: Taps,
            progress=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(raw label scores [n, L], calibrated scores [n, L], states [n, len(taps)*hidden]) in one pass
    over `encoded`, the texts as `taps` read them (`classifier.encode(texts, taps)`).

    Empty items have NaN rows.
    """
    scored = classifier.score(encoded, progress, taps=taps)
    return scored.scores, classifier.calibration.calibrated(scored.scores), scored.states
