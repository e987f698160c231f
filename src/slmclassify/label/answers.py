"""The answers of a labelling session as its `LabelStore` holds them, by pool position.

The store is the single source of truth: each change is written there and the answers, kinds,
skips, versions and history are read back from it (`reload`, under the session's lock), so that
the page's counts, the refits, Export and Fit see exactly what the store holds, whatever the
clients do at once. Two queries per change, none per poll of the page.

An answer is a label index, or in a multi-label task a sorted tuple of label indices (maybe empty:
none applies); the store keeps a label's name, or a JSON list of names. In a task of questions an
answer is a tuple of each question's answer, in the task's order; the store keeps a JSON object,
{question: label name, or list of names} (the store's schema is unchanged: a store of a one-question
task holds what it held before).

With a team (`team.py`) each person's latest answer to an item is kept (`answered`: annotators',
`reviewed`: a reviewer's), and the item's answer the head learns from, the counts and the exports
read (`given`) is its consensus: the reviewer's, else the majority once it has the answers it needs,
else none (`consensus`). Without one, the one person's answers are `given`, as before.
"""

from __future__ import annotations

import json

import numpy as np

from ..core.task import Task
from ..errors import TaskError
from . import refit
from .store import LabelStore
from .team import Consensus, Team, consensus

HISTORY = 12
"""Answers and skips the page lists, newest first."""



class InvalidAnswer(TaskError):
    """An answer that is not one of the task's (a label it does not have, a string where a multi-label
    task takes a list): the page answers 422, not the 409 of a stale answer."""


class _OneQuestion:
    """How a task of labels' answers are stored: a label's name, or (multi-label) a JSON list of names."""

    def __init__(self, task: Task):
        self.task, self.labels, self.readout = task, task.labels, task.readout

    def wanted(self):
        return list(self.labels)

    def encode(self, label) -> str:
        return self.readout.stored(self.readout.checked(self.labels, label, "the task", InvalidAnswer))

    def decode(self, text: str):
        return self.readout.parse(self.labels, self.readout.from_store(text))

    def shown(self, value) -> str:
        return self.readout.shown(self.labels, value)

    def gold(self, value):
        return self.readout.gold_cell(self.labels, value, self.task.label_separator)

    def columns(self, value):
        return value


class _Questions:
    """How a task of questions' answers are stored: a JSON object, {question: its answer as a task of
    that question alone stores it}; an answer is a tuple of each question's, in the task's order."""

    def __init__(self, task: Task):
        self.questions, self.names = task.questions, [q.name for q in task.questions]
        # each question's first column among all questions' labels side by side
        self.offsets = np.cumsum([0, *(len(q.labels) for q in self.questions)])[:-1].tolist()

    def wanted(self):
        return {q.name: list(q.labels) for q in self.questions}

    def encode(self, label) -> str:
        if not isinstance(label, dict) or sorted(label) != sorted(self.names):
            raise InvalidAnswer(f"a task of questions takes an answer to each of {self.names}, as {{question: "
                                f"label}} (a list of labels for a multi-label one), got {_said(label)}")
        return json.dumps({q.name: q.readout.checked(q.labels, label[q.name], f"question {q.name}", InvalidAnswer)
                           for q in self.questions})

    def decode(self, text: str):
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if not isinstance(value, dict) or sorted(value) != sorted(self.names):
            return None
        each = tuple(q.readout.parse(q.labels, value[q.name]) for q in self.questions)
        return None if any(v is None for v in each) else each

    def shown(self, value) -> str:
        return " · ".join(q.readout.shown(q.labels, v) for q, v in zip(self.questions, value))

    def gold(self, value):
        return tuple(q.readout.gold_cell(q.labels, v, q.task.label_separator) for q, v in zip(self.questions, value))

    def columns(self, value):
        return tuple(c for q, at, v in zip(self.questions, self.offsets, value) for c in q.readout.columns(at, v))


def codec_of(task: Task) -> _OneQuestion | _Questions:
    """How a store spells `task`'s answers (and checks a caller's: `InvalidAnswer`)."""
    return task.shaped(_OneQuestion, _Questions)


def _said(value, limit: int = 80) -> str:
    """A caller's value for a message, cut to `limit` characters (a 30 MB label is not echoed back)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _matrix(given: dict, pos, n_labels: int) -> np.ndarray:
    """[m, L] bool label sets of the answers at pool positions `pos` (multi-label)."""
    Y = np.zeros((len(pos), n_labels), bool)
    for k, p in enumerate(pos):
        Y[k, list(given[int(p)])] = True
    return Y


class QuestionAnswers:
    """One question's answers in a task of questions, as the refitter reads them: `given` {pool
    position: that question's answer}; the kinds are the item's (an item is picked for all its questions)."""

    def __init__(self, answers: Answers, k: int, question):
        self.answers, self.k, self.labels, self.multi = answers, k, question.labels, question.multi_label

    @property
    def given(self) -> dict:
        return {p: value[self.k] for p, value in self.answers.given.items()}

    def fair(self, pos) -> np.ndarray:
        return self.answers.fair(pos)

    def matrix(self, pos) -> np.ndarray:
        return _matrix(self.given, pos, len(self.labels))


class Answers:
    """The store's answers mirrored by pool position (see the module docstring)."""

    questions: tuple = ()
    """A task of questions' questions (none: a task of one question)."""

    def __init__(self, store: LabelStore, task: Task, index: dict[int, int], hashes: list[str], source: str,
                 team: Team | None = None):
        """Refuses a store whose rows are not this pool's texts, or whose labels are not the task's.
        `index`: input row → pool position; `hashes`: each pool item's text hash; `source`: the input's
        name; `team`: who answers (None: one person)."""
        self.store, self.task, self.labels, self.multi = store, task, task.labels, task.multi_label
        self.team = team or Team.alone("-")
        self.questions = task.questions
        self.parts = [QuestionAnswers(self, k, q) for k, q in enumerate(task.questions)]
        self._codec = codec_of(task)
        self.index = index
        for row, h in store.hashes().items():
            if row not in index or hashes[index[row]] != h:
                raise TaskError(f"row {row} of {source} is not the text that was answered in {store.path}; "
                                "use the input the store was started with, or another store")
        for (row, _who), (label, _, _) in store.everyone().items():
            if label is not None and self.decode(label) is None:
                raise TaskError(f"{store.path} holds label {label!r} for row {row}, which is not in the task's "
                                f"labels {self._wanted()}")
        self.reload()

    def reload(self) -> None:
        """Read the answers, consensus, kinds, skips, versions and histories back from the store (lock held)."""
        events = {(self.index[row], who): event for (row, who), event in self.store.everyone().items()}
        reviewers = set(self.team.reviewers)
        # pos → {annotator: answer}; an answer is a label index, or (multi-label) a tuple of label indices
        self.answered: dict[int, dict[str, object]] = {}
        self.reviewed: dict[int, tuple[str, object]] = {}  # pos → (reviewer, answer): the latest reviewer's
        first: dict[int, tuple[int, str]] = {}  # pos → (seq, kind) of its earliest live annotator answer
        skipped_by: dict[int, set[str]] = {}
        for (p, who), (lab, kind, seq) in sorted(events.items(), key=lambda e: e[1][2]):
            if lab is None:
                skipped_by.setdefault(p, set()).add(who)
            elif who in reviewers:
                self.reviewed[p] = (who, self.decode(lab))
            else:
                self.answered.setdefault(p, {})[who] = self.decode(lab)
                first.setdefault(p, (seq, kind))
        order = sorted(first, key=lambda p: first[p][0])
        self.needs: dict[int, int] = self.team.needs(order)  # pos → the annotators' answers it needs
        self.consensus: dict[int, Consensus] = {
            p: consensus(list(self.answered.get(p, {}).values()), self.needs.get(p, 1),
                         self.reviewed[p][1] if p in self.reviewed else None)
            for p in {*self.answered, *self.reviewed}}
        self.given: dict[int, int | tuple[int, ...]] = {p: c.gold for p, c in self.consensus.items()
                                                        if c.gold is not None}
        # pool position → why it was offered (`Pick.kind`, its first answer's), for the estimate
        self.offered: dict[int, str] = {p: kind for p, (_seq, kind) in first.items()}  # every answered item's
        self.kinds: dict[int, str] = {p: self.offered.get(p, "chosen") for p in self.given}
        self.skips_of: dict[str, set[int]] = {}
        for p, people in skipped_by.items():
            for who in people:
                self.skips_of.setdefault(who, set()).add(p)
        # skipped by someone and answered by nobody: offered to no one again
        self.skips: set[int] = {p for p in skipped_by if p not in self.answered and p not in self.reviewed}
        self._recent: dict[str, list[int]] = {}  # who → their positions, newest event first
        for (p, who), (_lab, _kind, seq) in sorted(events.items(), key=lambda e: -e[1][2]):
            self._recent.setdefault(who, []).append(p)
        self.versions = {(self.index[row], who): v for (row, who), v in self.store.versions().items()}

    def recent(self, who: str = "") -> list[int]:
        """`who`'s latest answered or skipped positions, newest first (the page's history)."""
        return self._recent.get(who, [])[:HISTORY]

    def own(self, pos: int, who: str = ""):
        """`who`'s own answer to `pos` (a reviewer's decision for a reviewer), or None."""
        if who in self.team.reviewers:
            by, value = self.reviewed.get(pos, (None, None))
            return value if by == who else None
        if not self.team.is_team:
            return self.given.get(pos)
        return self.answered.get(pos, {}).get(who)

    def version(self, pos: int, who: str = "") -> int:
        return self.versions.get((pos, who), 0)

    def disputed(self) -> list[int]:
        """Positions whose annotators disagree and no reviewer has decided, in the order first answered."""
        return [p for p in self.needs if p in self.consensus and self.consensus[p].disputed]

    def waiting(self, who: str) -> list[int]:
        """Positions of the overlap share that still need answers and `who` has neither answered nor
        skipped, in the order first answered (handed out before new items)."""
        skipped = self.skips_of.get(who, set())
        return [p for p, need in self.needs.items()
                if len(self.answered.get(p, {})) < need and who not in self.answered.get(p, {})
                and p not in skipped and p not in self.reviewed]

    def touched(self) -> set[int]:
        """Positions with an answer from anyone (kept from new picks, scored first at start)."""
        return {*self.answered, *self.reviewed}

    def fair(self, pos) -> np.ndarray:
        """[m] bool: which of the answers at pool positions `pos` were random picks (an honest estimate's)."""
        return np.array([self.kinds.get(p, "") in refit.REPRESENTATIVE for p in pos], dtype=bool)

    def fair_count(self) -> int:
        return sum(1 for p in self.given if self.kinds.get(p, "") in refit.REPRESENTATIVE)

    def matrix(self, pos) -> np.ndarray:
        """[m, L] bool label sets of the answers at pool positions `pos` (multi-label)."""
        return _matrix(self.given, pos, len(self.labels))

    def columns(self) -> dict:
        """{pool position: answer} as the picker and the counts read it: the answers; in a task of
        questions each answer's labels as columns of all questions' labels side by side (a tuple)."""
        return {p: self._codec.columns(value) for p, value in self.given.items()}

    def _wanted(self):
        return self._codec.wanted()

    # how an answer is stored, shown and exported

    def encode(self, label) -> str:
        """The store's text of an answer given by a caller (validated: `InvalidAnswer`); a task of
        questions takes {question: its answer} for every question."""
        return self._codec.encode(label)

    def decode(self, text: str):
        """The answer a store text holds (None: not one of this task's)."""
        return self._codec.decode(text)

    def shown(self, value) -> str:
        """An answer as the page's history lists it."""
        return self._codec.shown(value)

    def gold(self, value):
        """An answer in an exported gold column (multi-label: joined by the task's separator); a task
        of questions: a tuple, each question's."""
        return self._codec.gold(value)
