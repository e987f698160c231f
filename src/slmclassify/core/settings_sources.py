"""Engine settings merged from their three sources, without reading any of them.

Precedence: explicit values (flags) > the task file's `token_budget`/`max_rows`/`device`/`precision`
> the user's saved defaults (`io.saved_settings`) > the built-in defaults of `EngineSettings`.
`jobs.sources.engine_settings` reads the files and calls `merge_settings`.
"""

from __future__ import annotations

from dataclasses import replace

from .settings import EngineSettings

NO_CAP = 0
"""`max_text_tokens=NO_CAP` in `merge_settings` turns the item-token cap off (`--max-tokens none`)."""


def merge_settings(saved: dict, from_task: dict, token_budget: int | None = None, max_rows: int | None = None,
                   max_text_tokens: int | None = None, device: str | None = None,
                   precision: str | None = None) -> EngineSettings:
    """Merge the sources (see the module docstring); None means "not given".

    `saved`: the user's saved defaults; `from_task`: the task file's engine settings
    (`task.task_engine_settings`). `max_text_tokens`: None keeps the default cap, `NO_CAP` removes
    it, a positive number sets it. `device`, `precision`: the flags, else the task file's keys.
    """
    stored = {**saved, **from_task}
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
