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

import json
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

import numpy as np

from ..errors import FieldError, InputError, TaskError
from . import multilabel
from .calibration import adjust, prior_from_scores
from .figures import ChoiceFigures, SetFigures
from .metrics import Evaluation
from .results import Result, make_results, softmax

T = TypeVar("T")


@dataclass(frozen=True)
class Kinds(Generic[T]):
    """One thing per kind of answer, of which a readout picks its own (`Readout.pick`): how a layer
    above core keeps a step of its own per kind (an evaluate report, a kind of head, how a fit is
    printed) without asking which kind a task is. A new kind of answer is a new field here, so that
    every such table must say what it does for it."""

    one_label: T
    several_labels: T


@dataclass(frozen=True)
class OneLabel:
    """Exactly one label per item: the softmax over the labels' scores."""

    lists: ClassVar[bool] = False
    """Whether its answer column holds a list of labels in JSON Lines and Parquet (joined in CSV)."""
    thresholded: ClassVar[bool] = False
    """Whether each label is chosen against a threshold of its own (`evaluate --target-precision` picks them)."""

    instruction: ClassVar[str] = "You classify short texts into exactly one category."
    """The system turn's first line where the task gives none."""

    def check(self, task) -> None:
        """Refuse what this kind of answer cannot do with the task's settings (TaskError, FieldError)."""
        if task.thresholds:
            raise TaskError("thresholds are per-label thresholds of a multi-label task; set multi_label = true "
                            "or use min_confidence")

    def column(self, name: str | None) -> str:
        """The answer's column: the question's name (`label` for the unnamed question)."""
        return "label" if name is None else name

    def rule(self, task, name: str | None = None) -> str:
        """How to answer, in the system turn: after the instruction for a task of one question, after
        the question's name for a question `name` of several (its label list indented)."""
        if any(task.descriptions):
            return "Answer with exactly one of these labels:\n" + task._label_list("" if name is None else "  ")
        return f"Answer with exactly one of: {', '.join(task.labels)}."

    def example(self, name: str, labels: tuple[str, ...]) -> str:
        """An answer of question `name`, as the system turn shows one."""
        return f"{name}: {labels[0]}"

    def mode_reason(self, resolved: str) -> str:
        """Why the labels are scored as they are, from the trie's reason (`labels.resolve_mode`)."""
        return resolved

    def gold(self, cell: str, task) -> str:
        """A gold cell's text as an answer of `task` would spell it (`Result.label`)."""
        return cell

    def gold_separator(self, task) -> str | None:
        """What separates the labels of one gold cell (None: a cell is one label)."""
        return None

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

    def guess(self, labels: tuple[str, ...], probs: np.ndarray, thresholds: np.ndarray):
        """(the answer [L] probabilities make, how sure it is): the likeliest label and its probability."""
        top = int(probs.argmax())
        return labels[top], float(probs[top])

    # learned heads (`head/`): how a head's linear logits are read, combined and turned into results

    def pick(self, kinds: Kinds):
        """Its own of one thing per kind of answer (`Kinds`)."""
        return kinds.one_label

    def head_scores(self, logits: np.ndarray) -> np.ndarray:
        """[n, K] a head's logits → what it answers with: its labels' log-probabilities (log-softmax)."""
        return self.head_log_probabilities(logits)

    def head_log_probabilities(self, logits: np.ndarray) -> np.ndarray:
        """[n, K] a head's logits → one distribution's log-probabilities (NaN rows stay NaN)."""
        top = logits.max(axis=1, keepdims=True)
        return logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))

    def combined(self, head: np.ndarray, zero: np.ndarray) -> np.ndarray:
        """The `combined` scorer's [n, K] from the head's scores and zero-shot's calibrated ones (the
        same columns): the normalised product of the two distributions."""
        with np.errstate(invalid="ignore"):  # NaN rows: empty items
            zero = zero - np.logaddexp.reduce(zero, axis=1, keepdims=True)
            logp = head + zero
            return logp - np.logaddexp.reduce(logp, axis=1, keepdims=True)

    def head_results(self, task, labels: tuple[str, ...], scores: np.ndarray, head: np.ndarray, status: list[str],
                     thresholds) -> list[Result]:
        """One Result per item over `labels` from a head's [n, L] scores (`head_scores`; `scores`: the
        raw branch scores; `task`: the question's settings; `thresholds`: the head's own)."""
        return make_results(labels, head, head, status, task.min_confidence)

    def chosen(self, result: Result, lists: bool):
        """A result's answer column value (`lists`: JSON Lines and Parquet, which hold lists)."""
        return result.label

    def arrow_type(self, lists: bool):
        """The answer column's Arrow type (Parquet), matching `chosen`."""
        import pyarrow as pa

        return pa.string()

    # evaluate

    def gold_names(self, cells: set[str]) -> set[str]:
        """The label names a file's gold cells hold (a task's labels where none are given)."""
        return cells

    measures: ClassVar[tuple[str, ...]] = ("compare_modes", "fit_temperature", "target_accuracy", "fewshot_cost",
                                           "plots_dir")
    """The options of `evaluate` (`EvaluateRequest` fields) a task of one such question measures; `check_options`
    refuses the others."""

    def check_options(self, given: list[str]) -> None:
        """Refuse the first of the `evaluate` options `given` (request fields, set) that it does not measure."""
        refused = [name for name in given if name not in self.measures]
        if refused:
            raise TaskError("{option} picks a multi-label task's thresholds; a single-label evaluation reports "
                            "accuracy, macro-F1 and ECE, and the review threshold ({target})",
                            names={"option": refused[0], "target": "target_accuracy"})

    def check_head(self, head) -> None:
        """Refuse a head (`head/model.Head`) that answers another way than a task of this kind."""
        if head.readout != self:
            raise TaskError("the head is one-vs-rest, fitted on a multi-label task; evaluate it with that task "
                            "(multi_label = true), or without task options to use the task it was fitted with")

    def question_gold(self, q, cells: list[str], source: str):
        """A question's gold cells → its gold as `question_figures` takes it: ([n] label index, [n, L]
        accepted); a cell that is not one of its labels is refused, naming its row (`source`: where)."""
        for row, cell in enumerate(cells, start=1):
            if cell not in q.labels:
                raise InputError(f"{source}: row {row} has gold label {cell!r}, which is not an answer of question "
                                 f"{q.name!r} {list(q.labels)}")
        gold = np.array([q.labels.index(cell) for cell in cells], dtype=np.int64)
        return gold, np.eye(len(q.labels), dtype=bool)[gold]

    def question_figures(self, q, column: str, scores: np.ndarray, calibrated: np.ndarray, gold, request):
        """A question's figures (`core/figures.py`) from its [n, B] branch scores and [n, L] calibrated
        scores against its gold (`question_gold`, scored rows); `request`: the targets asked for."""
        index, accepted = gold
        probs = self.probabilities(calibrated)
        main = Evaluation(q.labels, index, probs.argmax(1), probs.max(1), name=q.name,
                          target_accuracy=request.target_accuracy,
                          extra={"calibrated": q.task.calibrate, "temperature": q.task.temperature}, accepted=accepted)
        raw = None
        if q.task.calibrate:
            plain = self.probabilities(self.calibrated(scores, None, q.task.temperature))
            ev = Evaluation(q.labels, index, plain.argmax(1), plain.max(1), accepted=accepted)
            raw = {"accuracy": ev.accuracy, "macro_f1": ev.macro_f1, "ece": ev.ece}
        majority = float(np.bincount(index, minlength=len(q.labels)).max() / len(index)) if len(index) else 0.0
        return ChoiceFigures(q.name, column, majority, main=main, uncalibrated=raw)

    # a person's answer (the labelling loop): a label index, as its store keeps a label's name

    def checked(self, labels: tuple[str, ...], label, what: str, error=TaskError):
        """A caller's answer as a store keeps it, validated (`error` with what is wrong, naming `what`)."""
        if not isinstance(label, str) or label not in labels:
            raise error(f"label {_said(label)} is not one of {what}'s labels {list(labels)}")
        return label

    def stored(self, checked) -> str:
        """A checked answer as the text a task of labels' store keeps."""
        return checked

    def from_store(self, text: str):
        """The value a task of labels' store text holds (`parse` reads it)."""
        return text

    def parse(self, labels: tuple[str, ...], value):
        """The answer a stored value holds: a label index (None: not one of these labels)."""
        return labels.index(value) if isinstance(value, str) and value in labels else None

    def shown(self, labels: tuple[str, ...], answer) -> str:
        """An answer as the page's history lists it."""
        return labels[answer]

    def gold_cell(self, labels: tuple[str, ...], answer, separator: str) -> str:
        """An answer as an exported gold cell."""
        return labels[answer]

    def columns(self, at: int, answer) -> list[int]:
        """An answer's label columns among every question's labels side by side (its own start `at`)."""
        return [at + answer]

    def choices(self, name: str, labels: tuple[str, ...], pick) -> list:
        """Each single choice an answer makes, for agreement: (its name, its labels, answer → label
        index), `pick` taking an item's answer to this question's."""
        return [(name, labels, pick)]

    # the labelling loop

    press: ClassVar[str] = "pick"
    """What pressing a label's button or key does on the labelling page: "pick" makes it the answer,
    "toggle" adds it to the answer's set or takes it out."""
    guess_named: ClassVar[str] = "its guess"
    """How a cold pick's reason names the label the model would answer (`strategy.describe`)."""

    def margin(self, probs: np.ndarray) -> np.ndarray:
        """[m, L] probabilities → [m] how sure each item's answer is, on 0..1 (the picker asks about the
        least sure): the top probability minus the second."""
        top = -np.partition(-probs, 1, axis=1)[:, :2]  # [m, 2] the two largest, largest first
        return top[:, 0] - top[:, 1]

    def unsure(self, name: str | None, labels: tuple[str, ...], probs: np.ndarray) -> str:
        """The reason line of a pick made because the model is unsure of the answer [L] `probs` give
        (`name`: the question's, None for a task of labels)."""
        a, b = np.argsort(-probs)[:2]
        if name is None:
            return f"the model is unsure between {labels[a]} and {labels[b]} (margin {probs[a] - probs[b]:.2f})"
        return f"the model is unsure about {name}: {labels[a]} or {labels[b]} (margin {probs[a] - probs[b]:.2f})"


@dataclass(frozen=True)
class SeveralLabels:
    """Every label that applies: P(yes) per label from its yes/no pair, against its threshold."""

    lists: ClassVar[bool] = True
    thresholded: ClassVar[bool] = True

    instruction: ClassVar[str] = "You tag short texts with every label that applies to them."

    def check(self, task) -> None:
        labels = task.labels
        if task.thresholds and len(task.thresholds) != len(labels):
            raise TaskError(f"{len(task.thresholds)} thresholds for {len(labels)} labels; give one per label")
        for t in task.thresholds:
            if not 0.0 < t < 1.0:
                raise TaskError(f"a label's threshold must be between 0 and 1 (exclusive), got {t}")
        if task.mode in ("first", "full-mean"):
            raise FieldError("mode", "a multi-label task scores each label's yes and no after its name, "
                             "which needs {field} full or auto, got {value!r}", value=task.mode)
        if task.examples:
            raise TaskError("examples are not supported in multi-label tasks yet (an example's answer would be "
                            "one label's yes or no); remove them or set multi_label = false")
        if not task.label_separator or task.label_separator.isspace() or any(
                task.label_separator in label for label in labels):
            raise FieldError("label_separator", "{field} {value!r} must be non-blank and appear in no label "
                             "name", value=task.label_separator)

    def column(self, name: str | None) -> str:
        return "labels" if name is None else f"{name}_labels"

    def rule(self, task, name: str | None = None) -> str:
        if name is None:
            return ("Several labels, or none, may apply. Asked about one label, answer with its name, a colon and "
                    f"yes if it applies or no if it does not (e.g. \"{task.labels[0]}: yes\"). The labels:\n"
                    + task._label_list())
        return ("Several labels, or none, may apply: answer each label with its name and yes or no "
                f"(e.g. \"{name}: {task.labels[0]}: yes\"). The labels:\n" + task._label_list("  "))

    def example(self, name: str, labels: tuple[str, ...]) -> str:
        return f"{name}: {labels[0]}: yes"

    def mode_reason(self, resolved: str) -> str:
        return "multi-label: each label's yes and no branches, full sequences"

    def gold(self, cell: str, task) -> str:
        return multilabel.canonical_labels(cell, task)  # a label set: in the task's order, compared as sets

    def gold_separator(self, task) -> str | None:
        return task.label_separator

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

    def guess(self, labels: tuple[str, ...], probs: np.ndarray, thresholds: np.ndarray):
        """(the labels at or above their thresholds, the least sure decision)."""
        chosen = [lab for lab, p, t in zip(labels, probs, thresholds) if p >= t]
        return chosen, float(multilabel.confidence(probs[None, :])[0])

    # learned heads (`head/`)

    def pick(self, kinds: Kinds):
        return kinds.several_labels

    def head_scores(self, logits: np.ndarray) -> np.ndarray:
        """Each label's log-odds of applying, as they are (one-vs-rest: a logit per label)."""
        return logits

    def head_log_probabilities(self, logits: np.ndarray) -> np.ndarray:
        raise TaskError("a multi-label head gives each label's log-odds (Head.log_odds), not one distribution")

    def combined(self, head: np.ndarray, zero: np.ndarray) -> np.ndarray:
        """The sum of the two log-odds: the product of the two odds."""
        return head + zero

    def head_results(self, task, labels: tuple[str, ...], scores: np.ndarray, head: np.ndarray, status: list[str],
                     thresholds) -> list[Result]:
        return multilabel.make_results(labels, scores, head, status, thresholds, task.min_confidence,
                                       task.label_separator)

    def chosen(self, result: Result, lists: bool):
        if not lists or result.label is None:
            return result.label
        return list(result.labels)

    def arrow_type(self, lists: bool):
        import pyarrow as pa

        return pa.list_(pa.string()) if lists else pa.string()

    # evaluate

    def gold_names(self, cells: set[str]) -> set[str]:
        return {name for cell in cells for name in multilabel.split_labels(cell)}  # each cell names several: `a;b`

    measures: ClassVar[tuple[str, ...]] = ("target_precision",)

    def check_options(self, given: list[str]) -> None:
        refused = [name for name in given if name not in self.measures]
        if refused:
            raise TaskError("{option} is for single-label tasks; a multi-label evaluation reports F1, subset accuracy "
                            "and Hamming loss, and picks thresholds ({target})",
                            names={"option": refused[0], "target": "target_precision"})

    def check_head(self, head) -> None:
        if head.readout != self:
            raise TaskError("the head is single-label; a multi-label task needs a head fitted on it "
                            "(`slmclassify fit` with multi_label = true)")

    def question_gold(self, q, cells: list[str], source: str):
        """[n, L] bool: each label in each row's set (`multilabel.gold_matrix`)."""
        return multilabel.gold_matrix(cells, q.labels, q.task.label_separator, source)

    def question_figures(self, q, column: str, scores: np.ndarray, calibrated: np.ndarray, gold, request):
        """At the question's thresholds, the thresholds picked on these items (F1-optimal, or the lowest
        reaching the request's `target_precision`), and cross-fitted."""
        probs, target = self.probabilities(calibrated), request.target_precision
        sets = Counter(row.tobytes() for row in gold)
        return SetFigures(q.name, column, max(sets.values()) / len(gold) if len(gold) else 0.0, q.labels,
                          at_task=multilabel.metrics(probs, gold, q.task.label_thresholds, q.labels),
                          picked=tuple(multilabel.pick_thresholds(probs, gold, target)),
                          cross_fitted=multilabel.cross_fitted(probs, gold, q.labels, target),
                          target_precision=target, items=int(len(gold)))

    # a person's answer: a sorted tuple of label indices (maybe empty), as its store keeps a JSON list

    def checked(self, labels: tuple[str, ...], label, what: str, error=TaskError):
        if isinstance(label, str) or not isinstance(label, (list, tuple)) or not all(isinstance(n, str) for n in label):
            raise error(f"a multi-label {what.removeprefix('the ')}'s answer is a list of its labels "
                        f"{list(labels)}, got {_said(label)}")
        unknown = [name for name in label if name not in labels]
        if unknown:
            raise error(f"label {_said(unknown[0])} is not one of {what}'s labels {list(labels)}")
        return [name for name in labels if name in label]

    def stored(self, checked) -> str:
        return json.dumps(checked)

    def from_store(self, text: str):
        try:
            return json.loads(text)
        except ValueError:
            return None

    def parse(self, labels: tuple[str, ...], value):
        if not isinstance(value, list) or not all(isinstance(name, str) and name in labels for name in value):
            return None
        return tuple(sorted({labels.index(name) for name in value}))

    def shown(self, labels: tuple[str, ...], answer) -> str:
        return ", ".join(labels[i] for i in answer) or "none of them"

    def gold_cell(self, labels: tuple[str, ...], answer, separator: str) -> str:
        return separator.join(labels[i] for i in answer)

    def columns(self, at: int, answer) -> list[int]:
        return [at + i for i in answer]

    def choices(self, name: str, labels: tuple[str, ...], pick) -> list:
        """Each label a choice of no or yes (`NAME: LABEL`, or `LABEL` for a task of labels)."""
        prefix = f"{name}: " if name else ""
        return [(f"{prefix}{label}", ("no", "yes"), lambda v, i=i: int(i in pick(v))) for i, label in enumerate(labels)]

    # the labelling loop

    press: ClassVar[str] = "toggle"
    guess_named: ClassVar[str] = "its likeliest label"

    def margin(self, probs: np.ndarray) -> np.ndarray:
        """|2p - 1| of the label whose P(yes) is nearest 0.5: that decision is the least sure."""
        return np.abs(2 * probs - 1).min(axis=1)

    def unsure(self, name: str | None, labels: tuple[str, ...], probs: np.ndarray) -> str:
        j = int(np.argmin(np.abs(2 * probs - 1)))
        where = "" if name is None else f"{name}, "
        return f"the model is unsure whether {labels[j]} applies ({where}P {probs[j]:.2f})"


def _said(value, limit: int = 80) -> str:
    """A caller's value for a message, cut to `limit` characters (a 30 MB label is not echoed back)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


Readout = OneLabel | SeveralLabels
"""Every kind of answer; each has the methods above."""

ONE_LABEL, SEVERAL_LABELS = OneLabel(), SeveralLabels()


def of_flag(multi_label: bool) -> Readout:
    """The readout a `multi_label` flag names: the one place that maps the flag to a kind of answer
    (`Task.readout`, `Head.readout`; callers holding the flag alone: `evaluate`'s task before it is built, the
    labelling loop's `PoolView` of an older caller)."""
    return SEVERAL_LABELS if multi_label else ONE_LABEL

__all__ = ["Readout", "Kinds", "OneLabel", "SeveralLabels", "ONE_LABEL", "SEVERAL_LABELS"]
