"""Engine settings from their three sources, and the per-user defaults `slmclassify sweep --save` writes.

Precedence: explicit values (flags) > the task file's `token_budget`/`max_rows` > the user's saved
defaults (`settings.toml` in the platform's user config folder, e.g. `~/.config/slmclassify/` on
Linux) > the built-in defaults of `EngineSettings`.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

from .settings import EngineSettings
from .task import task_file_settings

KEYS = ("token_budget", "max_rows")
NO_CAP = 0
"""`max_text_tokens=NO_CAP` in `engine_settings` turns the item-token cap off (`--max-tokens none`)."""


def settings_path() -> Path:
    """`settings.toml` in the user config folder (`$XDG_CONFIG_HOME/slmclassify` on Linux)."""
    from platformdirs import user_config_path

    return user_config_path("slmclassify", appauthor=False) / "settings.toml"


def saved_settings() -> dict[str, int]:
    """The saved defaults, or {} when there are none (an unreadable file is ignored)."""
    path = settings_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    return {k: int(data[k]) for k in KEYS if isinstance(data.get(k), int) and not isinstance(data.get(k), bool)}


def engine_settings(task_file=None, token_budget: int | None = None, max_rows: int | None = None,
                    max_text_tokens: int | None = None, device: str | None = None,
                    precision: str | None = None) -> EngineSettings:
    """Merge the sources (see the module docstring); None means "not given".

    `max_text_tokens`: None keeps the default cap, `NO_CAP` removes it, a positive number sets it.
    `device`, `precision`: the flags, else the task file's keys of those names.
    """
    stored = {**saved_settings(), **(task_file_settings(task_file) if task_file else {})}
    values = {
        "token_budget": token_budget if token_budget is not None else stored.get("token_budget"),
        "max_rows": max_rows if max_rows is not None else stored.get("max_rows"),
        "device": device if device is not None else stored.get("device"),
        "precision": precision if precision is not None else stored.get("precision"),
    }
    settings = EngineSettings(**{k: v for k, v in values.items() if v is not None})
    if max_text_tokens is None:
        return settings
    return replace(settings, max_text_tokens=None if max_text_tokens == NO_CAP else max_text_tokens)


def save_settings(**values: int) -> Path:
    """Write the given defaults (replacing earlier ones)."""
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k} = {int(v)}\n" for k, v in values.items() if k in KEYS), encoding="utf-8")
    return path


def write_task_settings(task_file: str, **values: float) -> None:
    """Set top-level keys in a TOML task file, keeping its comments, order and formatting."""
    import tomlkit

    path = Path(task_file)
    document = tomlkit.parse(path.read_text(encoding="utf-8"))
    for key, value in values.items():
        document[key] = value  # tomlkit keeps top-level keys ahead of the first [table]
    path.write_text(tomlkit.dumps(document), encoding="utf-8")
