"""How the fast path schedules work (`EngineSettings`), apart from the engine: the `--ray` driver
builds and sends the settings without importing torch (the actors import it), so this module
imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FieldError
from ..backends.names import DEVICES, PRECISIONS

AUTO = "auto"
"""`token_budget` / `max_rows` not given: measured where the engine runs (`models/schedule.py`)."""
DEFAULT_TOKEN_BUDGET = 2048
DEFAULT_MAX_ROWS = 128
"""What a schedule that cannot be measured (no engine: the reference path alone) falls back to."""
DEFAULT_MAX_TEXT_TOKENS = 512
"""Default cap on an item's text tokens: one very long text would otherwise dominate a run
(attention is quadratic in its length) while the label rarely needs more (docs/bad-input.md, *Long texts*)."""
DEFAULT_WINDOW = 1024


@dataclass(frozen=True)
class EngineSettings:
    """How the fast path schedules work. `token_budget` and `max_rows` default to `AUTO`: the
    schedule measured for this machine, model and precision on first use (`models/schedule.py`),
    which a `Classifier` puts in its settings; a value given here wins."""

    token_budget: int | None | str = AUTO
    """Max rows × padded length per batch; None means fixed batches of `max_rows`; `AUTO`: measured."""
    max_rows: int | str = AUTO
    """Max rows per batch; `AUTO`: measured."""
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

    def with_defaults(self) -> EngineSettings:
        """These settings with `AUTO` fields at the built-in defaults (for work that is not a
        classifier's run: a `Classifier` puts the measured schedule there instead)."""
        from dataclasses import replace

        defaults = {"token_budget": DEFAULT_TOKEN_BUDGET, "max_rows": DEFAULT_MAX_ROWS}
        return replace(self, **{name: defaults[name] for name in self.measured})

    @property
    def measured(self) -> tuple[str, ...]:
        """The schedule fields left to the measurement (`AUTO`)."""
        return tuple(name for name in ("token_budget", "max_rows") if getattr(self, name) == AUTO)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise FieldError("window", "{field} must be positive, got {value}", value=self.window)
        if self.token_budget not in (None, AUTO) and not (isinstance(self.token_budget, int) and self.token_budget >= 1):
            raise FieldError("token_budget", "{field} must be a positive number (or auto), got {value}",
                             value=self.token_budget)
        if self.max_rows != AUTO and not (isinstance(self.max_rows, int) and self.max_rows >= 1):
            raise FieldError("max_rows", "{field} must be a positive number (or auto), got {value}", value=self.max_rows)
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


def check_served_names(names: tuple[str, ...]) -> None:
    """`--served-model-name`: ids clients name the model by (the first is the one listed first),
    each one word."""
    for name in names:
        if not name or any(c.isspace() for c in name):
            raise FieldError("served_model_name", "{field} must be a non-empty id without spaces, got {value}",
                             value=repr(name))
    if len(set(names)) != len(names):
        raise FieldError("served_model_name", "{field} is given twice with the same id: {value}",
                         value=", ".join(sorted({n for n in names if names.count(n) > 1})))
