"""Row (q) of `slmclassify bench`: three questions about each ticket in its one pass (team 5 labels,
priority 3, sentiment 3; `core/questions.py`), against the one question a user asks today and against
the three single-question runs a user would make instead.

The three sides are whole runs (each classifier built inside the clock: its prefix computed and its
content-free passes run, as `classify` does), interleaved round by round (`timing.interleave`), so
a ratio is never taken between runs timed at different moments. Agreement and max |Δ| are against
each question's own reference path (the unmodified Hugging Face forward on the same rendered tokens),
on every item."""

from __future__ import annotations

import numpy as np

from ..backends.sync import sync_of
from ..classifier import Classifier
from ..core import questions
from ..core.task import Question, Task
from ..timing import Side, interleave

ROUNDS = 3
"""Whole runs of each side."""

INSTRUCTION = "You triage support tickets."
TEMPLATE = "Ticket: {text}"
TRIAGE = Task(labels=(), instruction=INSTRUCTION, user_template=TEMPLATE, questions=(
    Question("team", Task(labels=("billing", "technical", "account", "shipping", "feedback"))),
    Question("priority", Task(labels=("low", "normal", "urgent"))),
    Question("sentiment", Task(labels=("negative", "neutral", "positive"))),
))
"""The three questions, in one task (no question texts or descriptions: a short system turn)."""


def single(q: Question) -> Task:
    """The task a user runs today for question `q` alone: its labels, the same instruction and template."""
    return Task(labels=q.labels, instruction=INSTRUCTION, user_template=TEMPLATE)


def questions_row(loaded, texts: list[str], settings, device) -> dict:
    """The figures of row (q): the three-question run's median seconds, its cost over one question's
    and how many times faster it is than three single-question runs (medians of the rounds' ratios,
    with each round's), its agreement with the per-question reference and the largest |Δ|."""
    def whole(task: Task):
        def run(_):
            clf = Classifier(task, model=loaded, settings=settings)
            return clf, clf.score(clf.encode(texts))
        return run

    def separate(_):
        return [whole(single(q))(None) for q in TRIAGE.questions]

    timings = interleave([Side("questions", whole(TRIAGE)), Side("one", whole(single(TRIAGE.questions[0]))),
                          Side("three", separate)], rounds=ROUNDS, warmup=0, sync=sync_of(device))
    clf, scored = timings.last("questions")[0]
    items = clf.encode(texts)
    ok = items.scored
    reference = np.full_like(scored.scores, np.nan)
    reference[ok] = clf.reference(items, ok)
    agree = _agree(clf, scored.scores[ok], reference[ok]) + (len(texts) - len(ok))
    cost = timings.ratios("one", "questions")  # one question's seconds over three questions'
    faster = timings.ratios("three", "questions")  # three runs' seconds over three questions' in one pass
    return {"seconds": timings.median("questions"), "padding": scored.stats.padding_share,
            "cost_vs_one": float(1 / np.median(cost)), "cost_vs_one_rounds": [round(float(1 / r), 3) for r in cost],
            "faster_than_three": float(np.median(faster)),
            "faster_than_three_rounds": [round(float(r), 3) for r in faster],
            "agree": int(agree), "max_abs_diff": float(np.nanmax(np.abs(scored.scores - reference))) if len(ok) else 0.0}


def _agree(clf: Classifier, fast: np.ndarray, reference: np.ndarray) -> int:
    """Items whose every question's answer is the same from the fast scores and the reference's."""
    status = ["ok"] * len(fast)
    mine = questions.results(clf.task, fast, clf.calibration.calibrated(fast), status)
    theirs = questions.results(clf.task, reference, clf.calibration.calibrated(reference), status)
    return sum(all(a.answers[q.name].labels == b.answers[q.name].labels for q in clf.task.questions)
               for a, b in zip(mine, theirs))
