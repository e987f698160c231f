"""Turn label scores into probabilities, a confidence and a review flag; and run statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError

OK, EMPTY, TRUNCATED = "ok", "empty", "truncated"
"""An item's status (`Result.status`): scored whole, empty (not scored), or cut to the item cap."""


@dataclass(frozen=True)
class Result:
    """The outcome for one input item."""

    label: str | None
    """Predicted label (None for empty items)."""
    confidence: float | None
    """Probability of the predicted label."""
    probabilities: dict[str, float]
    """Softmax over the label scores, per label (empty for empty items)."""
    needs_review: bool
    """Confidence below the task's `min_confidence`, or no label at all."""
    status: str
    """ok, empty or truncated."""
    scores: dict[str, float] = field(default_factory=dict)
    """Raw label log-probability scores of the scoring mode (multi-label: of each `name: yes|no` branch)."""
    labels: tuple[str, ...] = ()
    """The predicted labels: (label,), or in a multi-label task those at or above their thresholds
    (then `label` is them joined by the task's separator, `probabilities` each label's P(yes))."""
    answers: dict[str, Result] = field(default_factory=dict)
    """A task of several questions (`core/questions.py`): each question's Result by its name (then
    `label` is None, `needs_review` is any answer's and `confidence` the least sure answer's)."""


def softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax of [n, L] scores."""
    shifted = scores - scores.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def make_results(labels, scores: np.ndarray, calibrated: np.ndarray, status: list[str],
                 min_confidence: float) -> list[Result]:
    """[n, L] raw and calibrated scores (NaN rows for empty items) → one Result per item, in order.

    Probabilities are the softmax of the calibrated scores; `scores` keeps the raw ones.
    """
    results = []
    probs = softmax(np.nan_to_num(calibrated, nan=0.0))
    for i, st in enumerate(status):
        if st == EMPTY:
            results.append(Result(None, None, {}, True, st))
            continue
        best = int(np.argmax(probs[i]))
        conf = float(probs[i, best])
        results.append(
            Result(
                label=labels[best],
                confidence=conf,
                probabilities={lab: float(p) for lab, p in zip(labels, probs[i])},
                needs_review=conf < min_confidence,
                status=st,
                scores={lab: float(s) for lab, s in zip(labels, scores[i])},
                labels=(labels[best],),
            )
        )
    return results


@dataclass
class RunStats:
    """What one classify run did."""

    items: int = 0
    scored: int = 0
    seconds: float = 0.0
    real_tokens: int = 0
    """Non-pad tokens run through the model (suffixes, and full prompts of fallbacks)."""
    processed_tokens: int = 0
    """Tokens run including padding."""
    prefix_tokens: int = 0
    """Length of the shared prefix, run once."""
    prefix_reused: int = 0
    """Prefix tokens not recomputed: prefix length × items that used the cache."""
    fallbacks: int = 0
    batches: int = 0
    reused: int = 0
    """Scored items that took the scores of an identical item of their window (duplicates)."""

    def add(self, other: RunStats) -> None:
        """Accumulate another part of the same run: counts and seconds add up; prefix_tokens is the
        run's prefix length, which every part that ran the prefix shares, so it is not summed."""
        for name in ("items", "scored", "seconds", "real_tokens", "processed_tokens", "prefix_reused",
                     "fallbacks", "batches", "reused"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.prefix_tokens = max(self.prefix_tokens, other.prefix_tokens)

    @classmethod
    def total(cls, parts) -> RunStats:
        """The stats of a whole run from those of its parts (windows, chunks, actors), as `add`."""
        out = cls()
        for part in parts:
            out.add(part)
        return out

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Prompt tokens covered per second (prefix reuse included, padding excluded)."""
        return (self.real_tokens + self.prefix_reused) / self.seconds if self.seconds else 0.0

    @property
    def padding_share(self) -> float:
        return 1 - self.real_tokens / self.processed_tokens if self.processed_tokens else 0.0


@dataclass(frozen=True)
class Columns:
    """What a task's results are written as (`columns_for`): one answer's columns per question, in
    order, then `status` (a task of several questions: first `needs_review`, any answer's)."""

    answers: tuple[tuple[str | None, tuple[str, ...], object], ...]
    """Per question: (its name, or None for a task of one question; its labels; its readout,
    `core/readout.py`, which names and types its answer column)."""

    @property
    def named(self) -> bool:
        """Whether the answers are named questions' (then the item has its own `needs_review`)."""
        return self.answers[0][0] is not None


def columns_for(task, labels=None) -> Columns:
    """The result columns of `task`; `labels`: the labels its results use when not the task's (a head's)."""
    return Columns(tuple((q.name, tuple(q.labels if labels is None or q.name is not None else labels), q.readout)
                         for q in task.asked))


def answer_columns(name: str | None, labels, readout, prefix: str) -> list[str]:
    """One answer's columns: `label` (or `labels`), `confidence`, `needs_review`, `p_LABEL`..., each
    after `NAME_` for a question of several (`p_NAME_LABEL`)."""
    own = "" if name is None else f"{name}_"
    return [prefix + c for c in (readout.column(name), f"{own}confidence", f"{own}needs_review",
                                 *(f"p_{own}{lab}" for lab in labels))]


def result_columns(columns: Columns, prefix: str = "") -> list[str]:
    """The columns a classified table gets, in order."""
    names = [c for answer in columns.answers for c in answer_columns(*answer, prefix)]
    return names + [prefix + c for c in (("needs_review",) if columns.named else ()) + ("status",)]


def check_result_columns(existing, columns: Columns, prefix: str = "") -> None:
    """Refuse an input that already has a column the results would overwrite (`result_columns`),
    naming the first and the `result_prefix` that avoids it; and results that would name one column
    twice (a question's `p_NAME_LABEL` that is another question's column)."""
    names = result_columns(columns, prefix)
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise InputError(f"the results would have two columns named {twice[0]!r}; rename a question or a label")
    clash = [c for c in names if c in existing]
    if clash:
        raise InputError("the input already has column {column!r}; pass {prefix} (e.g. pred_) so the results do "
                         "not overwrite it", names={"prefix": "result_prefix"}, column=clash[0])


def result_frame(results: list[Result], columns: Columns, prefix: str = "", index=None, lists: bool = False):
    """The result columns of `results` as a pandas DataFrame (one row per result, in order).

    Types are fixed whatever the rows hold: label and status strings (label None when empty),
    confidence and p_* float64 (NaN when empty), needs_review bool. A multi-label `labels` column
    holds the joined string, or with `lists` (JSONL, Parquet) the list of labels (None when empty).
    """
    import pandas as pd

    data = {}
    for name, labels, readout in columns.answers:
        answers = results if name is None else [r.answers[name] for r in results]
        names = answer_columns(name, labels, readout, prefix)
        data[names[0]] = pd.Series([readout.chosen(r, lists) for r in answers], dtype=object, index=index)
        data[names[1]] = pd.Series([np.nan if r.confidence is None else r.confidence for r in answers],
                                   dtype=np.float64, index=index)
        data[names[2]] = pd.Series([r.needs_review for r in answers], dtype=bool, index=index)
        for column, label in zip(names[3:], labels):
            data[column] = pd.Series([r.probabilities.get(label, np.nan) for r in answers], dtype=np.float64,
                                     index=index)
    if columns.named:
        data[prefix + "needs_review"] = pd.Series([r.needs_review for r in results], dtype=bool, index=index)
    data[prefix + "status"] = pd.Series([r.status for r in results], dtype=object, index=index)
    return pd.DataFrame(data, index=index)


def result_arrow_fields(columns: Columns, prefix: str = "", lists: bool = True) -> list:
    """The Arrow fields of the result columns (Parquet output), matching `result_frame` with `lists`."""
    import pyarrow as pa

    types = []
    for _, labels, readout in columns.answers:
        types += [readout.arrow_type(lists), pa.float64(), pa.bool_(), *([pa.float64()] * len(labels))]
    types += ([pa.bool_()] if columns.named else []) + [pa.string()]
    return [pa.field(n, t) for n, t in zip(result_columns(columns, prefix), types)]
