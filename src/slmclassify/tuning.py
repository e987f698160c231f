"""Per-user engine defaults (token budget, row cap), written by `slmclassify sweep --save`.

Stored in `$XDG_CONFIG_HOME/slmclassify/settings.toml` (or `~/.config/...`). Flags and task files
override it.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

KEYS = ("token_budget", "max_rows")


def settings_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "slmclassify" / "settings.toml"


def saved_settings() -> dict[str, int]:
    """The saved defaults, or {} when there are none (an unreadable file is ignored)."""
    path = settings_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    return {k: int(data[k]) for k in KEYS if isinstance(data.get(k), int)}


def save_settings(**values: int) -> Path:
    """Write the given defaults (replacing earlier ones)."""
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k} = {int(v)}\n" for k, v in values.items() if k in KEYS), encoding="utf-8")
    return path


def write_task_settings(task_file: str, **values: float) -> None:
    """Set top-level numeric keys in a TOML task file, keeping the rest of it as written."""
    path = Path(task_file)
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.split("=")[0].strip() not in values]
    # Top-level keys must precede the first [table]: insert before it.
    first_table = next((i for i, line in enumerate(kept) if line.lstrip().startswith("[")), len(kept))
    new = [f"{k} = {v!r}" for k, v in values.items()]
    path.write_text("\n".join(kept[:first_table] + new + kept[first_table:]) + "\n", encoding="utf-8")
