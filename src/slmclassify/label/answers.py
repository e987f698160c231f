"""The answers of a labelling session as its `LabelStore` holds them, by pool position.

The store is the single source of truth: each change is written there and the answers, kinds,
skips, versions and history are read back from it (`reload`, under the session's lock), so that
the page's counts, the refits, Export and Fit see exactly what the store holds, whatever the
clients do at once. Two queries per change, none per poll of the page.

An answer is a label index, or in a multi-label task a sorted tuple of label indices (maybe empty:
none applies); the store keeps a label's name, or a JSON list of names.
"""

from __future__ import annotations

import json

import numpy as np

from ..core.task import Task
from ..errors import TaskError
from . import refit
from .store import LabelStore

HISTORY = 12
"""Answers and skips the page lists, newest first."""



class InvalidAnswer(TaskError):
    """An answer that is not one of the task's (a label it does not have, a string where a multi-label
    task takes a list): the page answers 422, not the 409 of a stale answer."""


def _shown(value, limit: int = 80) -> str:
    """A caller's value for a message, cut to `limit` characters (a 30 MB label is not echoed back)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"

class Answers:
    """The store's answers mirrored by pool position (see the module docstring)."""

    def __init__(self, store: LabelStore, task: Task, index: dict[int, int], hashes: list[str], source: str):
        """Refuses a store whose rows are not this pool's texts, or whose labels are not the task's.
        `index`: input row → pool position; `hashes`: each pool item's text hash; `source`: the input's name."""
        self.store, self.task, self.labels, self.multi = store, task, task.labels, task.multi_label
        self.index = index
        for row, h in store.hashes().items():
            if row not in index or hashes[index[row]] != h:
                raise TaskError(f"row {row} of {source} is not the text that was answered in {store.path}; "
                                "use the input the store was started with, or another store")
        for row, (label, _, _) in store.latest().items():
            if label is not None and self.decode(label) is None:
                raise TaskError(f"{store.path} holds label {label!r} for row {row}, which is not in the task's "
                                f"labels {list(self.labels)}")
        self.reload()

    def reload(self) -> None:
        """Read the answers, kinds, skips, versions and history back from the store (lock held)."""
        latest = {self.index[row]: event for row, event in self.store.latest().items()}  # pos → (label, kind, seq)
        # pos → label index, or (multi-label) tuple of label indices
        self.given: dict[int, int | tuple[int, ...]] = {p: self.decode(lab) for p, (lab, _, _) in latest.items()
                                                        if lab is not None}
        # pool position → why it was offered (`Pick.kind`), for the estimate
        self.kinds: dict[int, str] = {p: kind for p, (lab, kind, _) in latest.items() if lab is not None}
        self.skips: set[int] = {p for p, (lab, _, _) in latest.items() if lab is None}
        self.recent = sorted(latest, key=lambda p: latest[p][2], reverse=True)[:HISTORY]  # newest first
        self.versions = {self.index[row]: v for row, v in self.store.versions().items()}  # pos → version

    def fair(self, pos) -> np.ndarray:
        """[m] bool: which of the answers at pool positions `pos` were random picks (an honest estimate's)."""
        return np.array([self.kinds.get(p, "") in refit.REPRESENTATIVE for p in pos], dtype=bool)

    def fair_count(self) -> int:
        return sum(1 for p in self.given if self.kinds.get(p, "") in refit.REPRESENTATIVE)

    def matrix(self, pos) -> np.ndarray:
        """[m, L] bool label sets of the answers at pool positions `pos` (multi-label)."""
        Y = np.zeros((len(pos), len(self.labels)), bool)
        for k, p in enumerate(pos):
            Y[k, list(self.given[int(p)])] = True
        return Y

    # how an answer is stored, shown and exported

    def encode(self, label) -> str:
        """The store's text of an answer given by a caller (validated: `InvalidAnswer`)."""
        if not self.multi:
            if not isinstance(label, str) or label not in self.labels:
                raise InvalidAnswer(f"label {_shown(label)} is not one of the task's labels {list(self.labels)}")
            return label
        if isinstance(label, str) or not all(isinstance(name, str) for name in label):
            raise InvalidAnswer(f"a multi-label task's answer is a list of its labels {list(self.labels)}, "
                                f"got {_shown(label)}")
        unknown = [name for name in label if name not in self.labels]
        if unknown:
            raise InvalidAnswer(f"label {_shown(unknown[0])} is not one of the task's labels {list(self.labels)}")
        return json.dumps([name for name in self.labels if name in label])

    def decode(self, text: str):
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

    def shown(self, value) -> str:
        """An answer as the page's history lists it."""
        if not self.multi:
            return self.labels[value]
        return ", ".join(self.labels[i] for i in value) or "none of them"

    def gold(self, value) -> str:
        """An answer in an exported gold column (multi-label: joined by the task's separator)."""
        return self.labels[value] if not self.multi else self.task.label_separator.join(self.labels[i] for i in value)
