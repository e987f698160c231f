"""Labelled items for `evaluate` and `fit`: texts and their gold labels, from a BIG-bench task JSON
or a CSV/JSONL/Parquet table. Plain data: `core.metrics` scores predictions against it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..errors import InputError
from .readers import item_texts, read_table


@dataclass(frozen=True)
class Labelled:
    """Labelled items read for `evaluate`."""

    texts: list[str]
    gold: list[tuple[str, ...]]
    """The correct label(s) of each item: several when a BIG-bench item's top scores tie."""
    labels: tuple[str, ...] | None = None
    """The label set the file declares (BIG-bench `target_scores` keys, in file order), if any."""
    instruction: str | None = None
    """The file's own question (BIG-bench `task_prefix`), if any."""
    groups: list[str] | None = None
    """Each item's group (`group_column`): items that cross-validation keeps in one fold."""

    def head(self, limit: int | None) -> Labelled:
        """The first `limit` items (all when None)."""
        if limit is None:
            return self
        return Labelled(self.texts[:limit], self.gold[:limit], self.labels, self.instruction,
                        None if self.groups is None else self.groups[:limit])


def read_labelled(path: str, text_column: str, label_column: str, task=None, group_column: str | None = None) -> Labelled:
    """Texts and gold labels from a BIG-bench task JSON, or a CSV/JSONL/Parquet table (a `task`
    whose template names fields: each row's item composed from those columns, `Task.compose`;
    `task` is used for its `fields`, `multi_field` and `compose` only), and each item's group
    from `group_column` (a table's; a missing cell is a group of its own row)."""
    if group_column and path.endswith(".json"):
        raise InputError("{path}: {field} needs a table (CSV/JSONL/Parquet); a BIG-bench file has no columns",
                         names={"field": "group_column"}, path=path)
    if path.endswith(".json"):
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(f"input file not found: {path}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: not valid JSON ({exc})") from None
        examples = data.get("examples") if isinstance(data, dict) else None
        if not isinstance(examples, list):
            raise InputError(f"{path}: expected a BIG-bench task with an 'examples' list")
        texts, gold = [], []
        for i, ex in enumerate(examples, start=1):
            scores = ex.get("target_scores") if isinstance(ex, dict) else None
            if not isinstance(scores, dict) or not scores or "input" not in ex:
                raise InputError(f"{path}: example {i} needs 'input' and 'target_scores'")
            top = max(scores.values())
            texts.append(str(ex["input"]))
            gold.append(tuple(str(k) for k, v in scores.items() if v == top))
        prefix = data.get("task_prefix")
        instruction = prefix.strip() if isinstance(prefix, str) and prefix.strip() else None
        labels = tuple(str(k) for k in examples[0]["target_scores"]) if examples else None
        return Labelled(texts, gold, labels, instruction)
    fields = task.fields if task is not None and task.multi_field else ()
    frame = read_table(path, text_column, fields=fields)
    if label_column not in frame.columns:
        raise InputError("{path}: no label column {column!r} (use {field}); columns are: {columns}",
                         names={"field": "label_column"}, path=path, column=label_column,
                         columns=", ".join(map(str, frame.columns)))
    separator = task.label_separator if task is not None else ";"
    gold = [(gold_text(v, separator),) for v in frame[label_column]]
    groups = None
    if group_column:
        if group_column not in frame.columns:
            raise InputError("{path}: no group column {column!r} (use {field}); columns are: {columns}",
                             names={"field": "group_column"}, path=path, column=group_column,
                             columns=", ".join(map(str, frame.columns)))
        groups = [f"\0row {i}" if pd.isna(v) or str(v) == "" else str(v) for i, v in enumerate(frame[group_column])]
    return Labelled(item_texts(frame, text_column, fields, task.compose if fields else None), gold, groups=groups)


def read_gold_columns(path: str, text_column: str, columns: dict[str, str], task) -> tuple[list[str], dict[str, list[str]]]:
    """A task of questions' labelled items: the texts and, per question named in `columns`
    ({question: column}), each row's gold cell as text (`gold_text`, that question's separator), read
    from one table in one go, so every question is measured on the same rows."""
    if path.endswith(".json"):
        raise InputError(f"{path}: a task with questions needs a table (CSV/JSONL/Parquet) with a gold column per "
                         "question; a BIG-bench file holds one answer per item")
    fields = task.fields if task.multi_field else ()
    frame = read_table(path, text_column, fields=fields)
    for name, column in columns.items():
        if column not in frame.columns:
            raise InputError(f"{path}: no column {column!r} for question {name!r}'s gold labels; columns are: "
                             + ", ".join(map(str, frame.columns)))
    separators = {q.name: q.task.label_separator for q in task.questions}
    gold = {name: [gold_text(v, separators[name]) for v in frame[column]] for name, column in columns.items()}
    return item_texts(frame, text_column, fields, task.compose if fields else None), gold


def gold_text(value, separator: str = ";") -> str:
    """A gold cell as label text: empty for a missing cell (no label); a list of labels (a JSONL list, a
    Parquet list<string>: the form `classify` writes a multi-label result in) joined by the task's
    `separator`; anything else its text."""
    import numpy as np
    import pandas as pd

    if isinstance(value, (list, tuple, np.ndarray)):
        return separator.join(str(v) for v in value if v is not None)
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return ""
    return str(value)
