"""The per-user defaults `slmclassify sweep --save` writes: `settings.toml` in the platform's user
config folder (e.g. `~/.config/slmclassify/` on Linux). `core.settings_sources` ranks them below
flags and the task file."""

from __future__ import annotations

import tomllib
from pathlib import Path

KEYS = ("token_budget", "max_rows")
"""The settings a user may save."""


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


def save_settings(**values: int) -> Path:
    """Write the given defaults (replacing earlier ones)."""
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k} = {int(v)}\n" for k, v in values.items() if k in KEYS), encoding="utf-8")
    return path
