"""One head per question of a task with questions, fitted on the states of one pass and kept in one
file (`model.QuestionHeads`, the file format's owner beside `Head`), so that `--head` takes one
thing whatever the number of questions.

The file is one `.npz`: `meta` (JSON: the format, the model's fingerprint, the whole task's record,
and per question its head's own meta) and per question `NAME.mean`, `NAME.scale`, `NAME.coef`,
`NAME.intercept`. Each question's head is a plain `Head` (single-choice: softmax; multi-label:
one-vs-rest) that reads its own taps and, with `use_scores`, its own question's calibrated scores;
the pass reads the union of their taps (`taps`) and each head takes its columns (`head_states`).
A question without a head is answered zero-shot from the same pass.

Fitting (`fit_question`) is `fit`'s for a task of that question alone, on that pass's states: the
same head from the same states, so a question's head does not depend on the other questions'.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.readout import Kinds
from ..core.taps import Taps
from .model import Head

def tap_columns(read: Taps, wanted: Taps, hidden: int) -> np.ndarray:
    """The columns of states read with `read` ([n, len(read) * hidden], `last` layers first) that are
    the states of `wanted` (a subset of `read`), in `wanted`'s order."""
    slots = [read.last.index(t) for t in wanted.last] + [len(read.last) + read.mean.index(t) for t in wanted.mean]
    return np.concatenate([np.arange(s * hidden, (s + 1) * hidden) for s in slots]).astype(int)


def head_states(head: Head, read: Taps, states: np.ndarray) -> np.ndarray:
    """[n, len(head.taps) * hidden] the head's own states out of the pass's `states` read with `read`."""
    hidden = states.shape[1] // len(read)
    return states[:, tap_columns(read, head.taps, hidden)]


@dataclass(frozen=True)
class QuestionFit:
    """One question's head, with its cross-validated figures next to zero-shot's on the same items."""

    name: str
    head: Head
    choice: str
    """The feature set it reads: chosen by cross-validation ('mean', 'last', ...), 'default' (a
    multi-label question's one-vs-rest heads read the mean-pooled layers, as `fit` does) or 'given'."""
    zero_shot: dict
    """Single-choice: accuracy, macro_f1, ece; multi-label: micro_f1, macro_f1, subset_accuracy,
    hamming_loss at thresholds picked on the other half of the items (cross-fitted)."""
    cv: dict
    """The same figures of the head, out of fold."""


def question_gold(q, cells: list[str], source: str, folds: int) -> np.ndarray:
    """A question's gold cells, checked before the model loads, as its kind of head learns from them
    (`SoftmaxHeads.gold`, `OneVsRestHeads.gold`)."""
    return q.readout.pick(HEADS).gold(q, cells, source, folds)


def fit_question(q, states: np.ndarray, calibrated: np.ndarray, gold: np.ndarray, taps: Taps, *, given: bool,
                 use_scores: bool, folds: int, seed: int, model: dict, task: dict,
                 anchors: tuple[tuple[str, ...], np.ndarray, np.ndarray] | None = None) -> QuestionFit:
    """Fit question `q`'s head on the pass's `states` ([n, len(taps) * hidden]) and, with
    `use_scores`, its own calibrated scores ([n, L]), against its gold (`question_gold`): the fit
    `fit` makes for a task of that question alone, as its readout's kind of head is fitted
    (`SoftmaxHeads.fit`, `OneVsRestHeads.fit`), recording the task with questions (`task`) and the
    `model` it was fitted for. `anchors`: (the labels with a description, the states and calibrated
    scores of those descriptions read as items); a single-choice head learns from them as `fit`
    does (`fitting.Anchors`)."""
    return q.readout.pick(HEADS).fit(q, states, calibrated, gold, taps, given=given, use_scores=use_scores,
                                           folds=folds, seed=seed, model=model, task=task, anchors=anchors)


def question_anchors(q) -> dict[str, str]:
    """{label: its description} read as items for question `q`'s head (`features.anchor_texts`;
    none for one-vs-rest heads, which learn from no anchors)."""
    return q.readout.pick(HEADS).anchors(q)


_FIGURES = ("accuracy", "macro_f1", "ece")
_MULTI_LABEL_FIGURES = ("micro_f1", "macro_f1", "subset_accuracy", "hamming_loss")


@dataclass(frozen=True)
class SoftmaxHeads:
    """A question of one label per item: a multinomial logistic regression over the labels its gold
    holds, the feature set and C chosen by cross-validation (nested for the figures)."""

    def anchors(self, q) -> dict[str, str]:
        from .features import anchor_texts

        return anchor_texts(q.task)

    def gold(self, q, cells: list[str], source: str, folds: int) -> np.ndarray:
        """[n] labels: each one of its labels, `folds` items at least of each label that occurs, two
        labels at least."""
        from ..errors import InputError

        for row, cell in enumerate(cells, start=1):
            if cell not in q.labels:
                raise InputError(f"{source}: row {row} has gold label {cell!r}, which is not an answer of question "
                                 f"{q.name!r} {list(q.labels)}")
        gold = np.array(cells)
        counts = {lab: int((gold == lab).sum()) for lab in q.labels if (gold == lab).any()}
        if len(counts) < 2:
            raise InputError(f"{source}: question {q.name!r} has fewer than two labels in its gold: {list(counts)}")
        if min(counts.values()) < folds:
            raise InputError("{source}: label {label!r} of question {name!r} has {items} items; {folds}-fold "
                             "cross-validation needs at least {folds} per label (or pass {folds_field})",
                             names={"folds_field": "folds"}, source=source, label=min(counts, key=counts.get),
                             name=q.name, items=min(counts.values()), folds=folds)
        return gold

    def fit(self, q, states, calibrated, gold, taps: Taps, *, given, use_scores, folds, seed, model, task,
            anchors=None) -> QuestionFit:
        from ..core.metrics import Evaluation
        from ..core.results import softmax
        from .features import feature_sets
        from .fitting import Anchors, cross_validated, fit

        hidden = states.shape[1] // len(taps)
        extra = [calibrated.astype(np.float64)] if use_scores else []
        X = np.concatenate([states.astype(np.float64), *extra], axis=1)
        sets = {} if given else feature_sets(taps, hidden, calibrated.shape[1] if use_scores else 0)
        candidates = {name: columns for name, (_, columns) in sets.items()} or None
        labels = tuple(sorted(set(gold.tolist())))
        rows = None
        if anchors is not None and anchors[0]:
            described, a_states, a_calibrated = anchors
            a_X = np.concatenate([a_states.astype(np.float64)] + ([a_calibrated.astype(np.float64)] if use_scores
                                                                   else []), axis=1)
            rows = Anchors(a_X, np.array(described, dtype=object)).of(labels)
        probs = cross_validated(X, gold, labels, folds=folds, seed=seed, candidates=candidates, anchors=rows)
        head_ev = Evaluation(labels, np.array([labels.index(g) for g in gold]), probs.argmax(1), probs.max(1))
        zero = softmax(calibrated)
        zero_ev = Evaluation(q.labels, np.array([q.labels.index(g) for g in gold]), zero.argmax(1), zero.max(1))
        figures = lambda ev: {k: getattr(ev, k) for k in _FIGURES}  # noqa: E731
        final = fit(X, gold, seed=seed, folds=folds, candidates=candidates, anchors=rows)
        own, choice = (sets[final.choice][0], final.choice) if candidates else (taps, "given")
        info = {"C": final.C, "features": choice, "items": len(gold),
                "per_label": {lab: int((gold == lab).sum()) for lab in labels},
                "cv": figures(head_ev), "zero_shot": figures(zero_ev)}
        head = Head(labels=final.labels, taps=own, use_scores=use_scores, mean=final.mean, scale=final.scale,
                    coef=final.coef, intercept=final.intercept, model=model, task=task, info=info)
        return QuestionFit(q.name, head, choice, figures(zero_ev), figures(head_ev))


@dataclass(frozen=True)
class OneVsRestHeads:
    """A question of several labels per item: one logistic regression per label (`one_vs_rest.py`)
    on the mean-pooled layers, its threshold F1-optimal on its out-of-fold probabilities."""

    def anchors(self, q) -> dict[str, str]:
        return {}

    def gold(self, q, cells: list[str], source: str, folds: int) -> np.ndarray:
        """[n, L] bool: each label on and off `folds` items at least."""
        from ..core import multilabel
        from .one_vs_rest import check_counts

        gold = multilabel.gold_matrix(cells, q.labels, q.task.label_separator, source)
        check_counts(gold, q.labels, folds, source)
        return gold

    def fit(self, q, states, calibrated, gold, taps: Taps, *, given, use_scores, folds, seed, model, task,
            anchors=None) -> QuestionFit:
        from ..core import multilabel
        from .one_vs_rest import cross_validated_one_vs_rest, fit_one_vs_rest

        hidden = states.shape[1] // len(taps)
        extra = [calibrated.astype(np.float64)] if use_scores else []
        own = taps if given else Taps(mean=taps.mean)
        X = np.concatenate([states[:, tap_columns(taps, own, hidden)].astype(np.float64), *extra], axis=1)
        oof = cross_validated_one_vs_rest(X, gold, folds=folds, seed=seed)
        brief = lambda m: {k: m[k] for k in _MULTI_LABEL_FIGURES}  # noqa: E731
        zero = brief(multilabel.cross_fitted(multilabel.probabilities(calibrated), gold, q.labels, seed=seed))
        cv = brief(multilabel.cross_fitted(oof, gold, q.labels, seed=seed))
        thresholds = tuple(multilabel.pick_thresholds(oof, gold, fallback=0.5))
        final = fit_one_vs_rest(X, gold, q.labels, seed=seed, folds=folds)
        info = {"C": list(final.C), "items": len(gold), "per_label": dict(zip(q.labels, map(int, gold.sum(0)))),
                "cv": cv, "zero_shot": zero, "thresholds": list(thresholds)}
        head = Head(labels=q.labels, taps=own, use_scores=use_scores, mean=final.mean, scale=final.scale,
                    coef=final.coef, intercept=final.intercept, model=model, task=task, info=info, multi_label=True,
                    thresholds=thresholds)
        return QuestionFit(q.name, head, "given" if given else "default", zero, cv)


HEADS = Kinds(one_label=SoftmaxHeads(), several_labels=OneVsRestHeads())
"""How each kind of question's head is fitted: for one label per item, a softmax logistic regression
over its labels; for several, one-vs-rest heads with a threshold per label."""
