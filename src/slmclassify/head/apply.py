"""Using a head: load it for a task and model, and turn one fast-path pass into results."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import tomllib
from pathlib import Path

import numpy as np

from ..errors import TaskError
from ..core.results import Result
from .model import Head, model_fingerprint, task_from_record
from .model import QuestionHeads
from .questions import head_states

SCORERS = ("zero-shot", "head", "combined")
"""zero-shot: label scoring alone; head: the head's probabilities; combined: their normalised product."""



@dataclasses.dataclass(frozen=True)
class HeadChoice:
    """A learned head (`head/`) and how to use it; scorer zero-shot (or no head) scores labels only."""

    head: Head | QuestionHeads | None = None
    """A head, or one per question of a task with questions (`head/questions.py`)."""
    scorer: str = "zero-shot"
    source: str | None = None
    """The head's file (digested into the resume record), or None."""

    @property
    def used(self) -> bool:
        return self.head is not None and self.scorer != "zero-shot"

    def labels(self, task) -> tuple[str, ...]:
        """The labels results are over: the head's when it is used, else the task's (a task with
        questions: each question's own, head or not)."""
        return self.head.labels if self.used and not isinstance(self.head, QuestionHeads) else task.labels

    def results_step(self):
        """How a scored window becomes results (`classifier.ResultsStep`): the head's when it is
        used, else None (the zero-shot scores')."""
        return head_results(self.head, self.scorer) if self.used else None


def head_path_in_task_file(task_file: str | None) -> str | None:
    """`head = "head.npz"` in a task file, relative to the task file's folder."""
    if not task_file:
        return None
    try:
        data = tomllib.loads(Path(task_file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # reading the task itself reports it, with the project's message
    if not isinstance(data.get("head"), str):
        return None
    return str(Path(task_file).parent / data["head"])


def resolve_scorer(head: Head | None, scorer: str | None) -> str:
    """The default is the head when there is one; a head scorer without a head is an error."""
    if scorer is None:
        return "zero-shot" if head is None else "head"
    if scorer != "zero-shot" and head is None:
        raise TaskError("{field} {scorer} needs a head: pass {head} head.npz (fitted with `slmclassify fit`)",
                        names={"field": "scorer", "head": "head"}, scorer=scorer)
    return scorer


def task_of(head: Head | QuestionHeads, min_confidence: float | None = None):
    """The task a head was fitted with, for commands given a head but no task flags."""
    return task_from_record(head.task, min_confidence)


def check(head: Head | QuestionHeads, classifier, source: str) -> None:
    """Refuse a head fitted for another model or task; `combined` needs the same label set."""
    head.check(model_fingerprint(classifier.loaded), classifier.task, source=source)


def check_scorer(head: Head | QuestionHeads, task_labels, scorer: str, task=None) -> None:
    """`combined` multiplies the head's and the task's probabilities: it needs the same label set
    (heads per question: each head and its question's labels, `task` the task with questions)."""
    if isinstance(head, QuestionHeads):
        for q in task.questions if task is not None else ():
            if q.name in head.heads:
                try:
                    check_scorer(head.heads[q.name], q.labels, scorer)
                except TaskError as exc:
                    raise TaskError(f"question {q.name!r}: {exc}") from None
        return
    if scorer == "combined" and head.taps.echo:
        raise TaskError("{field} combined multiplies the head's probabilities by zero-shot's, and this head reads "
                        "each text twice (echo), a prompt whose label scores are not the task's; use {field} head, or "
                        "refit the head with `slmclassify fit --no-echo`", names={"field": "scorer"})
    if scorer == "combined" and set(head.labels) != set(task_labels):
        raise TaskError("{field} combined needs the head's labels {head} to be the task's labels {task}; "
                        "use {field} head", names={"field": "scorer"}, head=list(head.labels), task=list(task_labels))


def head_log_probabilities(head: Head, calibrated: np.ndarray, states: np.ndarray, task_labels, scorer: str) -> np.ndarray:
    """[n, K] the head's scores under `scorer` (head or combined), as its readout reads them
    (`Head.scores`): a single-label head's log-probabilities of its labels, a multi-label head's
    log-odds per label; combined joins zero-shot's calibrated scores of the same labels (the
    normalised product of the two distributions, or the product of the two odds)."""
    check_scorer(head, task_labels, scorer)
    z = head.scores(head.features(states, calibrated))
    if scorer == "combined":
        z = head.readout.combined(z, calibrated[:, [list(task_labels).index(lab) for lab in head.labels]])
    return z


def score_with_head(classifier, encoded, head: Head, scorer: str, progress=None) -> tuple[np.ndarray, list[Result]]:
    """(raw label scores [n, L], one Result per item over the head's labels) from one fast-path pass
    over every scored item (`Classifier.score_items` without de-duplication)."""
    scored = classifier.score_items(encoded, progress, head.taps, dedupe=False, results=head_results(head, scorer))
    return scored.scores, scored.results


def head_results(head: Head, scorer: str):
    """The `classifier.ResultsStep` of a head under `scorer` (head or combined): results over the
    head's labels from a window scored with the head's taps."""
    if isinstance(head, QuestionHeads):
        return functools.partial(_question_heads_results, head, scorer)
    return functools.partial(_head_results, head, scorer)


def _head_results(head: Head, scorer: str, classifier, scores: np.ndarray, states: np.ndarray,
                  status: list[str]) -> list[Result]:
    task = classifier.task
    calibrated = classifier.calibration.calibrated(scores)
    logp = head_log_probabilities(head, calibrated, states, task.labels, scorer)
    return head.readout.head_results(task, head.labels, scores, logp, status, head.thresholds)


def _question_heads_results(heads: QuestionHeads, scorer: str, classifier, scores: np.ndarray, states: np.ndarray,
                            status: list[str]) -> list[Result]:
    """A task with questions: each question with a head answered from its head (read from the
    pass's states, `heads.taps`), the others zero-shot; p_NAME_LABEL over the question's labels
    (0 for a label the head never saw in its gold)."""
    from ..core import questions

    task = classifier.task
    calibrated = classifier.calibration.calibrated(scores)  # [n, C]: every question's labels
    per_question = {}
    for (q, branches), (_, labels) in zip(questions.branch_spans(task), questions.label_spans(task)):
        head = heads.heads.get(q.name)
        if head is None:
            per_question[q.name] = questions.answer_results(q, scores[:, branches], calibrated[:, labels], status)
            continue
        logp = head_log_probabilities(head, calibrated[:, labels], head_states(head, heads.taps, states), q.labels,
                                      scorer)
        # [n, L] over the question's labels: -inf where a single-label head never saw the label (a
        # one-vs-rest head has each of the question's labels, in its order)
        full = np.full((len(status), len(q.labels)), -np.inf)
        full[:, [q.labels.index(lab) for lab in head.labels]] = logp
        full[np.isnan(logp).any(axis=1)] = np.nan  # empty items
        per_question[q.name] = head.readout.head_results(q.task, q.labels, scores[:, branches], full, status,
                                                         head.thresholds)
    return questions.combine(task, scores, per_question, status)


def evaluate_head(head: Head, scorer: str, classifier, scores: np.ndarray, states: np.ndarray, gold: np.ndarray,
                  target_accuracy, seconds: float, texts):
    """The `evaluate` report of a head (gold indexes the head's labels), with zero-shot alongside
    (`extra["zero_shot"]`, when the labels are the task's) and how many of the items fitted the head
    (`extra["items_used_to_fit"]`, when any did: its figures on them are optimistic)."""
    from ..core.metrics import Evaluation
    from ..core.results import softmax

    calibrated = classifier.calibration.calibrated(scores)
    probs = np.exp(head_log_probabilities(head, calibrated, states, classifier.task.labels, scorer))
    extra = {"scorer": scorer, "layers": head.taps.as_list(), "items_per_s": len(texts) / seconds}
    used = items_used_to_fit(head, texts)
    if used:
        extra["items_used_to_fit"] = used
    if set(head.labels) == set(classifier.task.labels) and not head.taps.echo:  # echoed: another prompt's scores
        zero = softmax(calibrated)[:, [list(classifier.task.labels).index(lab) for lab in head.labels]]
        zero_ev = Evaluation(head.labels, gold, zero.argmax(1), zero.max(1))
        extra["zero_shot"] = {"accuracy": zero_ev.accuracy, "macro_f1": zero_ev.macro_f1, "ece": zero_ev.ece}
    return Evaluation(head.labels, gold, probs.argmax(1), probs.max(1), name=scorer,
                      target_accuracy=target_accuracy, extra=extra)


def text_hashes(texts) -> list[str]:
    """Short digests of item texts, kept in a head to spot evaluation on its own training items."""
    return [hashlib.sha256(t.encode()).hexdigest()[:12] for t in texts]


def items_used_to_fit(head: Head, texts) -> int:
    seen = set(head.info.get("item_hashes", ()))
    return sum(h in seen for h in text_hashes(texts))
