"""Several questions about one item, answered in its one pass: the item read once, each question's
answers as branches of the label trie.

The prompt is the single-question one up to the generation prompt: the system turn states every
question, its labels and how to answer (`Task.system_turn`), the item is the last user turn, so
the prefix cache, the item's tokens and the per-item checks are unchanged. After the generation
prompt each question's answers are branches, its name, a colon and the answer:

    ... <assistant turn starts> team: billing      priority: low       topics: refund: yes
                                team: technical    priority: urgent    topics: refund: no  ...

Each branch attends to the prefix, the item and its own tokens only (the trie's tree mask), so all
questions share the item's keys and values, and a question's name is fed once for all its answers
(the trie shares it). A branch's score is the sum of its tokens' log-probabilities (`full` mode).
Within a question the name and colon are the same in every branch, so they cancel: a single-choice
question's probabilities are the softmax over its own branches, a multi-label question's P(yes) per
label its yes/no pair's (`multilabel.py`). Calibration is per question, from the same content-free
passes. The reference path scores the same branches through the unmodified Hugging Face forward,
so `verify` and the probes check every question's branches as they check one question's labels.

A task of labels is a task of one unnamed question (`Task.asked`), so everything here is one path
over questions; each question's kind of answer reads its own columns (`core/readout.py`).

Layouts: the raw scores are [n, B] over every question's branches in order (`branch_spans`); the
calibrated scores and the prior are [n, C] over every question's labels in order (`label_spans`),
a multi-label question's as log-odds of yes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .results import EMPTY, Result
from .task import Question, Task


def scored_names(task: Task) -> tuple[str, ...]:
    """The strings the label trie scores after the generation prompt, in score-column order: every
    question's branches (a task of labels: its labels, or its `label: yes|no` pairs)."""
    return tuple(name for q in task.asked for name in q.branches())


def branch_spans(task: Task) -> list[tuple[Question, slice]]:
    """Each question and the columns of its branches in the raw scores."""
    return _spans(task, lambda q: len(q.branches()))


def label_spans(task: Task) -> list[tuple[Question, slice]]:
    """Each question and the columns of its labels in the calibrated scores and the prior."""
    return _spans(task, lambda q: len(q.labels))


def _spans(task: Task, width) -> list[tuple[Question, slice]]:
    spans, at = [], 0
    for q in task.asked:
        spans.append((q, slice(at, at + width(q))))
        at += width(q)
    return spans


def prior(task: Task, scores: np.ndarray) -> np.ndarray:
    """[k, B] content-free branch scores → [C] each question's prior. A named question that is not
    calibrated gets zeros (it subtracts nothing in a task that is); the unnamed question's prior is
    the task's own whether or not it calibrates (the caller decides to apply it)."""
    return np.concatenate([np.zeros(len(q.labels)) if q.name is not None and not q.task.calibrate
                           else q.readout.prior(scores[:, span]) for q, span in branch_spans(task)])


def calibrated(task: Task, scores: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """[n, B] raw branch scores → [n, C] each question's calibrated scores (its prior removed,
    divided by its temperature); a multi-label question's as log-odds of yes."""
    return np.concatenate([q.readout.calibrated(scores[:, branches], None if bias is None else bias[labels],
                                                q.task.temperature)
                           for (q, branches), (_, labels) in zip(branch_spans(task), label_spans(task))], axis=1)


@dataclass(frozen=True, eq=False)
class Calibration:
    """How a task's raw branch scores are read: each question's prior removed and its temperature
    applied (`calibrated`), then one Result per item (`results`)."""

    task: Task
    bias: np.ndarray | None = None
    """[C] the content-free prior subtracted (`prior`); None: not calibrated."""

    def calibrated(self, scores: np.ndarray) -> np.ndarray:
        """[n, B] raw branch scores → [n, C] calibrated (`calibrated` above)."""
        return calibrated(self.task, scores, self.bias)

    def results(self, scores: np.ndarray, status: list[str]) -> list[Result]:
        """[n, B] raw scores (NaN rows for empty items) → one Result per item, in order."""
        return results(self.task, scores, self.calibrated(scores), list(status))


def answer_results(q: Question, scores: np.ndarray, calibrated_scores: np.ndarray, status: list[str]) -> list[Result]:
    """One question's Result per item from its own branch scores and calibrated scores."""
    return q.readout.results(q.task, scores, calibrated_scores, status)


def results(task: Task, scores: np.ndarray, calibrated_scores: np.ndarray, status: list[str]) -> list[Result]:
    """One Result per item: a task of labels its one question's; a task of questions `answers`
    each question's Result (as a task of that question alone would give it), `needs_review` when
    any answer needs it, `confidence` the least sure answer's, `scores` every branch's raw score;
    `label` is None (each answer holds its own)."""
    per_question = {q.name: answer_results(q, scores[:, branches], calibrated_scores[:, labels], status)
                    for (q, branches), (_, labels) in zip(branch_spans(task), label_spans(task))}
    return combine(task, scores, per_question, status)


def combine(task: Task, scores: np.ndarray, per_question: dict[str | None, list[Result]],
            status: list[str]) -> list[Result]:
    """Each question's Results (`per_question`: from its branches, or from its head) → one Result per
    item, as `results` describes (a task of labels: its one question's, as they are)."""
    if None in per_question:
        return per_question[None]
    names = scored_names(task)
    out = []
    for i, st in enumerate(status):
        answers = {name: rows[i] for name, rows in per_question.items()}
        if st == EMPTY:
            out.append(Result(None, None, {}, True, st, answers=answers))
            continue
        out.append(Result(label=None, confidence=min(a.confidence for a in answers.values()), probabilities={},
                          needs_review=any(a.needs_review for a in answers.values()), status=st,
                          scores={name: float(s) for name, s in zip(names, scores[i])}, answers=answers))
    return out


__all__ = ["scored_names", "branch_spans", "label_spans", "prior", "calibrated", "results", "answer_results", "combine"]
