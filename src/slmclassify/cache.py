"""Where slmclassify keeps what it computes once per machine: converted GGUF models, compiled C
kernels, GEMM and precision choices, activation ranges, CTranslate2 conversions."""

from __future__ import annotations

from pathlib import Path


def cache_root() -> Path:
    """The user cache folder: `$XDG_CACHE_HOME/slmclassify` (default `~/.cache/slmclassify`) on Linux."""
    from platformdirs import user_cache_path

    return user_cache_path("slmclassify", appauthor=False)
