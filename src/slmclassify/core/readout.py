"""How a question's branch scores are read: one readout per kind of answer.

A task is a tuple of questions (`Task.asked`: a task of labels is one unnamed question, a task of
questions its own); each question's kind of answer is a `Readout`, the one place that knows how
that kind is scored, calibrated, turned into results and told apart in the output:

- `OneLabel`: exactly one of the labels; the branches are the labels, the probabilities their
  softmax (`results.make_results`).
- `SeveralLabels`: every label that applies; two branches per label, `label: yes` and `label: no`,
  read as P(yes) per label against its threshold (`multilabel.py`).

Code outside the task and readout modules asks the readout, never which kind a task is. A new
kind of answer is a new `Readout` here and the `Task.readout` line that picks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from . import multilabel
from .calibration import adjust, prior_from_scores
from .results import Result, make_results, softmax


@dataclass(frozen=True)
class OneLabel:
    """Exactly one label per item: the softmax over the labels' scores."""

    kind: ClassVar[str] = "single"
    several: ClassVar[bool] = False
    """Whether an answer holds several labels (a list in JSON and Parquet, a joined string in CSV)."""

    def column(self, name: str | None) -> str:
        """The answer's column: the question's name (`label` for the unnamed question)."""
        return "label" if name is None else name

    def branches(self, labels: tuple[str, ...]) -> tuple[str, ...]:
        """The strings scored after the generation prompt (a named question's follow `name: `)."""
        return tuple(labels)

    def requested_mode(self, mode: str) -> str:
        """The scoring mode asked of the label trie, from the task's (`auto` may shorten labels)."""
        return mode

    def prior(self, scores: np.ndarray) -> np.ndarray:
        """[k, B] content-free branch scores → [L] the bias `calibrated` subtracts."""
        return prior_from_scores(scores)

    def calibrated(self, scores: np.ndarray, bias: np.ndarray | None, temperature: float) -> np.ndarray:
        """[n, B] raw branch scores → [n, L] calibrated scores (NaN rows stay NaN)."""
        return adjust(scores, bias, temperature)

    def probabilities(self, calibrated: np.ndarray) -> np.ndarray:
        """[n, L] calibrated scores → [n, L] each label's probability."""
        return softmax(calibrated)

    def confidence(self, probabilities: np.ndarray) -> np.ndarray:
        """[n, L] probabilities → [n] how sure each item's answer is."""
        return probabilities.max(axis=1)

    def results(self, task, scores: np.ndarray, calibrated: np.ndarray, status: list[str]) -> list[Result]:
        """One Result per item from the question's raw and calibrated scores (`task`: its settings)."""
        return make_results(task.labels, scores, calibrated, status, task.min_confidence)

    def cell(self, labels: tuple[str, ...], separator: str) -> str:
        """An answer of these labels as one table cell."""
        return labels[0]


@dataclass(frozen=True)
class SeveralLabels:
    """Every label that applies: P(yes) per label from its yes/no pair, against its threshold."""

    kind: ClassVar[str] = "multi-label"
    several: ClassVar[bool] = True

    def column(self, name: str | None) -> str:
        return "labels" if name is None else f"{name}_labels"

    def branches(self, labels: tuple[str, ...]) -> tuple[str, ...]:
        return multilabel.branches(tuple(labels))

    def requested_mode(self, mode: str) -> str:
        return "full"  # a yes and a no after the same name: each branch scored whole

    def prior(self, scores: np.ndarray) -> np.ndarray:
        return multilabel.prior_log_odds(scores)

    def calibrated(self, scores: np.ndarray, bias: np.ndarray | None, temperature: float) -> np.ndarray:
        return multilabel.adjust(scores, bias, temperature)

    def probabilities(self, calibrated: np.ndarray) -> np.ndarray:
        return multilabel.probabilities(calibrated)

    def confidence(self, probabilities: np.ndarray) -> np.ndarray:
        return multilabel.confidence(probabilities)

    def results(self, task, scores: np.ndarray, calibrated: np.ndarray, status: list[str]) -> list[Result]:
        return multilabel.make_results(task.labels, scores, calibrated, status, task.label_thresholds,
                                       task.min_confidence, task.label_separator)

    def cell(self, labels: tuple[str, ...], separator: str) -> str:
        return separator.join(labels)


Readout = OneLabel | SeveralLabels
"""Every kind of answer; each has the methods above."""

ONE_LABEL, SEVERAL_LABELS = OneLabel(), SeveralLabels()

__all__ = ["Readout", "OneLabel", "SeveralLabels", "ONE_LABEL", "SEVERAL_LABELS"]
