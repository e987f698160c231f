"""A labelling session: one person, or a team (`team.py`), labels one input for one task, one item at
a time, while a head learns from the answers and says how much of the rest it could label.
`LabelSession` loads the model and the input, opens the store, and coordinates the parts that do
the work:

    pool      the seeded sample of the input, its scores and hidden states, and the scorer thread
    answers   the answers, kinds, skips and history as the `LabelStore` holds them
    strategy  the `Picker`: which item to show next, and why
    refitter  the refit thread: the loop's head, its cross-validated accuracy and auto-label share
    outputs   the export of the answered rows and the head fitted on them

    start ──► scorer thread: the sample, a slice at a time (first slice first), through one
              fast-path pass that gives the zero-shot scores AND the head's hidden states
          ──► refit thread: as answers arrive, the loop's head (`refit.py`), its cross-validated
              accuracy and the share of the pool it could label at the target accuracy

Invariants: every public method is thread-safe and returns without waiting for a fit or for the
scorer (`start` returns once the model is loaded; `ready()` says when the first slice is scored
and an item can be shown); an answer is durable (in the store) before the call returns; the
current item is never a labelled or skipped row, except the row an undo brings back; a store
started for another input, task, model, sample or seed is refused, naming what differs, and a row
whose text changed since it was answered is refused too. A failure in a background thread is
raised by the next `ready()` or `state()` call.

A multi-label task (`multi_label = true`) is labelled with label sets: an answer is a list of the
task's labels (maybe empty: none applies), kept in the store as a JSON list; the guess is the set at
or above the thresholds (the task's for zero-shot, 0.5 for the loop's one-vs-rest heads), the next
item comes from per-label uncertainty, and the estimate is of exact label sets (`refit.estimate_multi`).

A task of questions (`[[questions]]`) is labelled an item at a time with every question answered at
once: an answer is {question: label, or list of labels for a multi-label question}, kept in the
store as one JSON object. The one pass per slice gives every question's zero-shot scores and the
hidden states, and the refitter fits a head per question on them (`Pool.parts`); each question's
guess is its head's once it has one, else zero-shot; the next item is the one whose least sure
question is least sure (`strategy.py`). `state()["questions"]` has each question's counts,
estimate and automatic share; the top-level `accuracy` is the least of the questions' estimates and
`auto_share` the share of items every question's head is sure enough of. Export writes a
`gold_NAME` column per question; `fit` refuses (`slmclassify fit` fits a head per question).

A team: every call names who makes it (`who`, the member the page's token is; "" without a team).
Each person has their own current item, history, skipped rows and undo; an item of the overlap share
is handed to further annotators before any new item (never to more at once than it needs, never
with another's answer shown), a reviewer is handed the disputed items with every annotator's answer,
and what the head, the counts and the exports learn from is each item's consensus (`Answers.given`).

The page (`app.py`) polls `ready()` and `state()` and sends `answer`, `accept`, `skip`, `show`,
`undo`, `export` and `fit`; scripts and tests use `wait_ready(timeout)` instead of polling, and
`close()` when done. `state()` has each item's `version` (what an answer names, see `LabelStore`),
`done` (no item left and everything scored), `fair_answers` / `fair_needed` (random picks so far and
the number an honest estimate needs) and `accuracy`, None until `refit.enough` random picks allow one.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import numpy as np

from ..classifier import Classifier, EngineSettings
from ..core.metrics import check_target_accuracy
from ..core.task import Task
from ..errors import FieldError, InputError, TaskError
from ..head.features import loop_taps
from ..head.model import Head, model_fingerprint, task_hash
from ..io.hashing import file_sha256
from ..models.prepare import load_model
from . import outputs, refit, view
from .answers import Answers
from .pool import Pool, Scorer, read_input
from .refitter import Refitter
from .store import LabelStore
from .strategy import Pick, Picker, PoolView, label_counts
from .sync import Sync
from .team import Team, TeamSpec

DEFAULT_TARGET_ACCURACY = 0.9
"""The accuracy the automatic share is shown at unless the caller names another: a share at the
task's `min_confidence` alone would be shown next to a head that may still be far less accurate."""


@dataclasses.dataclass(frozen=True)
class LabelRequest:
    """Which input to label, where the answers are kept, and how the session samples, picks and
    estimates (everything but the task, settings, model)."""

    input_path: str
    """The table to label (CSV, JSONL, Parquet)."""
    store_path: str | Path
    """The SQLite file of the answers; starting again with it continues where it stopped."""
    sample: int = 20000
    """Work on a seeded sample of this many rows."""
    seed: int = 0
    first_slice: int = 300
    """Items scored before the first is shown (the rest are scored behind it)."""
    text_column: str = "text"
    id_column: str | None = None
    """A column of row ids, shown next to each item."""
    review_first: bool = False
    """The input is a `classify` output: offer its needs_review rows first."""
    target_accuracy: float | None = DEFAULT_TARGET_ACCURACY
    """The accuracy the auto-labelled share must reach (threshold from the cross-validated
    predictions; no share while none reaches it); None: the task's `min_confidence` is the
    threshold, whatever accuracy that gives."""
    random_share: float = 0.3
    """The share of picks made at random (`Picker`)."""
    team: TeamSpec = TeamSpec()
    """Who labels (no annotators: one person; a store started with a team keeps it)."""
    guidelines: str = ""
    """Longer guidelines the page shows beside each item (the task's label descriptions always are)."""

    def __post_init__(self) -> None:
        if self.sample < 1:
            raise FieldError("sample", "{field} must be a positive number of rows, got {value}", value=self.sample)
        if self.first_slice < 1:
            raise FieldError("first_slice", "{field} must be positive, got {value}", value=self.first_slice)
        check_target_accuracy(self.target_accuracy)


class LabelSession:
    """One person labelling one input for one task; see the module docstring. Made by `start`."""

    @classmethod
    def start(cls, request: LabelRequest, task: Task, settings: EngineSettings | None = None, *,
              model=None) -> LabelSession:
        """Load the model and the input, open the store, start the scorer and the refitter."""
        try:
            import sklearn  # noqa: F401
        except ImportError:
            raise InputError("labelling fits a head, which needs scikit-learn: pip install 'slmclassify[head]'") from None
        input_path, sample, seed = request.input_path, request.sample, request.seed
        frame, texts_all, ids, priority = read_input(input_path, task, text_column=request.text_column,
                                                     id_column=request.id_column, review_first=request.review_first)
        settings = settings or EngineSettings()
        loaded = load_model(model, settings.device, settings.precision, task=task, sample=texts_all[:1000],
                            settings=settings)
        clf = Classifier(task, model=loaded, settings=settings)
        fingerprint = {"input": {"rows": len(frame), "sha256": file_sha256(input_path)[:16],
                                 "text_column": request.text_column},
                       "task": task_hash(task), "labels": list(Pool.columns(task)),
                       "model": model_fingerprint(loaded),
                       "sample": sample, "seed": seed}
        store = LabelStore.open(request.store_path, fingerprint)
        try:
            team = _team(store, request.team)
            session = cls(input_path, frame, texts_all, clf, store, sample=sample, seed=seed, priority=priority,
                          target_accuracy=request.target_accuracy, random_share=request.random_share, ids=ids,
                          team=team, guidelines=request.guidelines)
            session._start_threads(request.first_slice)
        except BaseException:
            store.close()
            raise
        return session

    def __init__(self, input_path, frame, texts_all, clf: Classifier, store: LabelStore, *, sample, seed,
                 priority, target_accuracy, random_share, ids=None, team: Team | None = None, guidelines: str = ""):
        """The parts, checked against the store; no thread runs until `start` starts them."""
        self.input_path, self.frame, self.clf, self.store = input_path, frame, clf, store
        self.team, self.guidelines = team, guidelines
        self.task, self.labels, self.multi = clf.task, clf.task.labels, clf.task.multi_label
        self.seed, self.target_accuracy = seed, target_accuracy
        config = clf.loaded.model.config
        taps = loop_taps(config.num_hidden_layers)
        self.pool = Pool(texts_all, self.task, sample=sample, seed=seed, taps=taps,
                         width=len(taps) * config.hidden_size, ids=ids, priority=priority)
        self.answers = Answers(store, self.task, self.pool.index, self.pool.hashes, input_path, team)
        self.columns = self.pool.labels  # the labels; a task of questions: `question: label` of every question
        self.picker = Picker(len(self.columns), seed, random_share=random_share)
        self._sync = Sync()
        self.refitter = Refitter(self.pool, self.answers, self._sync, seed=seed, target_accuracy=target_accuracy)
        self._current: dict[str, tuple[int, str, str] | None] = {}  # who → (pool position, reason, kind)
        self._agreed: tuple | None = None  # (the answers it was computed on, the agreement report)

    def _start_threads(self, first_slice: int) -> None:
        """Start the scorer (answered rows first, then `first_slice` more) and the refitter."""
        self.scorer = Scorer(self.pool, self.clf, self._sync, answered=self.answers.touched(), first_slice=first_slice,
                             published=self._scored)
        self._threads = (self._sync.thread(self.scorer.run, "label-scorer"),
                         self._sync.thread(self.refitter.run, "label-refit"))
        for thread in self._threads:
            thread.start()

    @property
    def head(self):
        """The loop's latest head (None before its first fit)."""
        return self.pool.head

    # ----- the page's calls

    def ready(self) -> bool:
        """Whether the first slice is scored (an item can be shown); raises a background failure."""
        self._sync.raise_error()
        return self._sync.ready.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until `ready()` (for scripts and tests; the page polls `ready`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._sync.ready.wait(0.05):
            self._sync.raise_error()
            if deadline is not None and time.monotonic() >= deadline:
                return False
        self._sync.raise_error()
        return True

    def first_slice_progress(self) -> tuple[int, int]:
        """(items of the first slice scored so far, its size)."""
        return self.scorer.progress()

    def state(self, who: str = "") -> dict:
        """Everything `who`'s page shows, JSON-able."""
        self._sync.raise_error()
        pool, answers, refitter = self.pool, self.answers, self.refitter
        with self._sync.lock:
            current = self._current_of(who)
            counts = label_counts(answers.columns(), len(self.columns))
            questions = self._questions(counts) or None  # the named questions (a task of labels has none)
            ests = refitter.estimates
            est = None if None in ests else min(ests, key=lambda e: e.mean)  # a task of questions: the least
            share = pool.auto_share(refitter.thresholds, answers.given)
            return {
                "ready": self._sync.ready.is_set(), "item": view.item(pool, answers, current, counts, who),
                "labels": list(self.labels), "multi_label": self.multi, "press": self.task.readout.press,
                "questions": questions,
                "counts": {lab: int(c) for lab, c in zip(self.columns, counts)},
                "labelled": len(answers.given), "skipped": len(answers.skips), "pool": len(pool),
                "scored": int(pool.visited.sum()), "sample_note": pool.sample_note,
                "accuracy": est.as_dict() if est is not None else None,
                "fair_answers": answers.fair_count(), "fair_needed": refit.MIN_FAIR,
                "auto_share": share, "auto_threshold": _alone(refitter.thresholds),
                "target_accuracy": self.target_accuracy,
                "fitting": refitter.fitting, "done": current is None and bool(pool.visited.all()),
                "history": view.history(pool, answers, who), "skipped_rows": view.skipped(pool, answers, who),
                "advice": view.advice(est, counts), "me": self._me(who), "team": self._team_state(),
                "guidelines": self._guidelines(),
            }

    def _me(self, who: str) -> dict:
        role = "reviewer" if self.team is not None and who in self.team.reviewers else "annotator"
        return {"name": who, "role": role}

    def _team_state(self) -> dict | None:
        """The team's progress (lock held): None without a team."""
        if self.team is None:
            return None
        answers, spec = self.answers, self.team.spec
        statuses = [c.status for c in answers.consensus.values()]
        return {"annotators": list(self.team.annotators), "reviewers": list(self.team.reviewers),
                "overlap": spec.overlap, "overlap_share": spec.share,
                "overlap_items": sum(1 for need in answers.needs.values() if need > 1),
                "waiting": sum(1 for p, need in answers.needs.items() if len(answers.answered.get(p, {})) < need),
                "disputed": len(answers.disputed()), "ties": statuses.count("tie"),
                "reviewed": statuses.count("reviewed")}

    def _guidelines(self) -> dict:
        """The task's label descriptions (and examples) and the longer guidelines, for the page."""
        questions = self.task.questions or ()
        tasks = [(q.name, q.task) for q in questions] or [("", self.task)]
        return {"text": self.guidelines, "labels": [
            {"question": name, "label": label, "description": desc, "examples": list(examples)}
            for name, task in tasks
            for label, desc, examples in zip(task.labels, task.descriptions or ("",) * len(task.labels),
                                             task.label_examples or ((),) * len(task.labels))]}

    def _questions(self, counts: np.ndarray) -> list[dict]:
        """Each question of a task of questions as the page shows it (lock held): its labels, counts,
        estimate and automatic share (of the items its own head is sure enough of)."""
        out, at = [], 0
        for k, (q, part) in enumerate(zip(self.task.questions, self.pool.parts)):
            est, threshold = self.refitter.estimates[k], self.refitter.thresholds[k]
            out.append({"name": q.name, "question": q.question, "labels": list(q.labels), "multi_label": q.multi_label,
                        "press": q.readout.press,
                        "counts": {lab: int(c) for lab, c in zip(q.labels, counts[at:at + len(q.labels)])},
                        "accuracy": est.as_dict() if est is not None else None, "auto_threshold": threshold,
                        "auto_share": part.auto_share([threshold], self.answers.given)})
            at += len(q.labels)
        return out

    # Each change is written to the store first, then read back from it (`Answers.reload`).

    def answer(self, row: int, label: str | list[str], version: int | None = None, who: str = "") -> None:
        """Record `who`'s `label` for input row `row` (durable on return) and move them on if it was
        their current item; in a multi-label task `label` is the list of labels that apply (maybe
        empty); in a task of questions {question: its label, or list of labels}, every question.
        `version`: the row's version the page showed (`state()["item"]["version"]`); `StaleAnswer`
        when the row was answered, skipped or undone since."""
        pos = self.pool.position(row)
        stored = self.answers.encode(label)
        with self._sync.lock:
            current = self._current_of(who)
            kind = current[2] if current is not None and current[0] == pos else "chosen"
            self.store.answer(int(row), self.pool.hashes[pos], stored, kind, version, who)
            self.answers.reload()
            self._moved(pos, who)

    def accept(self, row: int, who: str = "") -> str | list[str] | dict:
        """Answer `row` with the current guess; returns that label (multi-label: that list of labels;
        a task of questions: {question: its guess})."""
        pos = self.pool.position(row)
        with self._sync.lock:
            label, _ = self.pool.guess(pos)
        if label is None:
            raise TaskError(f"row {row} is not scored yet, so there is no guess to accept")
        self.answer(row, label, who=who)
        return label

    def skip(self, row: int, version: int | None = None, who: str = "") -> None:
        """`who` skips `row` (not offered to them again; durable on return); `version` as for `answer`."""
        pos = self.pool.position(row)
        with self._sync.lock:
            self.store.skip(int(row), self.pool.hashes[pos], version, who)
            self.answers.reload()
            self._moved(pos, who)

    def show(self, row: int, who: str = "") -> None:
        """Make `row` `who`'s current item (from their history or skipped list): answering it then
        changes their answer, or gives one to a skipped row."""
        pos = self.pool.position(row)
        with self._sync.lock:
            kind = self.answers.kinds.get(pos) or "chosen"  # a random pick answered again still counts as one
            self._current[who] = (pos, "chosen from the history", kind)
            self._sync.bump()

    def undo(self, who: str = "") -> int | None:
        """Take back `who`'s latest answer or skip; that row becomes their current item. Its row, or None."""
        with self._sync.lock:
            row = self.store.undo(who)
            if row is None:
                return None
            pos = self.pool.index[row]
            kind = self.answers.kinds.get(pos) or "undo"  # a random pick answered again still counts as one
            self.answers.reload()
            self._current[who] = (pos, "brought back by undo", kind)
            self._sync.bump()
            return row

    def export(self, path: str | Path, fmt: str | None = None) -> int:
        """Write the answered input rows, in input order; returns the number written. `fmt` (else from
        the extension): "csv" (or a .csv/.jsonl path) the rows that have a gold, with a `gold` column
        (replacing one the input has; a task of questions: a `gold_NAME` column per question);
        "parquet" every answered row with the gold, each annotator's answer and the reviewer's as
        `datasets` ClassLabel features (`exports.write_parquet`); "label-studio" a Label Studio
        import file, one annotation per answer (`exports.write_label_studio`). The last two are for
        a single-label task."""
        fmt = outputs.export_format(path, fmt)
        with self._sync.lock:
            gold = {int(self.pool.rows[pos]): self.answers.gold(value) for pos, value in self.answers.given.items()}
            snapshot = outputs.Snapshot(answered={p: dict(v) for p, v in self.answers.answered.items()},
                                        reviewed=dict(self.answers.reviewed), given=dict(self.answers.given))
        if fmt == "table":
            columns = tuple(f"gold_{q.name}" for q in self.task.questions) or ("gold",)
            return outputs.write_gold(self.frame, gold, path, columns)
        choice = self._choice(f"the {fmt} export is of a single-label task; for this one export a CSV (each answer "
                              "in its gold column)")
        items = outputs.labelled_items(snapshot, self.pool, self.frame, choice, self._text_column())
        return outputs.write_export(items, choice[1], self._annotators(snapshot), path, fmt, self._text_column())

    def _choice(self, refusal: str) -> tuple:
        """The one choice each answer makes (its name, its labels, answer → label index), for what reads
        an answer as one label: the Parquet and Label Studio exports, the suspects. TaskError(`refusal`)
        where an answer makes several (several questions; a label set, a no or yes per label)."""
        choices = outputs.readouts(self.task)
        if len(choices) > 1:
            raise TaskError(refusal)
        return choices[0]

    def _text_column(self) -> str:
        return self.store.fingerprint["input"]["text_column"]

    def _annotators(self, snapshot) -> tuple[str, ...]:
        """The annotators in the team's order, then anyone else who answered (a store's earlier person)."""
        named = self.team.annotators if self.team is not None else ()
        others = sorted({who for v in snapshot.answered.values() for who in v} - set(named))
        return (*named, *others)

    def agreement(self, bootstrap: int = 1000) -> dict:
        """The agreement between annotators on the items two or more answered (`agreement.py`), per
        readout: the task's labels, each question's, a multi-label task's labels each as yes/no."""
        from .agreement import agreement

        with self._sync.lock:
            answered = {p: dict(v) for p, v in self.answers.answered.items() if len(v) >= 2}
        key = (bootstrap, tuple((p, tuple(sorted(answered[p].items()))) for p in sorted(answered)))
        if self._agreed is not None and self._agreed[0] == key:  # every page asks every few seconds
            return self._agreed[1]
        names = self._annotators(outputs.Snapshot(answered=answered, reviewed={}, given={}))
        names = tuple(n for n in names if any(n in v for v in answered.values()))
        items = sorted(answered)
        reports = []
        for question, labels, read in outputs.readouts(self.task):
            table = np.full((len(items), len(names)), -1, np.int64)  # [items, annotators] label index, -1: none
            for i, p in enumerate(items):
                for who, value in answered[p].items():
                    table[i, names.index(who)] = read(value)
            reports.append({"question": question,
                            **agreement(table, labels, names, bootstrap=bootstrap, seed=self.seed)})
        report = {"items": len(items), "annotators": list(names), "questions": reports}
        self._agreed = (key, report)
        return report

    def suspects(self, n: int = 20) -> dict:
        """The `n` answered items whose gold a head fitted out of fold finds least likely
        (`suspects.py`), with that probability and the head's label (a single-label task)."""
        from .suspects import suspects

        _, labels, read = self._choice("suspected label errors are found for a single-label task; export the rows "
                                       "and check each question's with a head of its own")
        with self._sync.lock:
            pos = self.pool.scored_among(sorted(self.answers.given))
            y = np.array([read(self.answers.given[p]) for p in pos], dtype=np.int64)
            X = self.pool.features[pos].astype(np.float64)
            status = {int(p): self.answers.consensus[int(p)].status for p in pos}
        found = suspects(X, y, len(labels), n=n, seed=self.seed)
        return {"items": len(pos), "suspects": [
            {**self.pool.snippet(int(pos[s.index])), "gold": labels[s.given], "probability": s.probability,
             "predicted": labels[s.predicted], "predicted_probability": s.predicted_probability,
             "status": status[int(pos[s.index])]} for s in found]}

    def fit(self, path: str) -> Head:
        """Fit a head on the answers so far (C by cross-validation when every label has 2 or more)
        and save it where `classify --head` reads it. A task of questions is refused: Export the rows,
        then `slmclassify fit` fits a head per question from their gold_NAME columns."""
        self.task.shaped(lambda t: None, _no_page_fit)
        with self._sync.lock:
            pos = self.pool.scored_among(self.answers.given)
            y = (self.answers.matrix(pos) if self.multi
                 else np.array([self.labels[self.answers.given[p]] for p in pos]))
            X = self.pool.features[pos].astype(np.float64)
            est = self.refitter.estimate
            anchors = None if self.multi else self.pool.anchor_rows()
        return outputs.fit_head(path, X, y, task=self.task, taps=self.pool.taps, seed=self.seed, est=est,
                                item_hashes=[self.pool.hashes[p] for p in pos], source=self.input_path,
                                model=self.store.fingerprint["model"], anchors=anchors)

    def close(self) -> None:
        """Stop the threads and close the store (answers are already on disk)."""
        self._sync.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()  # the scorer stops after its current batch, the refitter after its fit
        self.store.close()

    # ----- picking the current item (lock held)

    def _current_of(self, who: str) -> tuple[int, str, str] | None:
        """`who`'s current item, picked when they have none (lock held): a reviewer's queue or the
        overlap items may have filled since, and more items may be scored."""
        if self._current.get(who) is None:
            self._next(who)
        return self._current[who]

    def _moved(self, pos: int, who: str) -> None:
        """After `who`'s answer or skip of `pos`: the refitter's cue, and their next item if it was their
        current one; anyone else holding `pos` who may no longer answer it moves on too."""
        self._sync.bump()
        for person, current in list(self._current.items()):
            if person == who:
                if current is None or current[0] == pos:
                    self._next(who)
            elif current is not None and current[0] == pos and not self._may_hold(pos, person):
                self._next(person)

    def _may_hold(self, pos: int, who: str) -> bool:
        """Whether `pos` may stay `who`'s current item: an annotator's while it needs more answers
        than it has, a reviewer's while it is disputed (a row they chose themselves always)."""
        reason = self._current[who][1]
        if reason in ("chosen from the history", "brought back by undo"):
            return True
        answers = self.answers
        if self.team is not None and who in self.team.reviewers:
            return pos in answers.disputed()
        return pos not in answers.given and len(answers.answered.get(pos, {})) < answers.needs.get(pos, 1) \
            or pos not in answers.touched()

    def _scored(self) -> None:
        """After the scorer published a slice: clusters, each person's first item, the refitter's cue, ready."""
        self.picker.clusters.update(self.pool.features, self.pool.scored)
        for who in self._people():
            if self._current.get(who) is None:
                self._next(who)
        self._sync.bump()
        if any(c is not None for c in self._current.values()) or self.pool.visited.all():  # something to show
            self._sync.ready.set()

    def _people(self) -> tuple[str, ...]:
        return ("",) if self.team is None else tuple(m.name for m in self.team.members)

    def _next(self, who: str) -> None:
        """Pick `who`'s next item: a reviewer's the first disputed item no other reviewer holds; an
        annotator's the first overlap item waiting for their answer that is not held by as many as it
        still needs, else the picker's among the items nobody has answered, skipped or holds."""
        pool, answers = self.pool, self.answers
        if not pool.scored.any():
            self._current[who] = None
            return
        held = {}  # pos → how many others hold it
        for person, current in self._current.items():
            if person != who and current is not None:
                held[current[0]] = held.get(current[0], 0) + 1
        if self.team is not None and who in self.team.reviewers:
            queue = [p for p in answers.disputed() if p not in held and pool.scored[p]]
            self._current[who] = None if not queue else (
                queue[0], "the annotators disagree: your answer is final", answers.kinds.get(queue[0], "review"))
            return
        for p in answers.waiting(who):
            if pool.scored[p] and len(answers.answered.get(p, {})) + held.get(p, 0) < answers.needs[p]:
                kind = answers.offered.get(p, "chosen")
                self._current[who] = (p, f"answered by {answers.needs[p]} annotators, for the agreement between them",
                                      kind)
                return
        seen = PoolView(zero_shot=pool.zero_shot, features=pool.features, scored=pool.scored,
                        head=pool.picker_probs(), labels=self.columns, priority=pool.priority, questions=pool.spans)
        labelled = answers.columns()
        # the picker's seed counts the excluded rows: those of a one-person session are its skips, as always
        excluded = (answers.skips | answers.skips_of.get(who, set()) | answers.touched() | set(held)) - set(labelled)
        pick: Pick | None = self.picker.pick(seen, labelled, excluded)
        self._current[who] = None if pick is None else (pick.row, pick.detail or pick.reason, pick.kind)


def _alone(values: list):
    """The one value of a task with one head (its own); None where each question's head has its own."""
    return values[0] if len(values) == 1 else None


def _team(store: LabelStore, spec: TeamSpec) -> Team | None:
    """The session's team: the one asked for (each name the store already knows keeps its token),
    kept in the store; else the one the store was started with; None: one person."""
    kept = store.team()
    if spec.annotators:
        team = Team.of(spec, kept.get("members", {}))
        store.save_team({"members": team.kept(), **spec.as_dict()})
        return team
    if kept:
        return Team.of(TeamSpec(tuple(kept["annotators"]), tuple(kept["reviewers"]), kept["overlap"],
                                kept["overlap_share"]), kept["members"])
    return None


def _no_page_fit(task) -> None:
    raise TaskError("the labelling page fits one question's head; for a task with [[questions]], export the "
                    "rows and run `slmclassify fit` on them with --gold-column NAME=gold_NAME per question")
