"""A labelling session: the loaded model, a seeded sample of the input, a background scorer and a
background refitter around a `LabelStore`, and the `Picker` that chooses the next item.

    start ──► scorer thread: the sample, a slice at a time (first slice first), through one
              fast-path pass that gives the zero-shot scores AND the head's hidden states
          ──► refit thread: as answers arrive, the loop's head (`refit.py`), its cross-validated
              accuracy and the share of the pool it could label at the target accuracy

Rows are the input's row numbers (0-based, as read); the pool is the sample's rows, in a seeded
order. Invariants: every public method is thread-safe and returns without waiting for a fit or
for the scorer (`start` returns once the model is loaded; `ready()` says when the first slice is
scored and an item can be shown); an answer is durable (in the store) before the call returns;
the current item is never a labelled or skipped row, except the row an undo brings back; a store
started for another input, task, model, sample or seed is refused, naming what differs, and a row
whose text changed since it was answered is refused too. A failure in a background thread is
raised by the next `ready()` or `state()` call.

A multi-label task (`multi_label = true`) is labelled with label sets: an answer is a list of the
task's labels (maybe empty: none applies), kept in the store as a JSON list; the guess is the set at
or above the thresholds (the task's for zero-shot, 0.5 for the loop's one-vs-rest heads), the next
item comes from per-label uncertainty, and the estimate is of exact label sets (`refit.estimate_multi`).

Beyond the page's calls: `start(..., target_accuracy=None, random_share=0.3)`; `wait_ready(timeout)`;
`state()` has `ready`, `labels`, `done` (no item left and everything scored; `item` is None when
nothing is left), `auto_threshold`, `fair_answers` / `fair_needed` (random picks so far and the
number an estimate needs), each item's `version` (what an answer names, see `LabelStore`), and its
`accuracy` is None until `refit.enough` random picks allow an honest one; `accept` returns the
label it gave, `export` the number of rows written; `Picker.pick` returns None when nothing is left
and its `Pick` has a `kind`; `LabelStore.answer(..., kind="")` records that kind.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np

from ..classifier import Classifier, EngineSettings
from ..core import multilabel
from ..core.results import softmax
from ..core.task import Task
from ..errors import InputError, SlmClassifyError, TaskError
from ..head.apply import text_hashes
from ..head.features import default_taps
from ..head.model import Head, model_fingerprint, task_hash, task_record
from ..io.hashing import file_sha256
from ..models.loading import LoadedModel, load_model
from . import refit
from .store import LabelStore
from .strategy import Picker, PoolView, describe, label_counts

SLICE = 256
"""Items scored per slice after the first (the scorer publishes its work a slice at a time)."""


class _Closing(Exception):
    """Raised inside the scorer's pass when the session closes, so it stops after one batch."""


DEFAULT_TARGET_ACCURACY = 0.9
"""The accuracy the automatic share is shown at unless the caller names another: a share at the
task's `min_confidence` alone would be shown next to a head that may still be far less accurate."""

HISTORY = 12
"""Answers and skips the page lists, newest first."""
ENOUGH_PER_LABEL = 50
"""Answers per label after which the page says that labelling more pays little."""


class LabelSession:
    """One person labelling one input for one task; see the module docstring."""

    @classmethod
    def start(cls, input_path: str, task: Task, *, model=None, settings: EngineSettings | None = None,
              store_path: str | Path, sample: int = 20000, seed: int = 0, first_slice: int = 300,
              text_column: str = "text", review_first: bool = False,
              target_accuracy: float | None = DEFAULT_TARGET_ACCURACY,
              random_share: float = 0.3, id_column: str | None = None) -> LabelSession:
        """Load the model and the input, open the store, start the scorer and the refitter.

        `target_accuracy`: the accuracy the auto-labelled share must reach (threshold from the
        cross-validated predictions; no share while no threshold reaches it); None: the task's
        `min_confidence` is the threshold, whatever accuracy that gives.
        `review_first`: offer first the rows a `classify` output flagged `needs_review`."""
        try:
            import sklearn  # noqa: F401
        except ImportError:
            raise InputError("labelling fits a head, which needs scikit-learn: pip install 'slmclassify[head]'") from None
        if sample < 1 or first_slice < 1:
            raise TaskError(f"sample and first_slice must be positive, got {sample} and {first_slice}")
        from ..io import item_texts, read_table

        fields = task.fields if task.multi_field else ()
        frame = read_table(input_path, text_column, fields=fields)
        texts_all = item_texts(frame, text_column, fields, task.compose, name=input_path)
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
        settings = settings or EngineSettings()
        loaded = model if isinstance(model, LoadedModel) else load_model(model, settings.device, settings.precision)
        clf = Classifier(task, model=loaded, settings=settings, precision_sample=texts_all[:1000])
        fingerprint = {"input": {"rows": len(frame), "sha256": file_sha256(input_path)[:16], "text_column": text_column},
                       "task": task_hash(task), "labels": list(task.labels), "model": model_fingerprint(loaded),
                       "sample": sample, "seed": seed}
        store = LabelStore.open(store_path, fingerprint)
        try:
            return cls(input_path, frame, texts_all, clf, store, sample=sample, seed=seed, first_slice=first_slice,
                       priority=priority, target_accuracy=target_accuracy, random_share=random_share, ids=ids)
        except BaseException:
            store.close()
            raise

    def __init__(self, input_path, frame, texts_all, clf: Classifier, store: LabelStore, *, sample, seed,
                 first_slice, priority, target_accuracy, random_share, ids=None):
        self.input_path, self.frame, self.clf, self.store = input_path, frame, clf, store
        self.task = clf.task
        self.labels = self.task.labels
        self.multi = self.task.multi_label
        self.seed, self.target_accuracy = seed, target_accuracy
        n_total = len(texts_all)
        rng = np.random.default_rng(seed)
        self.rows = np.sort(rng.permutation(n_total)[:sample]) if n_total > sample else np.arange(n_total)  # [n]
        self.index = {int(r): i for i, r in enumerate(self.rows)}  # input row → pool position
        self.texts = [texts_all[r] for r in self.rows]
        self.ids = None if ids is None else [ids[r] for r in self.rows]  # the --id-column value of each
        self.hashes = text_hashes(self.texts)
        self.sample_note = (f"working on a seeded sample of {len(self.rows):,} of the {n_total:,} rows (seed {seed})"
                            if n_total > sample else None)
        n, L = len(self.rows), len(self.labels)
        self.taps = default_taps(clf.loaded.model.config.num_hidden_layers)
        width = len(self.taps) * clf.loaded.model.config.hidden_size
        self.zero_shot = np.full((n, L), np.nan)  # [n, L]
        self.features = np.zeros((n, width), np.float32)  # [n, taps * hidden]
        self.scored = np.zeros(n, bool)  # [n] scored and not empty
        self.visited = np.zeros(n, bool)  # [n] scored, empty or not
        self.head_probs: np.ndarray | None = None  # [n, L]
        self.head: refit.LoopHead | refit.MultiLoopHead | None = None
        self.priority = priority[self.rows] if priority is not None else None
        self.picker = Picker(L, seed, random_share=random_share)

        stored_hashes = store.hashes()
        for row, h in stored_hashes.items():
            if row not in self.index or self.hashes[self.index[row]] != h:
                raise TaskError(f"row {row} of {input_path} is not the text that was answered in {store.path}; "
                                "use the input the store was started with, or another store")
        for row, (label, _, _) in store.latest().items():
            if label is not None and self._decode(label) is None:
                raise TaskError(f"{store.path} holds label {label!r} for row {row}, which is not in the task's "
                                f"labels {list(self.labels)}")
        self._reload()

        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._ready = threading.Event()
        self._closing = False
        self._version = 0  # bumped by every change of the answers
        self._fitting = False
        self._estimate: refit.Estimate | None = None
        self._threshold: float | None = None
        self._error: BaseException | None = None
        self._current: tuple[int, str, str] | None = None  # (pool position, reason, kind)
        # answered rows first (the head needs their features), then review rows, then a seeded order
        order = rng.permutation(n)
        first = np.zeros(n, bool)
        first[list(self.answers)] = True
        rank = np.where(first, 0, 2)  # [n] by pool position
        if self.priority is not None:
            rank[~first & self.priority] = 1
        self._order = order[np.argsort(rank[order], kind="stable")]
        self._first_slice = first_slice + int(first.sum())  # the answered rows come on top of the first slice
        self._slice_done = 0  # items of the slice being scored done so far (the terminal's progress)
        self._scorer = threading.Thread(target=self._guard(self._score_loop), name="label-scorer", daemon=True)
        self._refitter = threading.Thread(target=self._guard(self._refit_loop), name="label-refit", daemon=True)
        self._scorer.start()
        self._refitter.start()

    # ----- the page's calls

    def ready(self) -> bool:
        """Whether the first slice is scored (an item can be shown); raises a background failure."""
        self._raise()
        return self._ready.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until `ready()` (for scripts and tests; the page polls `ready`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready.wait(0.05):
            self._raise()
            if deadline is not None and time.monotonic() >= deadline:
                return False
        self._raise()
        return True

    def state(self) -> dict:
        """Everything the page shows, JSON-able."""
        self._raise()
        with self._lock:
            counts = label_counts(self.answers, len(self.labels))
            item = None
            if self._current is not None:
                pos, detail, kind = self._current
                label, confidence = self._guess(pos)
                probs = self._probs(pos)
                reason = describe(kind, detail, probs, self.labels, counts, self.multi)  # from the guess shown
                item = {"row": int(self.rows[pos]), "id": None if self.ids is None else self.ids[pos],
                        "text": self.texts[pos], "guess": label,
                        "confidence": confidence, "reason": reason,
                        "version": self._versions.get(pos, 0)}
                if self.multi:  # each label's P(yes), shown on its button
                    item["probabilities"] = (None if np.isnan(probs).any()
                                             else {lab: float(p) for lab, p in zip(self.labels, probs)})
            est = self._estimate
            return {
                "ready": self._ready.is_set(), "item": item, "labels": list(self.labels), "multi_label": self.multi,
                "counts": {lab: int(c) for lab, c in zip(self.labels, counts)},
                "labelled": len(self.answers), "skipped": len(self.skips), "pool": len(self.rows),
                "scored": int(self.visited.sum()), "sample_note": self.sample_note,
                "accuracy": est.as_dict() if est is not None else None,
                "fair_answers": sum(1 for p in self.answers if self.kinds.get(p, "") in refit.REPRESENTATIVE),
                "fair_needed": refit.MIN_FAIR,
                "auto_share": self._auto_share(), "auto_threshold": self._threshold,
                "target_accuracy": self.target_accuracy,
                "fitting": self._fitting, "done": self._current is None and bool(self.visited.all()),
                "history": self._history(), "skipped_rows": self._skipped_rows(), "advice": self._advice(counts),
            }

    # The store is the single source of truth: each change is written there and the answers, kinds
    # and skips read back from it under the session's lock, so that the page's counts, the refits,
    # Export and Fit see exactly what the store holds, whatever the clients do at once.

    def answer(self, row: int, label: str | list[str], version: int | None = None) -> None:
        """Record `label` for input row `row` (durable on return) and move on if it was the current item;
        in a multi-label task `label` is the list of labels that apply (maybe empty).
        `version`: the row's version the page showed (`state()["item"]["version"]`); `StaleAnswer`
        when the row was answered, skipped or undone since."""
        pos = self._position(row)
        stored = self._encode(label)
        with self._lock:
            kind = self._current[2] if self._current is not None and self._current[0] == pos else "chosen"
            self.store.answer(int(row), self.hashes[pos], stored, kind, version)
            self._reload()
            self._moved(pos)

    def show(self, row: int) -> None:
        """Make `row` the current item (from the history or the skipped list): answering it then
        changes its answer, or gives one to a skipped row."""
        pos = self._position(row)
        with self._lock:
            kind = self.kinds.get(pos) or "chosen"  # a random pick answered again still counts as one
            self._current = (pos, "chosen from the history", kind)
            self._version += 1
            self._changed.notify_all()

    def first_slice_progress(self) -> tuple[int, int]:
        """(items of the first slice scored so far, its size)."""
        return min(self._slice_done, self._first_slice), min(self._first_slice, len(self.rows))

    def accept(self, row: int) -> str | list[str]:
        """Answer `row` with the current guess; returns that label (multi-label: that list of labels)."""
        pos = self._position(row)
        with self._lock:
            label, _ = self._guess(pos)
        if label is None:
            raise TaskError(f"row {row} is not scored yet, so there is no guess to accept")
        self.answer(row, label)
        return label

    def skip(self, row: int, version: int | None = None) -> None:
        """Skip `row` (not offered again; durable on return); `version` as for `answer`."""
        pos = self._position(row)
        with self._lock:
            self.store.skip(int(row), self.hashes[pos], version)
            self._reload()
            self._moved(pos)

    def undo(self) -> int | None:
        """Take back the latest answer or skip; that row becomes the current item. Its row, or None."""
        with self._lock:
            row = self.store.undo()
            if row is None:
                return None
            pos = self.index[row]
            kind = self.kinds.get(pos) or "undo"  # a random pick answered again still counts as one
            self._reload()
            self._current = (pos, "brought back by undo", kind)
            self._version += 1
            self._changed.notify_all()
            return row

    def _reload(self) -> None:
        """The answers, kinds, skips, versions and history as the store holds them (lock held, or in
        `__init__`): two queries per change, none per poll of the page."""
        latest = {self.index[row]: event for row, event in self.store.latest().items()}  # pos → (label, kind, seq)
        # pos → label index, or (multi-label) tuple of label indices
        self.answers: dict[int, int | tuple[int, ...]] = {p: self._decode(lab) for p, (lab, _, _) in latest.items()
                                                          if lab is not None}
        # pool position → why it was offered (`Pick.kind`), for the estimate
        self.kinds: dict[int, str] = {p: kind for p, (lab, kind, _) in latest.items() if lab is not None}
        self.skips: set[int] = {p for p, (lab, _, _) in latest.items() if lab is None}
        self._recent = sorted(latest, key=lambda p: latest[p][2], reverse=True)[:HISTORY]  # newest first
        self._versions = {self.index[row]: v for row, v in self.store.versions().items()}  # pos → version

    def export(self, path: str) -> int:
        """Write the input rows that have an answer, in input order, with a `gold` column (replacing
        one the input has); returns the number of rows written."""
        from ..io.writers import write_table

        with self._lock:
            rows = sorted(int(self.rows[pos]) for pos in self.answers)
            gold = {int(self.rows[pos]): self._gold(value) for pos, value in self.answers.items()}
        out = self.frame.iloc[rows].copy()
        out["gold"] = [gold[r] for r in rows]
        write_table(out.reset_index(drop=True), str(path))
        return len(rows)

    def fit(self, path: str) -> Head:
        """Fit a head on the answers so far (C by cross-validation when every label has 2 or more)
        and save it where `classify --head` reads it."""
        from ..head.fitting import fit

        if self.multi:
            return self._fit_multi(path)
        with self._lock:
            pos = np.array([p for p in self.answers if self.scored[p]], dtype=np.int64)
            y = np.array([self.labels[self.answers[p]] for p in pos])
            X = self.features[pos].astype(np.float64)
            est = self._estimate
        counts = {lab: int((y == lab).sum()) for lab in sorted(set(y.tolist()))}
        if len(counts) < 2:
            raise TaskError(f"a head needs answers for at least two labels; so far: {counts or 'none'}")
        folds = min(5, min(counts.values()))
        final = fit(X, y, seed=self.seed, folds=folds)
        info = {"C": final.C, "items": int(len(y)), "per_label": counts, "folds": folds, "source": str(self.input_path),
                "labelled_by": "slmclassify label", "cv": ({"accuracy": est.mean, "low": est.low, "high": est.high}
                                                            if est is not None else None),
                "item_hashes": [self.hashes[p] for p in pos]}
        head = Head(labels=final.labels, taps=tuple(self.taps), use_scores=False, mean=final.mean, scale=final.scale,
                    coef=final.coef, intercept=final.intercept, model=self.store.fingerprint["model"],
                    task=task_record(self.task), info=info)
        head.save(path)
        return head

    def _fit_multi(self, path: str) -> Head:
        """`fit` for a multi-label task: one-vs-rest heads (`head/one_vs_rest.py`), thresholds 0.5."""
        from ..head.one_vs_rest import fit_one_vs_rest

        with self._lock:
            pos = np.array([p for p in self.answers if self.scored[p]], dtype=np.int64)
            Y = self._answer_matrix(pos)
            X = self.features[pos].astype(np.float64)
            est = self._estimate
        for j, label in enumerate(self.labels):
            yes = int(Y[:, j].sum())
            if min(yes, len(Y) - yes) < refit.MIN_PER_LABEL:
                raise TaskError(f"a head needs at least {refit.MIN_PER_LABEL} answers with and {refit.MIN_PER_LABEL} "
                                f"without each label; {label} is in {yes} of the {len(Y)} answers so far")
        folds = min(5, int(np.minimum(Y.sum(0), len(Y) - Y.sum(0)).min()))
        final = fit_one_vs_rest(X, Y, self.labels, seed=self.seed, folds=folds)
        info = {"C": list(final.C), "items": int(len(Y)), "per_label": dict(zip(self.labels, map(int, Y.sum(0)))),
                "folds": folds, "source": str(self.input_path), "labelled_by": "slmclassify label",
                "cv": ({"subset_accuracy": est.mean, "low": est.low, "high": est.high} if est is not None else None),
                "thresholds": "0.5 (the loop's)", "item_hashes": [self.hashes[p] for p in pos]}
        head = Head(labels=self.labels, taps=tuple(self.taps), use_scores=False, mean=final.mean, scale=final.scale,
                    coef=final.coef, intercept=final.intercept, model=self.store.fingerprint["model"],
                    task=task_record(self.task), info=info, multi_label=True, thresholds=(0.5,) * len(self.labels))
        head.save(path)
        return head

    def close(self) -> None:
        """Stop the threads and close the store (answers are already on disk)."""
        with self._lock:
            self._closing = True
            self._changed.notify_all()
        for thread in (self._scorer, self._refitter):
            if thread is not threading.current_thread():
                thread.join()  # the scorer stops after its current batch, the refitter after its fit
        self.store.close()

    # ----- internals (called with the lock held unless said otherwise)

    def _position(self, row: int) -> int:
        try:
            return self.index[int(row)]
        except (KeyError, TypeError, ValueError):
            raise TaskError(f"row {row!r} is not in this session's pool") from None

    def _probs(self, pos: int) -> np.ndarray:
        """The one set of scores shown for an item: the head's once it exists, else zero-shot."""
        return self.head_probs[pos] if self.head_probs is not None and self.scored[pos] else self.zero_shot[pos]

    def _guess(self, pos: int) -> tuple[str | list[str] | None, float | None]:
        """(the guess, its confidence); multi-label: (the labels at or above their thresholds, the
        least sure decision)."""
        probs = self._probs(pos)
        if np.isnan(probs).any():
            return None, None
        if self.multi:
            from_head = self.head_probs is not None and self.scored[pos]  # as `_probs` chose
            cut = np.full(len(self.labels), 0.5) if from_head else np.asarray(self.task.label_thresholds)
            chosen = [lab for lab, p, t in zip(self.labels, probs, cut) if p >= t]
            return chosen, float(multilabel.confidence(probs[None, :])[0])
        top = int(probs.argmax())
        return self.labels[top], float(probs[top])

    def _moved(self, pos: int) -> None:
        self._version += 1
        self._changed.notify_all()
        if self._current is None or self._current[0] == pos:
            self._next()

    def _next(self) -> None:
        if not self.scored.any():
            self._current = None
            return
        pool = PoolView(zero_shot=self.zero_shot, features=self.features, scored=self.scored, head=self.head_probs,
                        labels=self.labels, priority=self.priority, multi_label=self.multi)
        pick = self.picker.pick(pool, self.answers, self.skips)
        self._current = None if pick is None else (pick.row, pick.detail or pick.reason, pick.kind)

    def _snippet(self, pos: int) -> dict:
        text = self.texts[pos]
        return {"row": int(self.rows[pos]), "id": None if self.ids is None else self.ids[pos],
                "text": text if len(text) <= 90 else text[:87] + "…"}

    def _history(self) -> list[dict]:
        """The latest answers and skips, newest first (lock held)."""
        return [{**self._snippet(p), "label": self._shown(self.answers[p]) if p in self.answers else None}
                for p in self._recent]

    # how an answer is stored, shown and exported (label index, or a multi-label task's tuple of them)

    def _encode(self, label) -> str:
        """The store's text of an answer given by a caller (validated)."""
        if not self.multi:
            if not isinstance(label, str) or label not in self.labels:
                raise TaskError(f"label {label!r} is not one of the task's labels {list(self.labels)}")
            return label
        if isinstance(label, str) or not all(isinstance(name, str) for name in label):
            raise TaskError(f"a multi-label task's answer is a list of its labels {list(self.labels)}, got {label!r}")
        unknown = [name for name in label if name not in self.labels]
        if unknown:
            raise TaskError(f"label {unknown[0]!r} is not one of the task's labels {list(self.labels)}")
        return json.dumps([name for name in self.labels if name in label])

    def _decode(self, text: str):
        """The answer a store text holds (None: not one of this task's)."""
        if not self.multi:
            return self.labels.index(text) if text in self.labels else None
        try:
            names = json.loads(text)
        except ValueError:
            return None
        if not isinstance(names, list) or not all(name in self.labels for name in names):
            return None
        return tuple(sorted({self.labels.index(name) for name in names}))

    def _shown(self, value) -> str:
        """An answer as the page's history lists it."""
        if not self.multi:
            return self.labels[value]
        return ", ".join(self.labels[i] for i in value) or "none of them"

    def _gold(self, value) -> str:
        """An answer in an exported gold column (multi-label: joined by the task's separator)."""
        return self.labels[value] if not self.multi else self.task.label_separator.join(self.labels[i] for i in value)

    def _answer_matrix(self, pos: np.ndarray) -> np.ndarray:
        """[m, L] bool label sets of the answers at pool positions `pos` (multi-label)."""
        Y = np.zeros((len(pos), len(self.labels)), bool)
        for k, p in enumerate(pos):
            Y[k, list(self.answers[int(p)])] = True
        return Y

    def _skipped_rows(self, n: int = 50) -> list[dict]:
        return [self._snippet(pos) for pos in sorted(self.skips)[:n]]

    def _advice(self, counts: np.ndarray) -> str | None:
        """When labelling more stops paying: the honest estimate's interval is narrow, or every label
        has `ENOUGH_PER_LABEL` answers (a head gains little per answer after that)."""
        est = self._estimate
        if est is not None and est.high - est.low <= 0.1:
            return (f"the estimate is within ±{(est.high - est.low) / 2:.0%}: more answers now change it little; "
                    "Fit the head, or label on where it is unsure")
        if len(counts) and counts.min() >= ENOUGH_PER_LABEL:
            return f"every label has {ENOUGH_PER_LABEL} answers or more: a head gains little from each answer now"
        return None

    def _auto_share(self) -> float | None:
        if self.head_probs is None or self._threshold is None:
            return None
        open_ = self.scored.copy()
        open_[list(self.answers)] = False
        if not open_.any():
            return None
        probs = self.head_probs[open_]
        confidence = multilabel.confidence(probs) if self.multi else probs.max(axis=1)
        return float((confidence >= self._threshold).mean())

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _guard(self, loop):
        def run():
            try:
                loop()
            except BaseException as exc:  # shown to the page's next call, not lost in a thread
                self._error = exc if isinstance(exc, SlmClassifyError) else InputError(
                    f"labelling stopped: {type(exc).__name__}: {exc}")
                self._ready.set()
        return run

    def _score_loop(self) -> None:
        """Score the pool a slice at a time, publishing each slice under the lock (no lock while scoring)."""
        order, start = self._order, 0
        while start < len(order) and not self._closing:
            size = self._first_slice if start == 0 else SLICE
            part = np.sort(order[start:start + size])
            try:
                window = self.clf.score_window([self.texts[p] for p in part], progress=self._stop_if_closing,
                                               taps=self.taps)
            except _Closing:
                return
            calibrated = self.clf.calibrated(window.scores)  # NaN rows for empty items
            probs = multilabel.probabilities(calibrated) if self.multi else softmax(calibrated)
            ok = ~np.isnan(window.scores).any(axis=1)
            with self._lock:
                self.zero_shot[part] = probs
                self.features[part[ok]] = window.states[ok]
                self.scored[part[ok]] = True
                self.visited[part] = True
                self.picker.clusters.update(self.features, self.scored)
                if self.head is not None:
                    self.head_probs[part[ok]] = self.head.probabilities(self.features[part[ok]])
                if self._current is None:
                    self._next()
                self._version += 1
                self._changed.notify_all()
                if self._current is not None or self.visited.all():  # something to show, or nothing ever
                    self._ready.set()
            start += size
        self._ready.set()

    def _stop_if_closing(self, done: int) -> None:
        self._slice_done = done
        # a slice takes a minute on a busy 2-core machine; a thread still in torch when the
        # interpreter exits aborts the process ("terminate called without an active exception")
        if self._closing:
            raise _Closing

    def _refit_loop(self) -> None:
        """Refit whenever the answers changed since the last fit; publish head, estimate, threshold."""
        fitted_version = -1
        while True:
            with self._lock:
                while not self._closing and self._version == fitted_version:
                    self._changed.wait()
                if self._closing:
                    return
                fitted_version = self._version
                pos = np.array([p for p in self.answers if self.scored[p]], dtype=np.int64)
                fair = np.array([self.kinds.get(p, "") in refit.REPRESENTATIVE for p in pos], dtype=bool)
                if self.multi:
                    y = self._answer_matrix(pos)
                    if not refit.can_fit_multi(y):
                        continue
                else:
                    y = np.array([self.answers[p] for p in pos], dtype=np.int64)
                    if not refit.can_fit(y, len(self.labels)):
                        continue
                X = self.features[pos].copy()
                self._fitting = True
            try:
                if self.multi:
                    head = refit.fit_multi_head(X, y, self.seed)
                    est = refit.estimate_multi(X, y, self.seed, fair)
                else:
                    head = refit.fit_head(X, y, len(self.labels), self.seed)
                    est = refit.estimate(X, y, len(self.labels), self.seed, fair)
                threshold = refit.auto_threshold(est, self.target_accuracy)
                with self._lock:
                    scored = np.flatnonzero(self.scored)
                    feats = self.features[scored]
                probs = np.full((len(self.rows), len(self.labels)), np.nan)
                probs[scored] = head.probabilities(feats)
            finally:
                with self._lock:
                    self._fitting = False
            with self._lock:
                late = np.flatnonzero(self.scored & np.isnan(probs[:, 0]))  # scored while this fit ran
                probs[late] = head.probabilities(self.features[late])
                # the item on screen stays: the new head ranks the next pick
                self.head, self.head_probs, self._estimate, self._threshold = head, probs, est, threshold
