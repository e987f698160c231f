"""A head without labelled items: each label's description (or name) read as an item, against each
item's mean-pooled state near the top of the model, by cosine similarity.

Zero-shot scoring reads the label tokens' probabilities after the prompt; a small model's are
weak (0.43 on the demo tickets, calibrated). The same forward's states carry the topic better: an
item's mean-pooled state at the last layer before the final norm, centred on the mean of the items
the head is made from, points towards the state of its label's description (0.76 on the demo
tickets, docs/learned-heads.md, "Zero-shot from the same states"). The head is a `Head` with
`cosine` set: `mean` the items' mean state, `scale` 1, `coef` the centred descriptions' unit
directions over `TEMPERATURE`, so `classify --head` reads it like any head (one pass, streaming,
resume), and every item's scores depend on that item alone.
"""

from __future__ import annotations

import numpy as np

from ..core.taps import Taps
from ..errors import InputError
from .model import Head

TEMPERATURE = 0.04
"""Logits are cosine similarities over this: the accuracy does not depend on it, the confidence
does. On the tickets, bank messages, news headlines and intents, 0.03 and 0.05 gave an expected
calibration error of 0.04–0.14 and 0.03–0.27 (0.01: 0.10–0.30; 0.1: 0.22–0.42)."""


def description_taps(n_layers: int) -> Taps:
    """The state the head reads: the mean over the item of the last layer before the final norm."""
    return Taps(mean=(max(1, n_layers - 1),))


def label_words(task) -> tuple[str, ...]:
    """Each label's description, or else its name with `_` and `-` read as spaces."""
    descriptions = task.descriptions or ("",) * len(task.labels)
    return tuple(d.strip() or label.replace("_", " ").replace("-", " ").strip() or label
                 for label, d in zip(task.labels, descriptions))


def description_head(states: np.ndarray, described: np.ndarray, labels: tuple[str, ...], taps: Taps, *,
                     model: dict, task: dict, info: dict) -> Head:
    """The head from the items' states [n, F] (NaN rows: empty items, left out of the mean) and the
    labels' description states [L, F]."""
    ok = ~np.isnan(states).any(axis=1)
    if ok.sum() < 2:
        raise InputError("a head from the descriptions needs at least two non-empty items to centre on")
    centre = states[ok].astype(np.float64).mean(axis=0)
    directions = described.astype(np.float64) - centre
    directions /= np.maximum(np.linalg.norm(directions, axis=1, keepdims=True), 1e-12)  # as `Head.cosine` does the items
    return Head(labels=labels, taps=taps, use_scores=False, mean=centre, scale=np.ones_like(centre),
                coef=directions / TEMPERATURE, intercept=np.zeros(len(labels)), model=model, task=task,
                info=info, cosine=True)
