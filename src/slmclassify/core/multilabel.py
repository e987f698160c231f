"""Multi-label scoring: every label a yes/no question, all answered in the item's one forward pass.

The prompt is the single-label one up to the generation prompt (system turn with the label list and
how to answer, the item as the last user turn), so the item's tokens, the prefix cache and the
per-item checks are unchanged. After the generation prompt each label gets two branches of the
label trie, its name, a colon and the answer:

    ... <assistant turn starts> billing: yes        ... technical: yes
                                billing: no             technical: no

Each branch attends to the prefix, the item and its own tokens only (the trie's tree mask), so all
2L branches share the item's keys and values and cost a few tokens each. A branch's score is the
sum of its tokens' log-probabilities (`full` mode); the name and colon are the same in both branches
of a label, so they cancel in P(yes) / (P(yes) + P(no)), which is the label's probability: the
model's answer to "does this label apply?" after it has named the label. The reference path scores
the same branches through the unmodified Hugging Face forward (`reference.py`), so `verify` and the
probes check every branch as they check single labels.

Contextual calibration is per label: the mean P(yes) on the content-free inputs is the label's
prior, and its log-odds are subtracted from each item's (then divided by the task's temperature).
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .results import EMPTY, Result

ANSWERS = ("yes", "no")


def branches(labels: tuple[str, ...]) -> tuple[str, ...]:
    """The scored label-trie strings: for each label, `name: yes` then `name: no`."""
    return tuple(f"{label}: {answer}" for label in labels for answer in ANSWERS)


def log_odds(scores: np.ndarray) -> np.ndarray:
    """[n, 2L] branch scores → [n, L] log P(yes) - log P(no) per label (NaN rows stay NaN)."""
    return scores[:, 0::2] - scores[:, 1::2]


def prior_log_odds(scores: np.ndarray) -> np.ndarray:
    """[k, 2L] content-free branch scores → [L] the log-odds of each label's mean P(yes) (its bias)."""
    p = _sigmoid(log_odds(scores)).mean(axis=0)
    return np.log(p) - np.log1p(-p)


def adjust(scores: np.ndarray, bias: np.ndarray | None, temperature: float) -> np.ndarray:
    """[n, 2L] branch scores → [n, L] calibrated log-odds: (log-odds - bias) / temperature."""
    z = log_odds(scores)
    return (z if bias is None else z - bias[None, :]) / temperature


def probabilities(calibrated: np.ndarray) -> np.ndarray:
    """[n, L] calibrated log-odds → [n, L] P(yes) per label."""
    return _sigmoid(calibrated)


def make_results(labels: tuple[str, ...], scores: np.ndarray, calibrated: np.ndarray, status: list[str],
                 thresholds: tuple[float, ...], min_confidence: float, separator: str = ";") -> list[Result]:
    """One Result per item: `labels` those at or above their threshold, `label` them joined by
    `separator`, `probabilities` P(yes) per label, `confidence` the least sure decision (min over
    labels of max(p, 1 - p)); `needs_review` when it is below `min_confidence` or no label is chosen."""
    probs = probabilities(np.nan_to_num(calibrated, nan=0.0))
    cut = np.asarray(thresholds, dtype=np.float64)
    names = branches(labels)
    results = []
    for i, st in enumerate(status):
        if st == EMPTY:
            results.append(Result(None, None, {}, True, st))
            continue
        chosen = tuple(label for label, p, t in zip(labels, probs[i], cut) if p >= t)
        conf = float(confidence(probs[i][None, :])[0])
        results.append(Result(
            label=separator.join(chosen), confidence=conf,
            probabilities={label: float(p) for label, p in zip(labels, probs[i])},
            needs_review=conf < min_confidence or not chosen, status=st,
            scores={name: float(s) for name, s in zip(names, scores[i])}, labels=chosen))
    return results


def confidence(probs: np.ndarray) -> np.ndarray:
    """[n, L] P(yes) → [n] each item's least sure decision: min over labels of max(p, 1 - p)."""
    return np.maximum(probs, 1 - probs).min(axis=1)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def split_labels(text: str | None, separator: str = ";") -> tuple[str, ...]:
    """A gold cell of several labels, `a; b`, → ('a', 'b'): stripped, empty parts and repeats dropped."""
    seen: dict[str, None] = {}
    for part in (text or "").split(separator):
        if part.strip():
            seen.setdefault(part.strip())
    return tuple(seen)


def canonical_labels(text: str | None, task) -> str:
    """A gold cell with its labels in the task's order, joined by the task's separator (labels the
    task does not have last, sorted), so that it equals a result's `label` when the sets are equal."""
    names = split_labels(text, task.label_separator)
    order = {label: i for i, label in enumerate(task.labels)}
    return task.label_separator.join(sorted(names, key=lambda n: (order.get(n, len(order)), n)))


def gold_matrix(cells, labels: tuple[str, ...], separator: str = ";", source: str = "the gold column") -> np.ndarray:
    """[n, L] bool of `;`-separated gold cells (an empty cell: no label applies). A label the task
    does not have is refused, naming its row (1-based) and the labels."""
    index = {label: i for i, label in enumerate(labels)}
    gold = np.zeros((len(cells), len(labels)), dtype=bool)
    for row, cell in enumerate(cells, start=1):
        for name in split_labels(cell, separator):
            if name not in index:
                raise InputError(f"{source}: row {row} has gold label {name!r}, which is not in the label set "
                                 f"{list(labels)} (labels are separated by {separator!r})")
            gold[row - 1, index[name]] = True
    return gold


def _counts(pred: np.ndarray, gold: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (pred & gold).sum(0), (pred & ~gold).sum(0), (~pred & gold).sum(0)


def _f1(tp, fp, fn) -> np.ndarray:
    tp, fp, fn = (np.asarray(x, dtype=np.float64) for x in (tp, fp, fn))
    denom = 2 * tp + fp + fn
    return np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)


def metrics(probs: np.ndarray, gold: np.ndarray, thresholds, labels: tuple[str, ...]) -> dict:
    """Micro and macro F1, per-label precision / recall / F1 / support, subset accuracy and Hamming
    loss of the predictions P(yes) >= threshold against [n, L] bool gold."""
    report = _report(probs >= np.asarray(thresholds, dtype=np.float64)[None, :], gold, labels)
    for entry, t in zip(report["per_label"].values(), thresholds):
        entry["threshold"] = float(t)
    return report


def _report(pred: np.ndarray, gold: np.ndarray, labels: tuple[str, ...]) -> dict:
    """`metrics` of [n, L] bool predictions (without thresholds)."""
    tp, fp, fn = _counts(pred, gold)
    precision = np.divide(tp, tp + fp, out=np.zeros(len(labels)), where=(tp + fp) > 0)
    recall = np.divide(tp, tp + fn, out=np.zeros(len(labels)), where=(tp + fn) > 0)
    f1 = _f1(tp, fp, fn)
    return {
        "items": int(len(gold)), "micro_f1": float(_f1(tp.sum(), fp.sum(), fn.sum())), "macro_f1": float(f1.mean()),
        "subset_accuracy": float((pred == gold).all(axis=1).mean()) if len(gold) else 0.0,
        "hamming_loss": float((pred != gold).mean()) if len(gold) else 0.0,
        "per_label": {label: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
                      for label, p, r, f, s in zip(labels, precision, recall, f1, gold.sum(0))},
    }


def pick_thresholds(probs: np.ndarray, gold: np.ndarray, target_precision: float | None = None,
                    fallback: float | None = None) -> list[float | None]:
    """Per label, the threshold on P(yes): F1-optimal (the midpoint between the scores that bracket
    it), or with `target_precision` the lowest one whose precision reaches it (most recall);
    `fallback` (None unless given) where a label has no positive item, or no threshold reaches the target."""
    out = []
    for j in range(probs.shape[1]):
        p, g = probs[:, j], gold[:, j]
        if not g.any():
            out.append(fallback)
            continue
        order = np.argsort(-p, kind="stable")
        p_sorted, g_sorted = p[order], g[order]
        tp = np.cumsum(g_sorted)
        fp = np.cumsum(~g_sorted)
        distinct = np.r_[p_sorted[1:] != p_sorted[:-1], True]  # cut only between different scores
        k = np.flatnonzero(distinct)
        if target_precision is None:
            score = _f1(tp[k], fp[k], g.sum() - tp[k])
        else:
            precision = tp[k] / (tp[k] + fp[k])
            ok = precision >= target_precision
            if not ok.any():
                out.append(fallback)
                continue
            score = np.where(ok, tp[k], -1)
        best = k[int(np.argmax(score))]  # the first best: the highest threshold among ties
        below = p_sorted[best + 1] if best + 1 < len(p_sorted) else 0.0
        out.append(float(min(max((p_sorted[best] + below) / 2, 1e-6), 1 - 1e-6)))
    return out


def cross_fitted(probs: np.ndarray, gold: np.ndarray, labels: tuple[str, ...], target_precision: float | None = None,
                 seed: int = 0, fallback: float = 0.5) -> dict:
    """`metrics` at thresholds each half's items did not pick: the items are split in two at random
    (seeded), each half predicted with the thresholds picked on the other half (`fallback` where a
    half picks none), so the figures are not measured on the data the thresholds were tuned on."""
    halves = np.random.default_rng(seed).permutation(len(gold)) % 2 == 0
    pred = np.zeros_like(gold, dtype=bool)
    for part in (halves, ~halves):  # this half predicted at the other half's thresholds
        picked = pick_thresholds(probs[~part], gold[~part], target_precision, fallback=fallback)
        pred[part] = probs[part] >= np.array(picked)[None, :]
    return _report(pred, gold, labels)
