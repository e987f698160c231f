"""Task files (TOML) on disk: read one into plain data, and set keys in one keeping its layout.

Only the file is handled here; `core.task` turns the data into a validated `Task`
(`Task.from_dict`, `merge_task`), and `jobs.sources` puts the two together.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from ..errors import TaskError


def read_task_file(path: str | os.PathLike) -> dict[str, Any]:
    """The task file's top-level table, or a TaskError saying why it cannot be read."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskError(f"task file not found: {path}") from None
    except IsADirectoryError:
        raise TaskError(f"task file {path} is a folder, not a TOML file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TaskError(f"task file {path} is not valid TOML: {exc}") from None


def write_task_settings(task_file: str | os.PathLike, **values: float) -> None:
    """Set top-level keys in a TOML task file, keeping its comments, order and formatting."""
    import tomlkit

    path = Path(task_file)
    document = tomlkit.parse(path.read_text(encoding="utf-8"))
    for key, value in values.items():
        document[key] = value  # tomlkit keeps top-level keys ahead of the first [table]
    path.write_text(tomlkit.dumps(document), encoding="utf-8")
