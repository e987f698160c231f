"""The `fit` job: labelled file → features on the fast path → head, with cross-validated figures
next to zero-shot scoring on the same items, and the learning curve (table and PNG)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from ..classifier import Classifier, EngineSettings
from ..core.metrics import Evaluation
from ..io.labelled import read_labelled
from ..errors import FieldError, InputError, TaskError
from ..models.prepare import load_model
from ..models.precision import auto_line
from ..core.results import softmax
from ..core.questions import label_spans
from ..core.task import Task
from ..head.apply import text_hashes
from ..core.taps import Taps
from ..head.features import anchor_texts, candidate_taps, collect, default_taps, feature_sets
from ..head.fitting import CURVE_SIZES, Anchors, cross_validated, fit, learning_curve
from ..head.model import Head, model_fingerprint, task_record
from ..core.readout import Kinds


@dataclasses.dataclass(frozen=True)
class FitRequest:
    """Which labelled file to fit a head on, where to save it, and how to fit it (everything but the
    task, settings, model)."""

    input_path: str
    """A labelled table (CSV, JSONL, Parquet) or a BIG-bench task JSON."""
    output_path: str
    """The head file to write (.npz)."""
    text_column: str = "text"
    label_column: str = "label"
    """Column of gold labels (tables; a multi-label task's are `;`-separated label sets)."""
    gold_columns: tuple[tuple[str, str], ...] = ()
    """A task with questions: (question, its gold column) for each question to fit a head for."""
    group_column: str | None = None
    """Column grouping near copies of one text: cross-validation keeps each group in one fold."""
    folds: int = 5
    """Cross-validation folds (at least 2)."""
    taps: Taps | None = None
    """What the head reads (None: chosen by cross-validation; multi-label: the default taps)."""
    use_scores: bool = False
    """Append the calibrated label log-probabilities to the features."""
    curve_sizes: tuple[int, ...] = CURVE_SIZES
    """Learning curve: items per label."""
    plot_path: str | None = None
    """The learning-curve PNG (None: next to the head file)."""
    json_path: str | None = None
    """Write the figures as JSON."""
    seed: int = 0
    from_descriptions: bool = False
    """No gold: a head from the labels' descriptions and the file's items (`head/describe.py`)."""
    echo: bool | None = None
    """Each text read twice for the features (`core/taps.py`): None reads the texts once and twice
    and lets cross-validation choose among both passes' sets (a task of one label per item, without
    --layers or --scores; else once); True twice only; False once only."""

    def __post_init__(self) -> None:
        if self.folds < 2:
            raise FieldError("folds", "{field} must be at least 2, got {value}", value=self.folds)
        if self.from_descriptions:
            given = [name for name, value in (("gold_columns", self.gold_columns), ("group_column", self.group_column),
                                              ("taps", self.taps), ("use_scores", self.use_scores), ("echo", self.echo),
                                              ("plot_path", self.plot_path), ("json_path", self.json_path)) if value]
            if given:
                raise FieldError(given[0], "{field} does not apply to a head from the descriptions: it reads no gold "
                                 "and chooses nothing by cross-validation")


@dataclasses.dataclass(frozen=True)
class ScorerFigures:
    """One row of the comparison table: a scorer's cross-validated (or zero-shot) figures."""

    name: str
    accuracy: float
    macro_f1: float
    ece: float


@dataclasses.dataclass(frozen=True)
class FitSummary:
    """What `fit_file` measured and wrote, for the summary."""

    model: str
    skipped: int
    """Empty texts left out."""
    items: int
    counts: dict
    """Items per label."""
    taps: Taps
    """What the head reads."""
    choice: str
    """How its feature set was chosen: 'mean (by cross-validation among mean, last, mean+last)', or 'given'."""
    feature_values: int
    use_scores: bool
    seconds: float
    """The fast-path passes that read the features."""
    precision_line: str | None
    """`--precision auto`'s decision, when it made one."""
    rows: tuple[ScorerFigures, ...]
    """zero-shot (when comparable) and the head's cross-validated figures."""
    zero_shot_comparable: bool
    folds: int
    curve: tuple[tuple[int, float], ...]
    """(items per label, cross-validated accuracy)."""
    curve_sizes: tuple[int, ...]
    smallest_fold: int
    """Items per label a training fold holds (the least of the labels)."""
    C: float
    head: Head
    output: str
    plot_path: str | None
    """The learning-curve PNG written (None: no curve)."""
    json_path: str | None
    multi_label_rows: tuple[tuple[str, dict], ...] = ()
    """A multi-label head: (scorer, `multilabel` metrics at thresholds picked on the other half) for
    zero-shot and the head's out-of-fold probabilities; `rows` and the curve are then empty."""
    warnings: tuple[str, ...] = ()
    """What may make the figures optimistic (items that share their first words, without groups)."""
    passes: int = 1
    """The texts read once, or once and twice (`FitRequest.echo`)."""


def fit_file(request: FitRequest, task: Task, settings: EngineSettings, *, model=None) -> FitSummary:
    """Fit a head on the request's labelled file and save it (and the curve's PNG, the figures as
    JSON); returns the CV metrics, zero-shot alongside and the learning curve."""
    if request.from_descriptions:
        return fit_descriptions(request, task, settings, model=model)
    return task.shaped(lambda t: _fit_labels(request, t, settings, model),
                       lambda t: fit_questions(request, t, settings, model=model))


def _fit_labels(request: FitRequest, task: Task, settings: EngineSettings, model) -> FitSummary:
    """A task of labels' head, fitted on its one gold column as the kind of head its readout learns with."""
    if request.gold_columns:
        raise TaskError("{field} {pair}: NAME=COLUMN is for a task with questions, and this task has none; give its "
                        "gold column alone", names={"field": "gold_column"}, pair="=".join(request.gold_columns[0]))
    data = read_labelled(request.input_path, request.text_column, request.label_column, task, request.group_column)
    return task.readout.pick(_FILE_FITS)(request, task, settings, data, model)


@dataclasses.dataclass(frozen=True)
class _OneLabelGold:
    """The labelled items a one-label head learns from: the empty texts dropped, checked for CV."""

    texts: list[str]
    gold: np.ndarray
    groups: np.ndarray | None
    labels: tuple[str, ...]
    """The gold column's labels, sorted: the head's."""
    counts: dict[str, int]
    skipped: int
    warnings: tuple

    @classmethod
    def read(cls, request: FitRequest, data) -> _OneLabelGold:
        path, folds = request.input_path, request.folds
        texts, gold = data.texts, [names[0] for names in data.gold]  # a head learns one label per item
        keep = [i for i, t in enumerate(texts) if t.strip()]
        texts, gold = [texts[i] for i in keep], np.array([gold[i] for i in keep])
        groups = None if data.groups is None else np.array([data.groups[i] for i in keep])
        labels = tuple(sorted(set(gold.tolist())))
        counts = {lab: int((gold == lab).sum()) for lab in labels}
        if len(labels) < 2:
            raise InputError(f"{path}: the gold column {request.label_column!r} has fewer than two labels: "
                             f"{list(labels)}")
        if min(counts.values()) < folds:
            raise InputError("{path}: label {label!r} has {items} items; {folds}-fold cross-validation needs at least "
                             "{folds} per label (or pass {folds_field})", names={"folds_field": "folds"}, path=path,
                             label=min(counts, key=counts.get), items=min(counts.values()), folds=folds)
        return cls(texts, gold, groups, labels, counts, len(data.texts) - len(keep),
                   () if groups is not None else shared_openings(texts))


def _fit_one_label(request: FitRequest, task: Task, settings: EngineSettings, data, model) -> FitSummary:
    """`fit_file` for a task of one label per item (a multinomial head over the gold's labels)."""
    data = _OneLabelGold.read(request, data)
    path, output, folds, seed = request.input_path, request.output_path, request.folds, request.seed
    taps, use_scores = request.taps, request.use_scores
    texts, gold, groups, labels, counts = data.texts, data.gold, data.groups, data.labels, data.counts
    given = taps is not None
    described = anchor_texts(task)
    # without a choice to make (--layers) or with the label scores as features (those of the pass the head reads
    # at classify), one pass
    echo = (False, True) if request.echo is None and not given and not use_scores else (bool(request.echo),)
    loaded, blocks, scores, calibrated, states, seconds = _features(
        model, task, settings, [*texts, *described.values()], taps or "candidates", echo)
    X = np.concatenate([states.astype(np.float64)] + ([calibrated] if use_scores else []), axis=1)
    # the labels' descriptions, read in the same pass: rows every fit learns from and no fold tests
    anchors = Anchors(X[len(texts):], np.array(list(described), dtype=object)).of(labels)
    X, scores, calibrated = X[:len(texts)], scores[:len(texts)], calibrated[:len(texts)]
    # Without --layers, the feature set is chosen by cross-validation: inside each fold for the
    # figures (nested), on all items for the head.
    sets = {} if given else feature_sets(blocks, loaded.model.config.hidden_size, calibrated.shape[1] if use_scores else 0)
    candidates = {name: columns for name, (_, columns) in sets.items()} or None
    gold_idx = np.array([labels.index(g) for g in gold])
    probs = cross_validated(X, gold, labels, folds=folds, seed=seed, candidates=candidates, groups=groups,
                            anchors=anchors)
    head_ev = Evaluation(labels, gold_idx, probs.argmax(1), probs.max(1), name="head")
    rows = [ScorerFigures(f"head ({folds}-fold CV)", head_ev.accuracy, head_ev.macro_f1, head_ev.ece)]
    # an echoed pass's label scores are those of another prompt: no zero-shot row from them
    comparable = set(labels) <= set(task.labels) and not blocks[0].echo
    if comparable:
        zero = softmax(calibrated)
        task_idx = np.array([task.labels.index(g) for g in gold])
        ev = Evaluation(task.labels, task_idx, zero.argmax(1), zero.max(1), name="zero-shot")
        rows.insert(0, ScorerFigures("zero-shot", ev.accuracy, ev.macro_f1, ev.ece))
    zero_shot = rows[0] if comparable else None

    curve = learning_curve(X, gold, labels, sizes=request.curve_sizes, folds=folds, seed=seed, candidates=candidates,
                           groups=groups, anchors=anchors)
    if curve:
        plot_path = request.plot_path or str(Path(output).with_suffix("")) + "-curve.png"
        plot_curve(curve, head_ev.accuracy, zero_shot.accuracy if zero_shot else None,
                   len(gold) * (folds - 1) // folds // len(labels), plot_path)
    else:  # regression: an empty curve crashed matplotlib's log scale after the CV table, and no head was written
        plot_path = None

    final = fit(X, gold, seed=seed, folds=folds, candidates=candidates, groups=groups, anchors=anchors)
    if candidates:
        taps = sets[final.choice][0]
        choice = (f"{final.choice} (by cross-validation among {', '.join(sets)}: the fewest columns within one "
                  f"standard error of the best)")
    else:
        taps, choice = blocks[0], "given"
    info = {"C": final.C, "features": choice, "items": int(len(gold)), "per_label": counts, "folds": folds, "source": str(path),
            "anchors": {lab: text for lab, text in described.items() if anchors is not None and lab in anchors.y},
            "cv": {"accuracy": head_ev.accuracy, "macro_f1": head_ev.macro_f1, "ece": head_ev.ece},
            "zero_shot": ({"accuracy": zero_shot.accuracy, "macro_f1": zero_shot.macro_f1, "ece": zero_shot.ece}
                          if zero_shot else None),
            "curve": [[n, acc] for n, acc in curve], "item_hashes": text_hashes(texts)}
    head = Head(labels=final.labels, taps=taps, use_scores=use_scores, mean=final.mean, scale=final.scale,
                coef=final.coef, intercept=final.intercept, model=model_fingerprint(loaded), task=task_record(task),
                info=info)
    head.save(output)
    _write_json(request.json_path, info)
    return FitSummary(
        model=loaded.name, skipped=data.skipped, items=len(texts), counts=counts, taps=taps, choice=choice,
        feature_values=len(taps) * loaded.model.config.hidden_size, use_scores=use_scores, seconds=seconds,
        passes=len(blocks), precision_line=auto_line(loaded), rows=tuple(rows), zero_shot_comparable=comparable, folds=folds,
        curve=tuple((int(n), float(acc)) for n, acc in curve), curve_sizes=tuple(request.curve_sizes),
        smallest_fold=min(counts.values()) * (folds - 1) // folds, C=final.C, head=head, output=output,
        plot_path=plot_path, json_path=request.json_path, warnings=data.warnings)


@dataclasses.dataclass(frozen=True)
class QuestionsFitSummary:
    """What `fit_questions` measured and wrote: a row per question fitted."""

    model: str
    skipped: int
    """Empty texts left out."""
    items: int
    taps: Taps
    """What the one pass read (every candidate, or the taps given)."""
    feature_values: int
    use_scores: bool
    seconds: float
    """The one fast-path pass that read the features of every question."""
    precision_line: str | None
    folds: int
    fits: tuple
    """`head.questions.QuestionFit` per question with a gold column, in the task's order."""
    not_fitted: tuple[str, ...]
    """The task's questions without a gold column: answered zero-shot."""
    output: str
    json_path: str | None
    warnings: tuple[str, ...] = ()


def fit_questions(request: FitRequest, task: Task, settings: EngineSettings, *, model=None) -> QuestionsFitSummary:
    """A task with questions: one pass over the items reads the features of every question, then
    each question with a gold column (`request.gold_columns`) gets its head (`head/questions.py`),
    saved together in one file (`QuestionHeads`).

    Each question chooses its own feature set by cross-validation, as `fit` does for one question:
    the pass reads every candidate anyway, so a choice per question costs no forward, and the
    questions differ (which team is a topic, how urgent a tone); `classify --head` then reads the
    union of the chosen taps in its one pass."""
    from ..head.model import QuestionHeads
    from ..head.questions import fit_question, question_anchors, question_gold
    from ..io.labelled import read_gold_columns

    if request.plot_path:
        raise FieldError("plot_path", "{field} draws the learning curve of a task of one question; a task with "
                         "questions is fitted without one: run without {field}")
    path, folds, seed = request.input_path, request.folds, request.seed
    columns = dict(request.gold_columns)
    names = [q.name for q in task.questions]
    if not columns:
        raise TaskError("this task asks questions ({asked}): give each one's gold column as {field} NAME=COLUMN, e.g. "
                        "{field} {first}=COLUMN", names={"field": "gold_column"}, first=names[0], asked=", ".join(names))
    for name in columns:
        if name not in names:
            raise TaskError(f"gold column {columns[name]!r} is for question {name!r}, which the task does not ask; "
                            f"its questions are {', '.join(names)}")
    if request.group_column:
        raise FieldError("group_column", "{field} is not taken with a task with questions yet: run without it")
    if request.echo:
        raise FieldError("echo", "{field} is for a task of one question; a task with questions reads each text once: "
                         "run without it")
    texts, cells = read_gold_columns(path, request.text_column, columns, task)
    keep = [i for i, t in enumerate(texts) if t.strip()]
    skipped, texts = len(texts) - len(keep), [texts[i] for i in keep]
    asked = [(q, labels) for q, labels in label_spans(task) if q.name in columns]
    gold = {q.name: question_gold(q, [cells[q.name][i] for i in keep], f"{path}: column {columns[q.name]!r}", folds)
            for q, _ in asked}  # every cell checked before the model loads

    given = request.taps is not None
    # every asked question's labels read as items in the same pass (a single-choice head's anchors)
    described = {q.name: question_anchors(q) for q, _ in asked}
    extra = [t for texts_q in described.values() for t in texts_q.values()]
    loaded, (taps,), _, calibrated, states, seconds = _features(model, task, settings, [*texts, *extra],
                                                                request.taps or "candidates")
    fitted_for = {"model": model_fingerprint(loaded), "task": task_record(task)}
    starts = np.cumsum([len(texts)] + [len(t) for t in described.values()])
    rows = {name: slice(a, b) for name, a, b in zip(described, starts[:-1], starts[1:])}
    anchors = {q.name: (tuple(described[q.name]), states[rows[q.name]], calibrated[rows[q.name], labels]) for q, labels in asked}
    states, calibrated = states[:len(texts)], calibrated[:len(texts)]
    fits = tuple(fit_question(q, states, calibrated[:, labels], gold[q.name], taps, given=given,
                              use_scores=request.use_scores, folds=folds, seed=seed, **fitted_for,
                              anchors=anchors[q.name])
                 for q, labels in asked)
    info = {"items": len(texts), "folds": folds, "source": str(path), "gold_columns": columns,
            "item_hashes": text_hashes(texts)}
    QuestionHeads(heads={f.name: f.head for f in fits}, info=info, **fitted_for).save(request.output_path)
    _write_json(request.json_path, {**info, "questions": {f.name: f.head.info for f in fits}})
    return QuestionsFitSummary(
        model=loaded.name, skipped=skipped,
        items=len(texts), taps=taps, feature_values=int(states.shape[1]), use_scores=request.use_scores,
        seconds=seconds, precision_line=auto_line(loaded), folds=folds, fits=fits,
        not_fitted=tuple(n for n in names if n not in columns), output=request.output_path,
        json_path=request.json_path, warnings=shared_openings(texts))


@dataclasses.dataclass(frozen=True)
class DescriptionsFitSummary:
    """What `fit_descriptions` read and wrote."""

    model: str
    items: int
    """Non-empty items the head is centred on."""
    labels: tuple[tuple[str, str], ...]
    """(label, the words read for it: its description or its name)."""
    taps: Taps
    seconds: float
    precision_line: str | None
    head: Head
    output: str


def fit_descriptions(request: FitRequest, task: Task, settings: EngineSettings, *, model=None) -> DescriptionsFitSummary:
    """A head without gold (`head/describe.py`): one pass reads the file's items and each label's
    description (or name) as an item; the head is their cosine similarity, centred on the items."""
    from ..head.describe import TEMPERATURE, description_head, description_taps, label_words
    from ..io.readers import read_table, texts_of

    task.shaped(lambda t: None, lambda t: _not_described("questions"))
    task.readout.pick(_DESCRIBED)()
    if task.multi_field:
        _not_described("several fields")
    path = request.input_path
    texts = (read_labelled(path, request.text_column, request.label_column).texts if path.endswith(".json")
             else texts_of(read_table(path, request.text_column), request.text_column, name=path))
    words = label_words(task)
    loaded, (taps,), _, _, states, seconds = _features(model, task, settings, [*texts, *words], description_taps)
    items = int((~np.isnan(states[:len(texts)]).any(axis=1)).sum())
    # no `item_hashes`: the items only centre the head (no gold is read), so its figures on them are
    # not the optimistic ones of a head fitted to their labels
    info = {"from_descriptions": dict(zip(task.labels, words)), "items": items, "temperature": TEMPERATURE,
            "source": str(path)}
    head = description_head(states[:len(texts)], states[len(texts):], task.labels, taps,
                            model=model_fingerprint(loaded), task=task_record(task), info=info)
    head.save(request.output_path)
    return DescriptionsFitSummary(model=loaded.name, items=items, labels=tuple(zip(task.labels, words)), taps=taps,
                                  seconds=seconds, precision_line=auto_line(loaded), head=head,
                                  output=request.output_path)


def _not_described(kind: str) -> None:
    raise FieldError("from_descriptions", "{field} makes a head for one label per item from one text; this task "
                     f"has {kind}: run without it")


_DESCRIBED = Kinds(one_label=lambda: None, several_labels=lambda: _not_described("several labels per item"))
"""What each kind of head says of a head from the descriptions, a softmax over one label per item: that one
is made, that several labels per item are refused."""


OPENING_WORDS = 5
SHARED_OPENINGS = 0.2


def shared_openings(texts: list[str]) -> tuple[str, ...]:
    """A warning when more than `SHARED_OPENINGS` of the items share their first `OPENING_WORDS`
    words with another item: near copies that folds split apart make cross-validated figures
    optimistic (a test item's twin taught the head), or pessimistic when twins carry opposite labels."""
    openings = [" ".join(t.lower().split()[:OPENING_WORDS]) for t in texts]
    seen: dict[str, int] = {}
    for o in openings:
        seen[o] = seen.get(o, 0) + 1
    shared = sum(1 for o in openings if seen[o] > 1 and len(o.split()) == OPENING_WORDS)
    if shared <= SHARED_OPENINGS * len(texts):
        return ()
    return (f"{shared} of {len(texts)} items share their first {OPENING_WORDS} words with another item; if they "
            f"are variants of one text, pass --group-column naming a column that groups them, so that "
            f"cross-validation keeps each group in one fold (its figures can mislead otherwise)",)


def _features(model, task: Task, settings: EngineSettings, texts, taps, echo: tuple[bool, ...] = (False,)):
    """(loaded model, the taps of each pass, raw scores, calibrated scores, states, seconds) of one
    fast-path pass per `echo` value (the texts read once, or twice: `core/taps.py`), their states side
    by side, the label scores the first pass's. `taps`: the ones given, 'candidates' (every feature
    set `fit` chooses among), 'default', or a function of the model's layer count
    (`head.describe.description_taps`)."""
    loaded = load_model(model, settings.device, settings.precision, task=task, sample=texts, settings=settings)
    clf = Classifier(task, model=loaded, settings=settings)
    layers = loaded.model.config.num_hidden_layers
    if isinstance(taps, str):
        taps = {"candidates": candidate_taps, "default": default_taps}[taps]
    taps = taps(layers) if callable(taps) else taps
    blocks = [dataclasses.replace(taps, echo=e) for e in echo]
    start = time.perf_counter()
    passes = [collect(clf, clf.encode(texts, b), b) for b in blocks]
    states = np.concatenate([states for _, _, states in passes], axis=1)
    return loaded, blocks, passes[0][0], passes[0][1], states, time.perf_counter() - start


def _fit_multilabel(request: FitRequest, task: Task, settings, data, model) -> FitSummary:
    """One-vs-rest heads (`head/one_vs_rest.py`) on `;`-separated gold labels: each label's
    thresholds F1-optimal on its out-of-fold probabilities, figures at thresholds picked on the
    other half of the items (zero-shot's and the head's alike)."""
    from ..core import multilabel
    from ..head.one_vs_rest import check_counts, cross_validated_one_vs_rest, fit_one_vs_rest

    if request.echo:
        raise FieldError("echo", "{field} is for a task of one label per item; a multi-label task's heads read "
                         "each text once: run without it")
    path, output, folds, seed = request.input_path, request.output_path, request.folds, request.seed
    taps, use_scores, json_path = request.taps, request.use_scores, request.json_path

    keep = [i for i, t in enumerate(data.texts) if t.strip()]
    texts = [data.texts[i] for i in keep]
    gold = multilabel.gold_matrix([data.gold[i][0] for i in keep], task.labels, task.label_separator, path)
    check_counts(gold, task.labels, folds, path)
    given = taps is not None
    loaded, (taps,), _, calibrated, states, seconds = _features(model, task, settings, texts, taps or "default")
    X = np.concatenate([states.astype(np.float64)] + ([calibrated] if use_scores else []), axis=1)
    oof = cross_validated_one_vs_rest(X, gold, folds=folds, seed=seed)
    zero = multilabel.probabilities(calibrated)
    rows = (("zero-shot", multilabel.cross_fitted(zero, gold, task.labels, seed=seed)),
            (f"head ({folds}-fold CV)", multilabel.cross_fitted(oof, gold, task.labels, seed=seed)))
    thresholds = tuple(multilabel.pick_thresholds(oof, gold, fallback=0.5))
    final = fit_one_vs_rest(X, gold, task.labels, seed=seed, folds=folds)
    counts = {label: int(n) for label, n in zip(task.labels, gold.sum(0))}
    brief = lambda m: {k: m[k] for k in ("micro_f1", "macro_f1", "subset_accuracy", "hamming_loss")}  # noqa: E731
    info = {"C": list(final.C), "items": len(texts), "per_label": counts, "folds": folds, "source": str(path),
            "cv": brief(rows[1][1]), "zero_shot": brief(rows[0][1]), "thresholds": list(thresholds),
            "item_hashes": text_hashes(texts)}
    head = Head(labels=task.labels, taps=taps, use_scores=use_scores, mean=final.mean, scale=final.scale,
                coef=final.coef, intercept=final.intercept, model=model_fingerprint(loaded), task=task_record(task),
                info=info, multi_label=True, thresholds=thresholds)
    head.save(output)
    _write_json(json_path, info)
    return FitSummary(
        model=loaded.name, skipped=len(data.texts) - len(texts), items=len(texts), counts=counts, taps=taps,
        choice="given" if given else "default", feature_values=int(states.shape[1]), use_scores=use_scores, seconds=seconds,
        precision_line=auto_line(loaded), rows=(), zero_shot_comparable=True, folds=folds, curve=(),
        curve_sizes=(), smallest_fold=0, C=float(np.median(final.C)), head=head, output=output,
        plot_path=None, json_path=json_path, multi_label_rows=rows)


def _write_json(path: str | None, info: dict) -> None:
    """The head's figures (its `info`, less the item hashes) as JSON, when a path is given."""
    if path:
        Path(path).write_text(json.dumps({k: v for k, v in info.items() if k != "item_hashes"}, indent=2))


def plot_curve(curve, full_accuracy: float, zero_shot: float | None, full_per_label: int, path: str) -> None:
    """Accuracy vs labelled items per label, with the full-data head and zero-shot as references."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([n for n, _ in curve], [a for _, a in curve], marker="o", label="head")
    ax.axhline(full_accuracy, color="green", linestyle=":", label=f"head, all items (~{full_per_label}/label)")
    if zero_shot is not None:
        ax.axhline(zero_shot, color="gray", linestyle="--", label="zero-shot")
    ax.set_xscale("log", base=2)
    ax.set_xticks([n for n, _ in curve], [str(n) for n, _ in curve])
    ax.set_xlabel("labelled items per label")
    ax.set_ylabel("accuracy (cross-validated)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("learning curve")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


_FILE_FITS = Kinds(one_label=_fit_one_label, several_labels=_fit_multilabel)
"""How a task of labels' file is fitted, by the kind of head its readout learns with."""
