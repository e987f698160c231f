"""Other scorers timed against ours on our own batches, interleaved (`timing.interleave`): the (g)
rows of `slmclassify bench` (ours in other precisions) and its (i) rows (CTranslate2)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..backends.sync import sync_of
from ..classifier import Classifier
from ..timing import Side, interleave

BASE = "d"
"""The side name of the base scorer (ours, default settings: the bench's row d)."""


def against_base(base: Classifier, others: dict[str, Callable], encoded, device: torch.device,
                 items: dict | None = None) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """({name: items/s of others[name] over `base`}, {name: its [n, L'] scores}), timed batch by batch.

    `others`: name -> a scorer of `EncodedItems` ([b, L'] scores, like `Classifier.score(items).scores`). The
    units are the batches `base.score` makes (`Scorer.plan`), planned once; each is scored by
    `base` and by every other in turn (its items as one call; a Classifier plans them as the same
    single batch), the order rotating by one each batch, after one untimed call each on the last
    batch. `items`: {name: the same texts encoded for that other's own prompt} (another task's
    prefix, e.g. the multi-label row), cut into the same batches. Items in no batch keep NaN scores.
    """
    batches = [rows for _, rows in base.scorer.plan(encoded)]  # input indices of each batch's items
    cut = {BASE: [encoded.subset(rows) for rows in batches]}
    for name in others:
        cut[name] = [items[name].subset(rows) for rows in batches] if items and name in items else cut[BASE]
    sides = [Side(name, lambda k, score=score, units=cut[name]: score(units[k])) for name, score in others.items()]
    sides.append(Side(BASE, lambda k: base.score(cut[BASE][k])))
    timings = interleave(sides, units=list(range(len(batches))), rounds=1, sync=sync_of(device))
    scores = {}
    for name in others:
        parts = timings.last(name)
        scores[name] = np.full((len(encoded), parts[0].shape[1] if parts else len(base.task.labels)), np.nan)
        for rows, batch_scores in zip(batches, parts):
            scores[name][rows] = batch_scores
    return {name: timings.speedup(BASE, name) for name in others}, scores
