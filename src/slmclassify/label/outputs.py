"""What a labelling session writes: the answered rows with a `gold` column (or, for a team's work,
every answer as a `datasets` Parquet or a Label Studio import, `exports.py`), and the head fitted on
the answers, saved where `classify --head` reads it.

All work on a snapshot the session takes under its lock, so they write without holding it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..core.readout import Kinds
from ..core.task import Task
from ..errors import FieldError, TaskError
from ..head.model import Head, task_record
from . import refit


def write_gold(frame, gold: dict[int, str | tuple[str, ...]], path: str | Path,
               columns: tuple[str, ...] = ("gold",)) -> int:
    """Write the input rows of `gold` (input row → its answer), in input order, with a `gold`
    column (replacing one the input has); a task of questions: an answer is a tuple, one value per
    column of `columns` (`gold_NAME`). Returns the number of rows written."""
    from ..io.writers import write_table

    rows = sorted(gold)
    out = frame.iloc[rows].copy()
    if columns == ("gold",):
        out["gold"] = [gold[r] for r in rows]
    else:
        for k, column in enumerate(columns):
            out[column] = [gold[r][k] for r in rows]
    write_table(out.reset_index(drop=True), str(path))
    return len(rows)


EXPORT_FORMATS = ("csv", "parquet", "label-studio")


def export_format(path: str | Path, fmt: str | None) -> str:
    """What an export to `path` writes (`fmt`, else from the extension): "table" (fmt "csv": the rows
    with a gold column, in the table format of the path's extension), "parquet" (the `datasets`
    file; a .parquet path's default) or "label-studio" (asked for; a .json path)."""
    suffix = Path(path).suffix.lower()
    if fmt is None:
        fmt = {".parquet": "parquet"}.get(suffix, "csv")
    if fmt not in EXPORT_FORMATS:
        raise FieldError("format", "{field} must be one of {value}, got " + repr(fmt), value=", ".join(EXPORT_FORMATS))
    if fmt == "label-studio" and suffix != ".json":
        raise FieldError("format", "{field} label-studio writes a JSON file: give an export path ending in .json")
    if fmt == "parquet" and suffix != ".parquet":
        raise FieldError("format", "{field} parquet writes a Parquet file: give an export path ending in .parquet")
    return "table" if fmt == "csv" else fmt


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A session's answers by pool position, copied under its lock."""

    answered: dict
    """pos → {annotator: answer}."""
    reviewed: dict
    """pos → (reviewer, answer)."""
    given: dict
    """pos → the consensus answer."""


def labelled_items(snapshot: Snapshot, pool, frame, choice: tuple, text_column: str) -> list:
    """Every answered or reviewed item as `exports.LabelledItem`, in input order; `choice`: the one
    choice each answer makes (its name, its labels, answer → label index: `readouts`)."""
    from .exports import LabelledItem

    _, labels, read = choice
    positions = sorted({*snapshot.answered, *snapshot.reviewed}, key=lambda p: int(pool.rows[p]))
    rows = [int(pool.rows[p]) for p in positions]
    others = [c for c in frame.columns if c != text_column]
    extra = json.loads(frame.iloc[rows][others].to_json(orient="records")) if others and rows else [{}] * len(rows)
    items = []
    for p, row, more in zip(positions, rows, extra):
        reviewer, reviewed = snapshot.reviewed.get(p, (None, None))
        items.append(LabelledItem(row=row, text=pool.texts[p], extra=more,
                                  answers={who: labels[read(v)] for who, v in snapshot.answered.get(p, {}).items()},
                                  reviewer=reviewer, reviewed=None if reviewed is None else labels[read(reviewed)],
                                  gold=labels[read(snapshot.given[p])] if p in snapshot.given else None))
    return items


def write_export(items: list, labels: tuple[str, ...], annotators: tuple[str, ...], path: str | Path, fmt: str,
                 text_column: str) -> int:
    """Write `items` as `fmt` ("parquet" or "label-studio", `exports.py`); the number written."""
    from . import exports

    if fmt == "parquet":
        return exports.write_parquet(items, labels, annotators, path, text_column=text_column)
    return exports.write_label_studio(items, labels, path, text_column=text_column)


def readouts(task: Task) -> list[tuple[str, tuple[str, ...], Callable]]:
    """Each single choice an answer makes, for agreement: (its name, its labels, answer → label index):
    the task's labels; each question's; each label of a multi-label task or question as no / yes."""
    out = []
    for k, q in enumerate(task.asked):  # a task of labels' answer is its one question's, as it is
        pick = (lambda v: v) if q.name is None else (lambda v, k=k: v[k])
        out += q.readout.choices(q.name or "", q.labels, pick)
    return out


def fit_head(path: str | Path, X: np.ndarray, y: np.ndarray, *, task: Task, taps, seed: int,
             est: refit.Estimate | None, item_hashes: list[str], source: str, model: dict,
             anchors=None) -> Head:
    """Fit a head on answered features `X` [m, width] (C by cross-validation when every label has 2
    or more) and save it at `path`. `y`: [m] label names, or [m, L] bool label sets for a
    multi-label task; `est`: the loop's cross-validated estimate, kept in the head's info;
    `anchors`: the labels' descriptions' states by task label index (`fitting.Anchors`; one-label tasks)."""
    return task.readout.pick(_PAGE_FITS)(path, X, y, task=task, taps=taps, seed=seed, est=est,
                                         item_hashes=item_hashes, source=source, model=model, anchors=anchors)


def _fit_one(path, X: np.ndarray, y: np.ndarray, *, task: Task, taps, seed: int, est: refit.Estimate | None,
             item_hashes: list[str], source: str, model: dict, anchors=None) -> Head:
    """`fit_head` for one label per item: a softmax head, C by cross-validation."""
    from ..head.fitting import Anchors, fit

    counts = {lab: int((y == lab).sum()) for lab in sorted(set(y.tolist()))}
    if len(counts) < 2:
        raise TaskError(f"a head needs answers for at least two labels; so far: {counts or 'none'}")
    folds = min(5, min(counts.values()))
    rows = None if anchors is None else Anchors(anchors.X, np.array(task.labels, dtype=object)[anchors.y])
    final = fit(X, y, seed=seed, folds=folds, anchors=rows)
    info = {"C": final.C, "items": int(len(y)), "per_label": counts, "folds": folds, "source": str(source),
            "labelled_by": "slmclassify label", "cv": ({"accuracy": est.mean, "low": est.low, "high": est.high}
                                                        if est is not None else None),
            "item_hashes": item_hashes}
    head = Head(labels=final.labels, taps=taps, use_scores=False, mean=final.mean, scale=final.scale,
                coef=final.coef, intercept=final.intercept, model=model, task=task_record(task), info=info)
    head.save(path)
    return head


def _fit_multi(path, X: np.ndarray, Y: np.ndarray, *, task: Task, taps, seed: int, est: refit.Estimate | None,
               item_hashes: list[str], source: str, model: dict, anchors=None) -> Head:
    """`fit_head` for a multi-label task: one-vs-rest heads (`head/one_vs_rest.py`), thresholds 0.5
    (no anchors: a description is one label's, not a label set)."""
    from ..head.one_vs_rest import fit_one_vs_rest

    labels = task.labels
    for j, label in enumerate(labels):
        yes = int(Y[:, j].sum())
        if min(yes, len(Y) - yes) < refit.MIN_PER_LABEL:
            raise TaskError(f"a head needs at least {refit.MIN_PER_LABEL} answers with and {refit.MIN_PER_LABEL} "
                            f"without each label; {label} is in {yes} of the {len(Y)} answers so far")
    folds = min(5, int(np.minimum(Y.sum(0), len(Y) - Y.sum(0)).min()))
    final = fit_one_vs_rest(X, Y, labels, seed=seed, folds=folds)
    info = {"C": list(final.C), "items": int(len(Y)), "per_label": dict(zip(labels, map(int, Y.sum(0)))),
            "folds": folds, "source": str(source), "labelled_by": "slmclassify label",
            "cv": ({"subset_accuracy": est.mean, "low": est.low, "high": est.high} if est is not None else None),
            "thresholds": "0.5 (the loop's)", "item_hashes": item_hashes}
    head = Head(labels=labels, taps=taps, use_scores=False, mean=final.mean, scale=final.scale,
                coef=final.coef, intercept=final.intercept, model=model, task=task_record(task), info=info,
                multi_label=True, thresholds=(0.5,) * len(labels))
    head.save(path)
    return head


_PAGE_FITS = Kinds(one_label=_fit_one, several_labels=_fit_multi)
"""How the page's Fit fits a head, per kind of answer (`Readout.pick`)."""
