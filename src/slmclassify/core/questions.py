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

Layouts: the raw scores are [n, B] over every question's branches in order (`branch_spans`); the
calibrated scores and the prior are [n, C] over every question's labels in order (`label_spans`),
a multi-label question's as log-odds of yes.
"""

from __future__ import annotations

import numpy as np

from . import multilabel
from .calibration import adjust, prior_from_scores
from .encode import EMPTY
from .results import Result, make_results
from .task import Question, Task


def scored_names(task: Task) -> tuple[str, ...]:
    """The strings the label trie scores after the generation prompt, in score-column order: every
    question's branches; a multi-label task's `name: yes|no` pairs; else the labels."""
    if task.questions:
        return tuple(name for q in task.questions for name in q.branches())
    if task.multi_label:
        return multilabel.branches(task.labels)
    return task.labels


def branch_spans(task: Task) -> list[tuple[Question, slice]]:
    """Each question and the columns of its branches in the raw scores."""
    return _spans(task, lambda q: len(q.branches()))


def label_spans(task: Task) -> list[tuple[Question, slice]]:
    """Each question and the columns of its labels in the calibrated scores and the prior."""
    return _spans(task, lambda q: len(q.labels))


def _spans(task: Task, width) -> list[tuple[Question, slice]]:
    spans, at = [], 0
    for q in task.questions:
        spans.append((q, slice(at, at + width(q))))
        at += width(q)
    return spans


def prior(task: Task, scores: np.ndarray) -> np.ndarray:
    """[k, B] content-free branch scores → [C] each question's prior (zeros for a question that is
    not calibrated, which subtracts nothing)."""
    parts = []
    for q, span in branch_spans(task):
        if not q.task.calibrate:
            parts.append(np.zeros(len(q.labels)))
        elif q.multi_label:
            parts.append(multilabel.prior_log_odds(scores[:, span]))
        else:
            parts.append(prior_from_scores(scores[:, span]))
    return np.concatenate(parts)


def calibrated(task: Task, scores: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """[n, B] raw branch scores → [n, C] each question's calibrated scores (its prior removed,
    divided by its temperature); a multi-label question's as log-odds of yes."""
    parts = []
    for (q, branches), (_, labels) in zip(branch_spans(task), label_spans(task)):
        own_bias = None if bias is None else bias[labels]
        if q.multi_label:
            parts.append(multilabel.adjust(scores[:, branches], own_bias, q.task.temperature))
        else:
            parts.append(adjust(scores[:, branches], own_bias, q.task.temperature))
    return np.concatenate(parts, axis=1)


def answer_results(q: Question, scores: np.ndarray, calibrated_scores: np.ndarray, status: list[str]) -> list[Result]:
    """One question's Result per item from its own branch scores and calibrated scores."""
    if q.multi_label:
        return multilabel.make_results(q.labels, scores, calibrated_scores, status, q.task.label_thresholds,
                                       q.task.min_confidence, q.task.label_separator)
    return make_results(q.labels, scores, calibrated_scores, status, q.task.min_confidence)


def results(task: Task, scores: np.ndarray, calibrated_scores: np.ndarray, status: list[str]) -> list[Result]:
    """One Result per item: `answers` each question's Result (as a task of that question alone
    would give it), `needs_review` when any answer needs it, `confidence` the least sure answer's,
    `scores` every branch's raw score; `label` is None (each answer holds its own)."""
    per_question = {q.name: answer_results(q, scores[:, branches], calibrated_scores[:, labels], status)
                    for (q, branches), (_, labels) in zip(branch_spans(task), label_spans(task))}
    return combine(task, scores, per_question, status)


def combine(task: Task, scores: np.ndarray, per_question: dict[str, list[Result]], status: list[str]) -> list[Result]:
    """Each question's Results (`per_question`: from its branches, or from its head) → one Result per
    item, as `results` describes."""
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
