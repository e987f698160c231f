"""A command's task and engine settings from their sources: explicit values (flags), the task file
and the user's saved defaults.

The files are read by `io` (`io.task_files`, `io.saved_settings`) into plain data; the rules that
validate and merge it are `core`'s (`Task.from_dict`, `merge_task`, `merge_settings`). This module
is where the two meet, so that `core` reads no file and `io` knows no core type.
"""

from __future__ import annotations

import os
from typing import Any

from ..core.settings import EngineSettings
from ..core.settings_sources import merge_settings
from ..core.task import Task, merge_task, task_engine_settings
from ..errors import TaskError
from ..io.saved_settings import saved_settings
from ..io.task_files import read_task_file


def read_task(path: str | os.PathLike) -> Task:
    """The task of a TOML task file. Unknown keys are an error, so typos do not pass silently."""
    return Task.from_dict(read_task_file(path), source=str(path))


def named_tasks(specs) -> dict[str, Task]:
    """`NAME=FILE.toml` specs (`--task` of serve and batch) → {name: Task}, in the order given."""
    tasks = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise TaskError(f"--task must be NAME=FILE.toml, got {spec!r}")
        if name.strip() in tasks:
            raise TaskError(f"task name {name.strip()!r} is given twice")
        tasks[name.strip()] = read_task(path.strip())
    return tasks


def build_task(task_file: str | os.PathLike | None = None, labels: tuple[str, ...] | None = None,
               **values: Any) -> Task:
    """The task from a task file and/or explicit values (`merge_task`'s keywords); given values win."""
    data = read_task_file(task_file) if task_file else None
    return merge_task(data, labels, source=str(task_file), **values)


def task_file_settings(path: str | os.PathLike) -> dict[str, Any]:
    """Engine settings (token_budget, max_rows, device, precision) stored in a task file, if any."""
    return task_engine_settings(read_task_file(path))


def engine_settings(task_file=None, token_budget: int | None = None, max_rows: int | None = None,
                    max_text_tokens: int | None = None, device: str | None = None,
                    precision: str | None = None) -> EngineSettings:
    """The engine settings of flags, the task file and the saved defaults (`merge_settings`); None
    means "not given"."""
    return merge_settings(saved_settings(), task_file_settings(task_file) if task_file else {}, token_budget,
                          max_rows, max_text_tokens, device, precision)
