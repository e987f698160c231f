"""The `evaluate` job: score labelled items under one or several configurations; returns the figures
(`EvaluateSummary`; a task of questions' `QuestionsSummary`) and writes what was asked (plots, the
task file's threshold, JSON)."""

from __future__ import annotations

import dataclasses
import json
import time
from itertools import compress
from pathlib import Path

import numpy as np

from ..core.calibration import adjust, fit_temperature
from ..classifier import Classifier, EngineSettings, content_free_prior, label_token_lines
from ..errors import InputError, TaskError
from ..head.apply import HeadChoice
from ..core.metrics import Evaluation, check_target_accuracy, gold_indices
from ..io.labelled import read_gold_columns, read_labelled
from ..io.plots import write_plots
from ..core import multilabel
from ..core.labels import build_trie
from ..core import questions as qs
from ..core.readout import Kinds, of_flag
from ..models.precision import auto_line
from ..models.prepare import load_model
from ..core.figures import QuestionFigures
from ..core.results import columns_for, softmax
from ..core.taps import Taps
from ..core.task import Example, Task
from .sources import build_task
from ..io.task_files import write_task_settings
from ..timing import Side, Stopwatch, interleave


@dataclasses.dataclass(frozen=True)
class EvaluateRequest:
    """Which labelled file to score, and what to report and write (everything but the task, settings,
    model, head). `evaluate_file` and `evaluate_multilabel_file` take the same request; the fields
    marked single-label are refused by the command for a multi-label task."""

    input_path: str
    """A labelled table (CSV, JSONL, Parquet) or a BIG-bench task JSON."""
    text_column: str = "text"
    label_column: str = "label"
    """Column of gold labels (tables; a multi-label task's are `;`-separated label sets)."""
    gold_columns: tuple[tuple[str, str], ...] = ()
    """A task with questions: (question name, its gold column) pairs (`evaluate_questions_file`);
    a question without one is scored but not reported."""
    limit: int | None = None
    """Only the first N items (None: all)."""
    compare_modes: bool = False
    """Single-label: also score every scoring mode, with and without calibration."""
    fit_temperature: bool = False
    """Single-label: fit temperature scaling on these items."""
    target_accuracy: float | None = None
    """Single-label: report the confidence threshold that reaches this accuracy."""
    target_precision: float | None = None
    """Multi-label: each label's threshold is the lowest reaching this precision (None: F1-optimal)."""
    fewshot_cost: int = 0
    """Single-label: also time 0 vs this many examples per label in the prefix (0: not)."""
    plots_dir: str | None = None
    """Single-label: folder for confusion.png, reliability.png and coverage.png."""
    task_file: str | None = None
    """Write the threshold and fitted temperature (multi-label: the picked thresholds) into this task file."""
    json_path: str | None = None
    """Write the figures as JSON."""

    def __post_init__(self) -> None:
        check_target_accuracy(self.target_accuracy)

    def options_given(self) -> list[str]:
        """The measuring options set, as fields in the order a refusal names the first (`Readout.check_options`)."""
        return [name for name in OPTIONS if getattr(self, name) not in (None, False, 0)]


OPTIONS = ("compare_modes", "fit_temperature", "target_accuracy", "fewshot_cost", "plots_dir", "target_precision")
"""The request's options that measure something of a task of one question, which its readout may not measure."""


@dataclasses.dataclass(frozen=True)
class EvaluateSummary:
    """What `evaluate_file` measured and wrote, for the report."""

    model: str
    items: int
    task: Task
    mode: str
    mode_reason: str
    precision_line: str | None
    """`--precision auto`'s decision, when it made one."""
    label_token_lines: tuple[str, ...]
    """Each label's tokens after the chat template (`describe_labels`)."""
    fitted_temperature: float | None
    main: Evaluation
    """The main report: the task's scoring, or the head's."""
    head: object | None
    """The head the main report is of (None: zero-shot)."""
    modes: tuple[dict, ...]
    """--compare-modes rows: mode, calibrated, accuracy, macro_f1, ece, items_per_s."""
    fewshot_cost: dict | None
    figures: dict
    """The JSON summary (`main.summary()` plus modes and few-shot cost)."""
    uncalibrated: dict | None = None
    """A calibrated zero-shot run's figures without the calibration, from the same scores
    (accuracy, macro_f1, ece): calibration can hurt (docs/calibration.md)."""
    plots: tuple[str, ...] = ()
    task_file: str | None = None
    task_values: dict = dataclasses.field(default_factory=dict)
    """Keys written into `task_file` (min_confidence, temperature)."""
    json_path: str | None = None


def task_for_file(path: str, text_column: str = "text", label_column: str = "label", *, task_file=None,
                  labels: tuple[str, ...] | None = None, limit: int | None = None, **overrides) -> Task:
    """The task for evaluating `path`: the task file and/or explicit values (as `build_task`).

    Without labels or a task file, the labels are the file's own (a BIG-bench task's
    target_scores keys) or the sorted gold labels; a BIG-bench `task_prefix` is the instruction
    unless one is given (in `overrides` or the task file).
    """
    if not path.endswith(".json") and (labels or task_file):  # the file adds nothing: its rows are read later
        return build_task(task_file, labels, **overrides)
    data = read_labelled(path, text_column, label_column).head(limit)
    if labels is None and not task_file:
        names = of_flag(bool(overrides.get("multi_label"))).gold_names({name for cell in data.gold for name in cell})
        labels = data.labels or tuple(sorted(names))
    return build_task(task_file, labels, default_instruction=data.instruction, **overrides)


def evaluate_file(request: EvaluateRequest, task: Task, settings: EngineSettings | None = None, *, model=None,
                  head: HeadChoice = HeadChoice()):
    """Score the labelled items of the request's file with a task of labels; write what the request
    asks for; returns the figures of its kind of answer (its readout picks the report): one label's
    `EvaluateSummary` (`_evaluate_one_label`), several labels' `MultiLabelSummary`
    (`evaluate_multilabel_file`). A task with questions is measured by `evaluate_questions_file`."""
    if columns_for(task).named:  # each question's answers are columns of their own: one gold column each
        raise TaskError("a task with questions is evaluated by evaluate_questions_file, against a gold column "
                        "per question")
    return task.readout.pick(_LABEL_REPORTS)(request, task, settings, model=model, head=head)


def _evaluate_one_label(request: EvaluateRequest, task: Task, settings: EngineSettings | None = None, *, model=None,
                        head: HeadChoice = HeadChoice()) -> EvaluateSummary:
    """One label per item: accuracy, macro-F1, ECE; plots, task-file values and JSON as asked
    (`EvaluateSummary.figures` is the JSON summary).

    A head (`head/`) with scorer head or combined (`head.used`) is the main report (gold labels are
    then the head's).
    """
    target_accuracy = request.target_accuracy
    task.readout.check_options(request.options_given())
    settings = settings or EngineSettings()
    use_head = head.used
    data, gold, accepted, head_gold = _one_label_gold(request, task, head)
    texts = data.texts
    if request.plots_dir:
        _check_matplotlib("plots_dir")
    loaded = load_model(model, settings.device, settings.precision, task=task, sample=texts, settings=settings)
    states = []

    def run(config_task: Task, taps: Taps = Taps()) -> tuple[Classifier, np.ndarray, float]:
        clf = Classifier(config_task, model=loaded, settings=settings)
        if taps:
            from ..head.apply import check

            check(head.head, clf, head.source or "the head")
        with Stopwatch() as watch:
            scored = clf.score(clf.encode(texts, taps), taps=taps)
        if taps:
            states.append(scored.states)
        return clf, scored.scores, watch.seconds

    def evaluation(name, scores, bias, temperature, clf=None, seconds=None) -> Evaluation:
        probs = softmax(adjust(scores, bias, temperature))
        extra = {"mode": clf.mode if clf else None, "calibrated": bias is not None, "temperature": temperature}
        if seconds is not None:
            extra["items_per_s"] = len(texts) / seconds
        return Evaluation(task.labels, gold, probs.argmax(1), probs.max(1), name=name,
                          target_accuracy=target_accuracy, extra=extra, accepted=accepted)

    clf, scores, seconds = run(task, head.head.taps if use_head else Taps())
    temperature = task.temperature
    if request.fit_temperature:
        temperature = fit_temperature_on(scores, clf.bias, gold)
    if use_head:
        from ..head.apply import evaluate_head

        main = evaluate_head(head.head, head.scorer, clf, scores, states[0], head_gold, target_accuracy, seconds,
                             texts)
    else:
        main = evaluation(f"{clf.mode}{' +cal' if clf.bias is not None else ''}", scores, clf.bias, temperature,
                          clf, seconds)
    summary = main.summary()
    if not use_head and clf.bias is not None:
        raw = evaluation(clf.mode, scores, None, temperature)
        summary["uncalibrated"] = {"accuracy": raw.accuracy, "macro_f1": raw.macro_f1, "ece": raw.ece}

    rows = []
    if request.compare_modes:
        rows = summary["modes"] = _compare_modes(run, evaluation, task, loaded, settings, texts)

    if request.fewshot_cost > 0:
        first_gold = [names[0] for names in data.gold]
        summary["fewshot_cost"] = _fewshot_cost(loaded, task, settings, texts, first_gold, request.fewshot_cost)

    result = EvaluateSummary(
        model=loaded.name, items=len(texts), task=task, mode=clf.mode, mode_reason=clf.mode_reason,
        precision_line=auto_line(loaded),
        label_token_lines=tuple(label_token_lines(clf)),
        fitted_temperature=temperature if request.fit_temperature else None, main=main,
        head=head.head if use_head else None,
        modes=tuple(rows), fewshot_cost=summary.get("fewshot_cost"), figures=summary,
        uncalibrated=summary.get("uncalibrated"))
    return _write(result, request, temperature if request.fit_temperature else None)


def _one_label_gold(request: EvaluateRequest, task: Task, head: HeadChoice):
    """(the labelled rows, the gold as the task's label indices with -1 for a label only the head
    has, which rows have gold, the gold as the head's label indices or None): every gold label
    checked against the labels results are over, before the model loads."""
    path = request.input_path
    data = read_labelled(path, request.text_column, request.label_column, task).head(request.limit)
    if head.used:
        task.readout.check_head(head.head)
    checked = head.labels(task)
    for row, names in enumerate(data.gold, start=1):
        missing = [name for name in names if name not in checked]
        if missing:
            raise InputError(f"{path}: row {row} has gold label {missing[0]!r}, which is not in the label set "
                             f"{list(checked)}")
    # zero-shot figures (modes, temperature) index the task's labels (-1: a label only the head has)
    gold, accepted = gold_indices(data, task.labels)
    head_gold = np.array([head.head.labels.index(names[0]) for names in data.gold]) if head.used else None
    if head.used and (gold < 0).any() and (request.compare_modes or request.fit_temperature):
        raise TaskError("{modes} and {temperature} score the task's labels, and some gold labels are only the "
                        "head's; run them without {head}",
                        names={"modes": "compare_modes", "temperature": "fit_temperature", "head": "head"})
    return data, gold, accepted, head_gold


@dataclasses.dataclass(frozen=True)
class MultiLabelSummary:
    """What `evaluate_multilabel_file` measured and wrote, for the report."""

    model: str
    items: int
    task: Task
    label_token_lines: tuple[str, ...]
    at_task: dict
    """`multilabel.metrics` at the task's thresholds (0.5 where it sets none)."""
    picked: tuple
    """Per label the threshold picked on these items (None: none reaches the target, or no positive)."""
    cross_fitted: dict
    """`multilabel.cross_fitted`: the figures at thresholds picked on the other half of the items."""
    target_precision: float | None
    figures: dict
    task_file: str | None = None
    task_values: dict = dataclasses.field(default_factory=dict)
    json_path: str | None = None
    scorer: str = "zero-shot"
    """Whose probabilities the figures are of: zero-shot, or a one-vs-rest head (head, combined)."""
    zero_shot: dict | None = None
    """With a head: zero-shot's cross-fitted figures on the same items, for comparison."""
    items_used_to_fit: int = 0
    """With a head: how many of these items fitted it (its figures on them are optimistic)."""


def evaluate_multilabel_file(request: EvaluateRequest, task: Task, settings: EngineSettings | None = None, *,
                             model=None, head: HeadChoice = HeadChoice()) -> MultiLabelSummary:
    """Score a file with `;`-separated gold labels under a multi-label task: the figures at the
    task's thresholds, per-label thresholds picked on these items (F1-optimal, or the lowest reaching
    the request's `target_precision`), and the figures at thresholds picked on the other half
    (cross-fitted, so not measured where they were tuned). The request's `task_file`: the picked
    thresholds are written into it. With a one-vs-rest head (`head.used`) the figures are the
    head's, at the head's own thresholds, with zero-shot's cross-fitted figures alongside."""
    path, target_precision, task_file, json_path = (request.input_path, request.target_precision, request.task_file,
                                                    request.json_path)
    task.readout.check_options(request.options_given())
    settings = settings or EngineSettings()
    if head.used:
        task.readout.check_head(head.head)
    if head.used and task_file:
        raise TaskError("a multi-label head keeps its own thresholds (picked when it was fitted): evaluate it "
                        "without {write}, or refit it", names={"write": "write_task"})
    data = read_labelled(path, request.text_column, request.label_column, task).head(request.limit)
    gold = multilabel.gold_matrix([cell[0] for cell in data.gold], task.labels, task.label_separator, path)
    loaded = load_model(model, settings.device, settings.precision, task=task, sample=data.texts, settings=settings)
    clf = Classifier(task, model=loaded, settings=settings)
    extra = {}
    if head.used:
        from ..head.apply import check, head_log_probabilities, items_used_to_fit

        check(head.head, clf, head.source or "the head")
        scored = clf.score(clf.encode(data.texts, head.head.taps), taps=head.head.taps)
        ok = ~np.isnan(scored.scores).any(axis=1)  # empty items have no scores
        calibrated, gold = clf.calibration.calibrated(scored.scores[ok]), gold[ok]
        zero = multilabel.probabilities(calibrated)
        probs = multilabel.probabilities(head_log_probabilities(head.head, calibrated, scored.states[ok], task.labels,
                                                                head.scorer))
        thresholds = head.head.thresholds
        extra = {"scorer": head.scorer, "zero_shot": multilabel.cross_fitted(zero, gold, task.labels, target_precision),
                 "items_used_to_fit": items_used_to_fit(head.head, [t for t, keep in zip(data.texts, ok) if keep])}
    else:
        scores = clf.score(clf.encode(data.texts)).scores
        ok = ~np.isnan(scores).any(axis=1)  # empty items have no scores
        probs, gold = multilabel.probabilities(clf.calibration.calibrated(scores[ok])), gold[ok]
        thresholds = task.label_thresholds
    at_task, picked, honest = _multilabel_figures(probs, gold, task.labels, thresholds, target_precision)
    figures = {"items": int(ok.sum()), "at_task_thresholds": at_task, "picked_thresholds": dict(zip(task.labels, picked)),
               "cross_fitted": honest, "target_precision": target_precision, **extra}
    values = {}
    if task_file:
        values["thresholds"] = [round(t, 4) if t is not None else old for t, old in zip(picked, task.label_thresholds)]
        write_task_settings(task_file, **values)
    if json_path:
        Path(json_path).write_text(json.dumps(figures, indent=2))
    return MultiLabelSummary(
        model=loaded.name, items=int(ok.sum()), task=task,
        label_token_lines=tuple(label_token_lines(clf)),
        at_task=at_task, picked=picked, cross_fitted=honest, target_precision=target_precision, figures=figures,
        task_file=task_file, task_values=values, json_path=json_path, **extra)


_LABEL_REPORTS = Kinds(one_label=_evaluate_one_label, several_labels=evaluate_multilabel_file)
"""The evaluate job's report of a task of labels, per kind of answer (`Readout.pick`)."""


def _multilabel_figures(probs: np.ndarray, gold: np.ndarray, labels: tuple[str, ...], thresholds,
                        target_precision: float | None) -> tuple[dict, tuple, dict]:
    """Of [n, L] P(yes) against [n, L] bool gold: (the figures at `thresholds`, the thresholds picked
    on all items, the figures at thresholds picked on the other half: cross-fitted)."""
    return (multilabel.metrics(probs, gold, thresholds, labels),
            tuple(multilabel.pick_thresholds(probs, gold, target_precision)),
            multilabel.cross_fitted(probs, gold, labels, target_precision))


@dataclasses.dataclass(frozen=True)
class QuestionsSummary:
    """What `evaluate_questions_file` measured and wrote, for the report."""

    model: str
    items: int
    """Items scored (empty texts have no answers and are left out)."""
    task: Task
    mode: str
    mode_reason: str
    precision_line: str | None
    label_token_lines: tuple[str, ...]
    """Each question's branches and their tokens after the chat template."""
    questions: tuple[QuestionFigures, ...]
    """The questions that have a gold column, in the task's order: each one's figures, as its readout
    measures them (`core/figures.py`)."""
    not_reported: tuple[str, ...]
    """The questions scored without a gold column."""
    figures: dict
    json_path: str | None = None


def evaluate_questions_file(request: EvaluateRequest, task: Task, settings: EngineSettings | None = None, *,
                            model=None) -> QuestionsSummary:
    """Score the items of a table once under a task with questions and measure each question that
    has a gold column (`request.gold_columns`) from its own columns of those scores: a single-choice
    question as `evaluate_file` (accuracy, macro-F1, ECE, and without its calibration), a multi-label
    one as `evaluate_multilabel_file` (at its thresholds, and cross-fitted). Writes the JSON asked for."""
    columns = dict(request.gold_columns)
    names = [q.name for q in task.asked]
    if not columns_for(task).named:
        raise TaskError("evaluate_questions_file measures a task with questions; a task of labels is evaluated by "
                        "evaluate_file (one gold column)")
    if not columns:
        raise TaskError(f"a task with questions is measured against a gold column per question: name one for any "
                        f"of {', '.join(names)}")
    for name in columns:
        if name not in names:
            raise TaskError(f"gold column {columns[name]!r} is for question {name!r}, which the task does not ask; "
                            f"its questions are {', '.join(names)}")
    settings = settings or EngineSettings()
    texts, cells = read_gold_columns(request.input_path, request.text_column, columns, task)
    texts, cells = texts[:request.limit], {name: rows[:request.limit] for name, rows in cells.items()}
    asked = [(q, branches, labels) for (q, branches), (_, labels) in zip(qs.branch_spans(task), qs.label_spans(task))
             if q.name in columns]
    source = {q.name: f"{request.input_path}: column {columns[q.name]!r}" for q, _, _ in asked}
    for q, _, _ in asked:  # every cell checked before the model loads
        q.readout.question_gold(q, cells[q.name], source[q.name])
    loaded = load_model(model, settings.device, settings.precision, task=task, sample=texts, settings=settings)
    clf = Classifier(task, model=loaded, settings=settings)
    scores = clf.score(clf.encode(texts)).scores  # [n, B]: every question's branches, one pass
    ok = ~np.isnan(scores).any(axis=1)  # empty items have no scores
    scores = scores[ok]
    calibrated = clf.calibration.calibrated(scores)  # [n, C]
    reports = [q.readout.question_figures(q, columns[q.name], scores[:, branches], calibrated[:, labels],
                                          q.readout.question_gold(q, list(compress(cells[q.name], ok)), source[q.name]),
                                          request) for q, branches, labels in asked]
    not_reported = tuple(name for name in names if name not in columns)
    figures = {"items": int(ok.sum()), "mode": clf.mode, "questions": {r.name: r.figures for r in reports},
               "not_reported": list(not_reported)}
    if request.json_path:
        Path(request.json_path).write_text(json.dumps(figures, indent=2))
    return QuestionsSummary(
        model=loaded.name, items=int(ok.sum()), task=task, mode=clf.mode, mode_reason=clf.mode_reason,
        precision_line=auto_line(loaded), label_token_lines=tuple(label_token_lines(clf)), questions=tuple(reports),
        not_reported=not_reported, figures=figures, json_path=request.json_path)


def _compare_modes(run, evaluation, task: Task, loaded, settings, texts) -> list[dict]:
    """Every scoring mode, uncalibrated and calibrated, on the same items: one row each."""
    rows = []
    for m in ("first", "full", "full-mean"):
        try:
            mclf, mscores, msec = run(task.with_overrides(mode=m, calibrate=False))
        except TaskError:
            # Labels share first tokens: score them the article's way anyway (tied labels get
            # equal scores and the first in label order wins), as the baseline to beat.
            mclf = Classifier(task.with_overrides(mode="full", calibrate=False), model=loaded, settings=settings)
            mclf = mclf.variant(trie=build_trie(task.labels, list(mclf.trie.sequences), "first"))
            start = time.perf_counter()
            mscores = mclf.score(mclf.encode(texts)).scores
            msec = time.perf_counter() - start
        prior = content_free_prior(mclf)
        for bias in (None, prior):
            ev = evaluation(m, mscores, bias, 1.0, mclf, msec)
            rows.append({"mode": m, "calibrated": bias is not None, "accuracy": ev.accuracy,
                         "macro_f1": ev.macro_f1, "ece": ev.ece, "items_per_s": len(texts) / msec})
    return rows


def _write(result: EvaluateSummary, request: EvaluateRequest, temperature) -> EvaluateSummary:
    """Write the plots, the task file's threshold (and fitted temperature) and the JSON asked for."""
    plots_dir, task_file, json_path = request.plots_dir, request.task_file, request.json_path
    plots = tuple(str(p) for p in write_plots(result.main, plots_dir)) if plots_dir else ()
    values = {}
    if task_file:
        threshold = result.figures.get("threshold")
        if threshold is not None:
            values["min_confidence"] = round(float(threshold), 4)
        if temperature is not None:
            values["temperature"] = round(float(temperature), 4)
        if values:
            write_task_settings(task_file, **values)
    if json_path:
        Path(json_path).write_text(json.dumps(result.figures, indent=2))
    return dataclasses.replace(result, plots=plots, task_file=task_file, task_values=values, json_path=json_path)

def _check_matplotlib(field: str) -> None:
    """Refuse before the work when plots are asked for and matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise TaskError("{field} needs matplotlib: pip install 'slmclassify[plots]'", names={"field": field}) from None


def fit_temperature_on(scores, bias, gold) -> float:
    return fit_temperature(adjust(scores, bias, 1.0), gold)

def _fewshot_cost(loaded, task: Task, settings, texts, gold_names, per_label: int) -> dict:
    """Per-item time with no examples and with `per_label` examples per label in the cached prefix."""
    examples = []
    for label in task.labels:
        picked = [t for t, g in zip(texts, gold_names) if g == label][:per_label]
        examples += [Example(t, label) for t in picked]
    out, sides = {}, []
    for name, ex in (("zero_shot", ()), (f"{per_label}_per_label", tuple(examples))):
        clf = Classifier(task.with_overrides(examples=ex), model=loaded, settings=settings)
        clf.score(clf.encode(texts[:8]))  # warm-up
        sides.append(Side(name, lambda _, clf=clf: clf.score(clf.encode(texts))))
        out[name] = {"prefix_tokens": len(clf.prefix_ids)}
    timings = interleave(sides, rounds=2, warmup=0)  # A B, then B A: drift hits both alike
    for name in timings.names:
        out[name]["ms_per_item"] = 1000 * timings.median(name) / len(texts)
    out["cost_ratio"] = timings.speedup(f"{per_label}_per_label", "zero_shot")  # its seconds over zero-shot's
    return out

