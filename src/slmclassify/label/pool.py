"""The pool of a labelling session: the seeded sample of the input it works on, what scoring found
for each item, and the background pass that scores it.

Rows are the input's row numbers (0-based, as read); a pool position is an index into the
sample's rows, which are kept in input order. The arrays, by pool position:

    zero_shot   [n, L]            the task's calibrated probabilities (NaN until scored, or empty)
    features    [n, taps·hidden]  the hidden states a head reads (zeros until scored)
    scored      [n]               scored and not empty: the rows a head or the picker may use
    visited     [n]               scored, empty or not
    head_probs  [n, L]            the loop head's probabilities (None before its first fit)
    anchors     [A, taps·hidden]  the states of the labels' descriptions read as items, for the columns
                                  `anchor_columns` [A] (NaN until the first slice is scored): every
                                  refit's anchor rows (`fitting.Anchors`)

In a task of questions L is every question's labels side by side (`questions.label_spans`), and
`parts` holds one view of the pool per question: its own labels, guess and loop head, the items,
features and flags shared, its `zero_shot` a view of its columns. So one pass per slice scores
every question, and each question's head is fitted on the same hidden states.

The `Scorer` fills them a slice at a time through one fast-path pass per slice, which gives the
zero-shot scores and the hidden states together. It scores without the session's lock and takes
it only to publish a slice.
"""

from __future__ import annotations

import copy

import numpy as np

from ..core.questions import label_spans
from ..core.taps import Taps
from ..core.task import Task
from ..errors import InputError, TaskError
from ..head.apply import text_hashes
from ..head.features import anchor_texts
from ..head.fitting import Anchors

SLICE = 256
"""Items scored per slice after the first (the scorer publishes its work a slice at a time)."""


def read_input(input_path: str, task: Task, *, text_column: str, id_column: str | None, review_first: bool):
    """(the table, every row's text as the task composes it, the `id_column` values or None, the
    rows a `classify` output flagged `needs_review` as a bool array or None)."""
    from ..io import item_texts, read_table

    fields = task.fields if task.multi_field else ()
    frame = read_table(input_path, text_column, fields=fields)
    texts = item_texts(frame, text_column, fields, task.compose, name=input_path)
    if id_column is not None and id_column not in frame.columns:
        raise InputError(f"{input_path} has no column {id_column!r} (--id-column); its columns: "
                         f"{', '.join(map(str, frame.columns))}")
    ids = None if id_column is None else frame[id_column].astype(str).tolist()
    priority = None
    if review_first:
        if "needs_review" not in frame.columns:
            raise InputError(f"{input_path}: no needs_review column to review first; give the output of "
                             "`slmclassify classify`, or leave review_first off")
        priority = frame["needs_review"].astype(str).str.lower().isin(("true", "1")).to_numpy()
    return frame, texts, ids, priority


class Pool:
    """The sample and what is known of each of its items (see the module docstring). Its arrays
    are read and written with the session's lock held."""

    def __init__(self, texts_all: list[str], task: Task, *, sample: int, seed: int, taps: Taps,
                 width: int, ids: list[str] | None = None, priority: np.ndarray | None = None):
        self.task, self.multi, self.name, self.readout = task, task.multi_label, None, task.readout
        self.labels = self.columns(task)
        n_total = len(texts_all)
        rng = np.random.default_rng(seed)
        self.rows = np.sort(rng.permutation(n_total)[:sample]) if n_total > sample else np.arange(n_total)  # [n]
        self.index = {int(r): i for i, r in enumerate(self.rows)}  # input row → pool position
        self.texts = [texts_all[r] for r in self.rows]
        self.ids = None if ids is None else [ids[r] for r in self.rows]  # the --id-column value of each
        self.hashes = text_hashes(self.texts)
        self.sample_note = (f"working on a seeded sample of {len(self.rows):,} of the {n_total:,} rows (seed {seed})"
                            if n_total > sample else None)
        n = len(self.rows)
        self.taps = taps
        self.zero_shot = np.full((n, len(self.labels)), np.nan)  # [n, L]
        self.features = np.zeros((n, width), np.float32)  # [n, taps * hidden]
        self.scored = np.zeros(n, bool)  # [n]
        self.visited = np.zeros(n, bool)  # [n]
        self.head: object | None = None  # the loop head (`refit.LoopHead` or `refit.MultiLoopHead`)
        self.head_probs: np.ndarray | None = None  # [n, L]
        # the labels' descriptions read as items (`head.features.anchor_texts`), with their pool columns
        described = [(self.labels.index(f"{q.name}: {lab}"), text) for q in task.questions
                     for lab, text in anchor_texts(q.task).items()] or [
                         (self.labels.index(lab), text) for lab, text in anchor_texts(task).items()]
        self.anchor_columns = np.array([c for c, _ in described], dtype=np.int64)  # [A]
        self.anchor_texts = tuple(text for _, text in described)
        self.anchors = np.full((len(described), width), np.nan, np.float32)  # [A, taps * hidden]
        self.priority = priority[self.rows] if priority is not None else None  # [n] bool, or None
        self.shuffle = rng.permutation(n)  # [n] the seeded scoring order, before answered rows move up
        self.span = slice(0, len(self.labels))  # this view's columns of the pool's labels
        self.parts: list[Pool] = []
        spans = label_spans(task)
        # a task of labels is its own one view: no parts
        self.parts = [self._part(q, span) for q, span in spans[:len(task.questions)]]
        # what the picker reads of each question asked (`PoolView.questions`): (name, its columns,
        # its readout, its labels); a task of labels: its one unnamed question over every column
        self.spans = tuple((q.name, span, q.readout, q.labels) for q, span in spans)

    def _part(self, question, span: slice) -> Pool:
        """One question's view of the pool (see the module docstring)."""
        part = copy.copy(self)
        part.task, part.labels, part.name = question.task, question.labels, question.name
        part.multi, part.readout = question.multi_label, question.readout
        part.zero_shot = self.zero_shot[:, span]  # a view: the scorer's writes show through
        part.span = span
        part.spans = ((question.name, slice(0, len(question.labels)), question.readout, question.labels),)
        return part

    def anchor_rows(self) -> Anchors | None:
        """This view's labels' anchors: states [a, width] and label indices [a] (None until scored, or
        without descriptions; lock held). The views of a task's questions share the pool's array."""
        keep = (self.anchor_columns >= self.span.start) & (self.anchor_columns < self.span.start + len(self.labels))
        if not keep.any() or np.isnan(self.anchors[keep]).any():
            return None
        return Anchors(self.anchors[keep].astype(np.float64), self.anchor_columns[keep] - self.span.start)

    @staticmethod
    def columns(task: Task) -> tuple[str, ...]:
        """The names of the pool's label columns: the task's labels; a task of questions: every
        question's, as `question: label`."""
        return tuple(f"{q.name}: {lab}" for q in task.questions for lab in q.labels) or task.labels

    def __len__(self) -> int:
        return len(self.rows)

    def position(self, row) -> int:
        """The pool position of input row `row`; TaskError when it is not in the pool."""
        try:
            return self.index[int(row)]
        except (KeyError, TypeError, ValueError):
            raise TaskError(f"row {row!r} is not in this session's pool") from None

    def scored_among(self, positions) -> np.ndarray:
        """[m] int64: the scored ones of `positions` (a head needs their features)."""
        return np.array([p for p in positions if self.scored[p]], dtype=np.int64)

    def probs(self, pos: int) -> np.ndarray:
        """The one set of scores shown for an item: the head's once it exists, else zero-shot (a task
        of questions: each question's, side by side)."""
        if self.parts:
            return np.concatenate([part.probs(pos) for part in self.parts])
        return self.head_probs[pos] if self.head_probs is not None and self.scored[pos] else self.zero_shot[pos]

    def guess(self, pos: int) -> tuple[str | list[str] | None, float | None]:
        """(the guess, its confidence); multi-label: (the labels at or above their thresholds, the
        least sure decision); a task of questions: ({question: its guess}, the least sure answer's)."""
        if self.parts:
            guesses = [part.guess(pos) for part in self.parts]
            if any(label is None for label, _ in guesses):
                return None, None
            return {part.name: label for part, (label, _) in zip(self.parts, guesses)}, min(c for _, c in guesses)
        probs = self.probs(pos)
        if np.isnan(probs).any():
            return None, None
        from_head = self.head_probs is not None and self.scored[pos]  # as `probs` chose: the head's cut is 0.5
        cut = np.full(len(self.labels), 0.5) if from_head else np.asarray(self.task.label_thresholds)
        return self.readout.guess(self.labels, probs, cut)

    def picker_probs(self) -> np.ndarray | None:
        """[n, L] what the picker ranks by once there is a head (None before): the head's; in a task of
        questions each question's head's columns, or its zero-shot ones while it has no head yet."""
        if not self.parts:
            return self.head_probs
        if all(part.head_probs is None for part in self.parts):
            return None
        return np.concatenate([part.zero_shot if part.head_probs is None else part.head_probs
                               for part in self.parts], axis=1)

    def auto_share(self, threshold, answered) -> float | None:
        """The share of the scored, unanswered items every head is at least its `threshold` sure of
        (one per head: the task's own, or one per question)."""
        parts, thresholds = self.parts or [self], list(threshold)  # as the refitter's heads: a task of labels' own
        if any(part.head_probs is None for part in parts) or any(t is None for t in thresholds):
            return None
        open_ = self.scored.copy()
        open_[list(answered)] = False
        if not open_.any():
            return None
        sure = np.ones(int(open_.sum()), bool)
        for part, t in zip(parts, thresholds):
            probs = part.head_probs[open_]
            sure &= part.readout.confidence(probs) >= t
        return float(sure.mean())

    def probabilities(self, calibrated: np.ndarray) -> np.ndarray:
        """[m, L] calibrated scores → [m, L] probabilities: a softmax, each label's P(yes) in a
        multi-label task; a task of questions: each question's columns as its own."""
        return np.concatenate([readout.probabilities(calibrated[:, span]) for _, span, readout, _ in self.spans],
                              axis=1)

    def snippet(self, pos: int) -> dict:
        """An item as the page's lists show it: its row, id and text cut to 90 characters."""
        text = self.texts[pos]
        return {"row": int(self.rows[pos]), "id": None if self.ids is None else self.ids[pos],
                "text": text if len(text) <= 90 else text[:87] + "…"}

    def add_scores(self, part: np.ndarray, probs: np.ndarray, states: np.ndarray, ok: np.ndarray) -> None:
        """Publish a scored slice: pool positions `part` [m], their probabilities [m, L], hidden
        states [m, width] and which are not empty [m]; the current head scores them too."""
        self.zero_shot[part] = probs
        self.features[part[ok]] = states[ok]
        self.scored[part[ok]] = True
        self.visited[part] = True
        for view in self.parts or [self]:
            if view.head is not None:
                view.head_probs[part[ok]] = view.head.probabilities(self.features[part[ok]])

    def set_head(self, head, probs: np.ndarray) -> None:
        """Make `head` the loop head; `probs` [n, L] are its probabilities of the rows scored when it
        was fitted: the rows scored since are filled in here."""
        late = np.flatnonzero(self.scored & np.isnan(probs[:, 0]))
        probs[late] = head.probabilities(self.features[late])
        self.head, self.head_probs = head, probs


class Closing(Exception):
    """Raised inside the scorer's pass when the session closes, so it stops after one batch."""


class Scorer:
    """The background pass over the pool, first slice first.

    The first slice holds the answered rows (the head needs their features), then `first_slice`
    more: the rows to review first, then the seeded order. `published` is called with the lock
    held after each slice is in the pool."""

    def __init__(self, pool: Pool, clf, shared, *, answered, first_slice: int, published):
        self.pool, self.clf, self.shared, self.published = pool, clf, shared, published
        n = len(pool)
        first = np.zeros(n, bool)
        first[list(answered)] = True
        rank = np.where(first, 0, 2)  # [n] by pool position
        if pool.priority is not None:
            rank[~first & pool.priority] = 1
        order = pool.shuffle
        self.order = order[np.argsort(rank[order], kind="stable")]
        self.first_slice = first_slice + int(first.sum())  # the answered rows come on top of the first slice
        self.done = 0  # items of the slice being scored done so far (the terminal's progress)

    def progress(self) -> tuple[int, int]:
        """(items of the first slice scored so far, its size)."""
        return min(self.done, self.first_slice), min(self.first_slice, len(self.pool))

    def run(self) -> None:
        """Score the pool a slice at a time, publishing each slice under the lock (no lock while scoring)."""
        pool, order, start = self.pool, self.order, 0
        while start < len(order) and not self.shared.closing:
            size = self.first_slice if start == 0 else SLICE
            part = np.sort(order[start:start + size])
            anchors = pool.anchor_texts if start == 0 else ()  # read with the first slice, in its pass
            try:
                window = self.clf.score_items([*(pool.texts[p] for p in part), *anchors],
                                              progress=self._stop_if_closing, taps=pool.taps)
            except Closing:
                return
            scores, states = window.scores[:len(part)], window.states[:len(part)]
            calibrated = self.clf.calibration.calibrated(scores)  # NaN rows for empty items
            probs = pool.probabilities(calibrated)
            ok = ~np.isnan(scores).any(axis=1)
            with self.shared.lock:
                if anchors:
                    pool.anchors[:] = window.states[len(part):]  # in place: the questions' views share it
                pool.add_scores(part, probs, states, ok)
                self.published()
            start += size
        self.shared.ready.set()

    def _stop_if_closing(self, done: int) -> None:
        self.done = done
        # a slice takes a minute on a busy 2-core machine; a thread still in torch when the
        # interpreter exits aborts the process ("terminate called without an active exception")
        if self.shared.closing:
            raise Closing
