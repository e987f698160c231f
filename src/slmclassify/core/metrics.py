"""`slmclassify evaluate`: accuracy, macro-F1, per-label precision/recall, confusion matrix,
expected calibration error and the coverage–accuracy curve, with the confidence threshold that
reaches a target accuracy.

Metrics are plain numpy on (gold index, predicted index, confidence) so they can be checked
against a hand-computed confusion matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import FieldError

ECE_BINS = 15


def check_target_accuracy(value: float | None, field: str = "target_accuracy") -> None:
    """A target accuracy is None (none asked) or in (0, 1]: refused otherwise, naming `field`. The
    one check of every request that takes one (`evaluate`'s, a labelling session's)."""
    if value is not None and not 0 < value <= 1:
        raise FieldError(field, "{field} must be in (0, 1], got {value}", value=value)


@dataclass
class Evaluation:
    """Metrics of one scoring configuration on labelled items."""

    labels: tuple[str, ...]
    gold: np.ndarray  # [n] gold label index
    predicted: np.ndarray  # [n] predicted label index
    confidence: np.ndarray  # [n] top probability
    name: str = ""
    target_accuracy: float | None = None
    extra: dict = field(default_factory=dict)
    accepted: np.ndarray | None = None
    """[n, L] bool: every label that counts as correct (BIG-bench items whose gold scores tie).
    When given, an item predicted as any accepted label has that label as its gold, so every
    metric below counts it as right; otherwise its gold stays `gold`."""

    def __post_init__(self) -> None:
        if self.accepted is not None:
            hit = self.accepted[np.arange(len(self.predicted)), self.predicted]
            self.gold = np.where(hit, self.predicted, self.gold)

    @property
    def accuracy(self) -> float:
        return float((self.gold == self.predicted).mean())

    @property
    def confusion(self) -> np.ndarray:
        """[L, L] counts: rows gold, columns predicted."""
        L = len(self.labels)
        matrix = np.zeros((L, L), dtype=np.int64)
        np.add.at(matrix, (self.gold, self.predicted), 1)
        return matrix

    def per_label(self) -> dict[str, dict[str, float]]:
        m = self.confusion
        out = {}
        for i, label in enumerate(self.labels):
            tp, predicted, actual = m[i, i], m[:, i].sum(), m[i, :].sum()
            precision = tp / predicted if predicted else 0.0
            recall = tp / actual if actual else 0.0
            f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
            out[label] = {"precision": float(precision), "recall": float(recall), "f1": float(f1),
                          "support": int(actual)}
        return out

    @property
    def macro_f1(self) -> float:
        present = [v["f1"] for v in self.per_label().values() if v["support"] > 0]
        return float(np.mean(present)) if present else 0.0

    @property
    def ece(self) -> float:
        """Expected calibration error over equal-width confidence bins."""
        return float(sum(abs(acc - conf) * count for acc, conf, count in self.reliability()) / len(self.gold))

    def reliability(self) -> list[tuple[float, float, int]]:
        """(accuracy, mean confidence, count) per non-empty confidence bin."""
        edges = np.linspace(0, 1, ECE_BINS + 1)
        which = np.clip(np.digitize(self.confidence, edges[1:-1], right=True), 0, ECE_BINS - 1)
        correct = self.gold == self.predicted
        return [(float(correct[which == b].mean()), float(self.confidence[which == b].mean()), int((which == b).sum()))
                for b in range(ECE_BINS) if (which == b).any()]

    def coverage_curve(self) -> list[tuple[float, float, float]]:
        """(threshold, coverage, accuracy on covered items), auto-labelling items with confidence ≥ threshold."""
        order = np.argsort(-self.confidence, kind="stable")
        conf = self.confidence[order]
        correct = (self.gold == self.predicted)[order]
        hits = np.cumsum(correct)
        n = len(conf)
        curve = []
        for k in range(n):
            if k + 1 < n and conf[k + 1] == conf[k]:
                continue  # ties: a threshold admits all items of equal confidence together
            curve.append((float(conf[k]), (k + 1) / n, float(hits[k] / (k + 1))))
        return curve

    def threshold_for(self, target: float) -> tuple[float | None, float]:
        """Lowest threshold whose covered items reach `target` accuracy, and its coverage."""
        reachable = [(t, cov) for t, cov, acc in self.coverage_curve() if acc >= target]
        if not reachable:
            return None, 0.0
        t, cov = min(reachable, key=lambda x: x[0])
        return t, cov

    def summary(self) -> dict:
        data = {
            "name": self.name, "items": int(len(self.gold)), "accuracy": self.accuracy,
            "macro_f1": self.macro_f1, "ece": self.ece, "per_label": self.per_label(),
            "confusion": self.confusion.tolist(), "labels": list(self.labels), **self.extra,
        }
        if self.target_accuracy is not None:
            threshold, coverage = self.threshold_for(self.target_accuracy)
            data.update(target_accuracy=self.target_accuracy, threshold=threshold, coverage=coverage)
        return data


def gold_indices(data, labels: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Of labelled items (`io.labelled.Labelled`): ([n] index in `labels` of each item's first gold
    label, -1 where it is not one of them; [n, L] bool: every label that counts as correct, the
    `accepted` of `Evaluation`)."""
    index = {label: i for i, label in enumerate(labels)}
    gold = np.array([index.get(names[0], -1) for names in data.gold], dtype=np.int64)
    accepted = np.zeros((len(data.texts), len(labels)), dtype=bool)  # [n, L]
    for row, names in enumerate(data.gold):
        accepted[row, [index[name] for name in names if name in index]] = True
    return gold, accepted


def format_report(ev: Evaluation) -> str:
    lines = [f"accuracy {ev.accuracy:.3f}   macro-F1 {ev.macro_f1:.3f}   ECE {ev.ece:.3f}   ({len(ev.gold)} items)"]
    width = max(len(label) for label in ev.labels)
    lines.append(f"{'label':<{width}}  precision  recall     f1  support")
    for label, m in ev.per_label().items():
        lines.append(f"{label:<{width}}  {m['precision']:9.3f}  {m['recall']:6.3f}  {m['f1']:5.3f}  {m['support']:7d}")
    lines.append("confusion (rows gold, columns predicted):")
    for label, row in zip(ev.labels, ev.confusion):
        lines.append(f"{label:<{width}}  " + " ".join(f"{c:4d}" for c in row))
    lines.append("coverage-accuracy (auto-label items with confidence >= threshold):")
    curve = ev.coverage_curve()
    for cov_target in (1.0, 0.9, 0.75, 0.5, 0.25, 0.1):
        point = min((p for p in curve if p[1] >= cov_target - 1e-9), key=lambda p: p[1], default=None)
        if point:
            lines.append(f"  threshold {point[0]:.3f}: coverage {point[1]:.2f}, accuracy {point[2]:.3f}")
    if ev.target_accuracy is not None:
        threshold, coverage = ev.threshold_for(ev.target_accuracy)
        if threshold is None:
            lines.append(f"no threshold reaches accuracy {ev.target_accuracy:.2f}")
        else:
            lines.append(f"min_confidence {threshold:.3f} reaches accuracy {ev.target_accuracy:.2f} "
                         f"on {100 * coverage:.1f}% of items; the rest go to review")
    return "\n".join(lines)
