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


def against_base(base: Classifier, others: dict[str, Callable], encoded, device: torch.device
                 ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """({name: items/s of others[name] over `base`}, {name: its [n, L] scores}), timed batch by batch.

    `others`: name -> a scorer of `EncodedItems` ([b, L] scores, like `Classifier.score(items).scores`). The
    units are the batches `base.score` makes (`Classifier.plan`), planned once; each is scored by
    `base` and by every other in turn (its items as one call; a Classifier plans them as the same
    single batch), the order rotating by one each batch, after one untimed call each on the last
    batch. Items in no batch (not scored) keep NaN scores.
    """
    batches = [rows for _, rows in base.plan(encoded)]  # input indices of each batch's items
    sides = [Side(name, score) for name, score in others.items()] + [Side(BASE, base.score)]
    timings = interleave(sides, units=[encoded.subset(rows) for rows in batches], rounds=1, sync=sync_of(device))
    scores = {}
    for name in others:
        scores[name] = np.full((len(encoded), len(base.task.labels)), np.nan)
        for rows, batch_scores in zip(batches, timings.last(name)):
            scores[name][rows] = batch_scores
    return {name: timings.speedup(BASE, name) for name in others}, scores


def against_base_encoded(base: Classifier, base_items, other: Classifier, other_items, name: str,
                         device: torch.device) -> tuple[float, np.ndarray]:
    """(items/s of `other` over `base`, its [n, L'] scores): as `against_base`, for a scorer whose
    items are encoded for another prompt (another task's prefix: `other_items`, the same texts in the
    same order); each batch of `base.plan` is scored by both, in turns."""
    batches = [rows for _, rows in base.plan(base_items)]
    sides = [Side(name, lambda rows: other.score(other_items.subset(rows)).scores),
             Side(BASE, lambda rows: base.score(base_items.subset(rows)).scores)]
    timings = interleave(sides, units=batches, rounds=1, sync=sync_of(device))
    scores = np.full((len(other_items), len(other.trie.labels)), np.nan)
    for rows, batch_scores in zip(batches, timings.last(name)):
        scores[rows] = batch_scores
    return timings.speedup(BASE, name), scores
