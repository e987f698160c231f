"""One question's figures in `evaluate` of a task of questions, per kind of answer.

Each question's readout (`core/readout.py`) measures it from its own columns of the one pass's
scores against its own gold column and returns one of these; each knows its JSON figures, its cells
of the report's table and the notes under it, so the report is one loop over the questions whatever
they answer (`cli/summaries.print_questions_evaluate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .metrics import Evaluation


def _picked(labels, thresholds) -> str:
    """Each label and the threshold picked for it (`none`: no threshold reaches the target)."""
    return ", ".join(f"{label} {'none' if t is None else f'{t:.3f}'}" for label, t in zip(labels, thresholds))


@dataclass(frozen=True)
class ChoiceFigures:
    """A single-choice question's figures, as a single-label evaluate's: accuracy, macro-F1, ECE."""

    name: str
    gold_column: str
    majority: float
    """Share of the items whose gold answer is the most common one: what always giving it scores."""
    main: Evaluation
    """Accuracy, macro-F1, ECE, per label, at the question's calibration."""
    uncalibrated: dict | None = None
    """Calibrated questions: accuracy, macro_f1, ece without the calibration, from the same scores."""

    kind: ClassVar[str] = "single"
    """The report's `kind` column and the JSON's `kind`."""
    footnote: ClassVar[str | None] = None
    """The line under the table that reads its figures for this kind (once, whichever questions have it)."""

    @property
    def figures(self) -> dict:
        """Its JSON figures."""
        return {"kind": self.kind, "gold_column": self.gold_column, "majority": self.majority, **self.main.summary(),
                "uncalibrated": self.uncalibrated}

    def cells(self) -> tuple[float | None, float | None, float | None, float | None]:
        """Its figures in the table's columns: accuracy, macro-F1, micro-F1, ECE (None: does not apply)."""
        return self.main.accuracy, self.main.macro_f1, None, self.main.ece

    def notes(self) -> list[str]:
        """Its lines under the table: what calibration cost, and the threshold that reaches the target."""
        lines, main, raw = [], self.main, self.uncalibrated
        if raw and raw["accuracy"] > main.accuracy + 0.02:
            lines.append(f"{self.name}: calibration cost {100 * (raw['accuracy'] - main.accuracy):.1f} accuracy "
                         "points here: with labels far from balanced it can (docs/calibration.md); consider "
                         "calibrate = false in its [[questions]] table")
        if main.target_accuracy is not None:
            threshold, coverage = main.threshold_for(main.target_accuracy)
            lines.append(f"{self.name}: no threshold reaches accuracy {main.target_accuracy:.2f}" if threshold is None
                         else f"{self.name}: min_confidence {threshold:.3f} reaches accuracy "
                              f"{main.target_accuracy:.2f} on {100 * coverage:.1f}% of items")
        return lines


@dataclass(frozen=True)
class SetFigures:
    """A multi-label question's figures, as a multi-label evaluate's: at its thresholds, and
    cross-fitted (at thresholds picked on the other half of the items)."""

    name: str
    gold_column: str
    majority: float
    """Share of the items whose gold label set is the most common one (what always giving it scores)."""
    labels: tuple[str, ...]
    at_task: dict
    """`multilabel.metrics` at the question's thresholds (0.5 where it sets none)."""
    picked: tuple
    """Per label the threshold picked on these items (None: none reaches the target)."""
    cross_fitted: dict
    """`multilabel.cross_fitted`: the figures at thresholds picked on the other half of the items."""
    target_precision: float | None = None
    items: int = 0
    uncalibrated: dict | None = field(default=None, init=False)
    """Not measured for a multi-label question (the table's uncalibrated columns are blank)."""

    kind: ClassVar[str] = "multi-label"
    footnote: ClassVar[str | None] = ("multi-label: accuracy is subset accuracy, at thresholds picked on the other "
                                      "half of the items (cross-fitted); majority: always the most common label set")

    @property
    def figures(self) -> dict:
        return {"kind": self.kind, "gold_column": self.gold_column, "majority": self.majority, "items": self.items,
                "at_task_thresholds": self.at_task, "picked_thresholds": dict(zip(self.labels, self.picked)),
                "cross_fitted": self.cross_fitted, "target_precision": self.target_precision}

    def cells(self) -> tuple[float | None, float | None, float | None, float | None]:
        """Subset accuracy, macro-F1 and micro-F1 cross-fitted; no ECE."""
        m = self.cross_fitted
        return m["subset_accuracy"], m["macro_f1"], m["micro_f1"], None

    def notes(self) -> list[str]:
        """The figures at its own thresholds, and the thresholds picked on all items."""
        m = self.at_task
        return [f"{self.name} at its own thresholds: micro-F1 {m['micro_f1']:.3f}, macro-F1 {m['macro_f1']:.3f}, "
                f"subset accuracy {m['subset_accuracy']:.3f}; thresholds picked on all items: "
                f"{_picked(self.labels, self.picked)}"]


QuestionFigures = ChoiceFigures | SetFigures
"""One question's figures; each has the attributes and methods above."""

__all__ = ["ChoiceFigures", "SetFigures", "QuestionFigures"]
