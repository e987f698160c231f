"""How the fast path schedules work (`EngineSettings`), apart from the engine: the `--ray` driver
builds and sends the settings without importing torch (the actors import it), so this module
imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FieldError
from ..backends.names import DEVICES, PRECISIONS

DEFAULT_TOKEN_BUDGET = 2048
DEFAULT_MAX_ROWS = 128
DEFAULT_MAX_TEXT_TOKENS = 512
"""Default cap on an item's text tokens: one very long text would otherwise dominate a run
(attention is quadratic in its length) while the label rarely needs more (docs/bad-input.md, *Long texts*)."""
DEFAULT_WINDOW = 1024


@dataclass(frozen=True)
class EngineSettings:
    """How the fast path schedules work. The defaults are the fastest measured on a 2-core CPU."""

    token_budget: int | None = DEFAULT_TOKEN_BUDGET
    """Max rows × padded length per batch; None means fixed batches of `max_rows`."""
    max_rows: int = DEFAULT_MAX_ROWS
    """Max rows per batch."""
    prefix_cache: bool = True
    """Run the shared prefix once and reuse its keys/values (off only for ablations)."""
    sort: bool = True
    """Sort items by length before batching (off only for ablations)."""
    max_text_tokens: int | None = DEFAULT_MAX_TEXT_TOKENS
    """Cut item texts to this many tokens (status `truncated`); None: only at the model's context."""
    window: int = DEFAULT_WINDOW
    """Rows `classify_iter` holds at once: sorted, batched and de-duplicated within this window."""
    device: str | None = None
    """auto (None), cpu or cuda: where a model loaded by the Classifier runs (auto: CUDA when available)."""
    precision: str | None = None
    """None: fp32 on CPU, bf16 on CUDA; fp32, bf16, fp16, int8; auto: a low precision only if it is
    faster here and agrees with fp32 (see `models/precision.py`)."""

    def __post_init__(self) -> None:
        if self.window < 1:
            raise FieldError("window", "{field} must be positive, got {value}", value=self.window)
        if self.token_budget is not None and self.token_budget < 1:
            raise FieldError("token_budget", "{field} must be positive, got {value}", value=self.token_budget)
        if self.max_rows < 1:
            raise FieldError("max_rows", "{field} must be positive, got {value}", value=self.max_rows)
        if self.max_text_tokens is not None and self.max_text_tokens < 1:
            raise FieldError("max_text_tokens", "{field} must be positive, got {value}", value=self.max_text_tokens)
        if self.device is not None and self.device not in DEVICES and not self.device.startswith("cuda:"):
            raise FieldError("device", "{field} must be one of {choices}, got {value!r}",
                             choices=', '.join(DEVICES), value=self.device)
        if self.precision is not None:
            check_precision(self.precision)


def check_precision(precision: str | None) -> str | None:
    """None (the default: fp32 on CPU, bf16 on CUDA) or one of PRECISIONS."""
    if precision is not None and precision not in PRECISIONS:
        raise FieldError("precision", "{field} must be one of {choices}, got {value!r}",
                         choices=', '.join(PRECISIONS), value=precision)
    return precision
