"""A loaded model's fast-path engine for a backend: the one place an `Engine` is built for a model.

Building it re-arranges the weights (once per model and backend), so a `LoadedModel` carries its
engine and every Classifier on that model shares it; another backend (a `--precision auto`
candidate, a bench row in another precision) is another LoadedModel with an engine of its own.
"""

from __future__ import annotations

from dataclasses import replace


def with_precision(loaded, precision: str, device=None, **changes):
    """`loaded` (a `loading.LoadedModel`) with the backend of a concrete `precision` on `device`
    (default: its backend's) and an engine of its own on the same weights; `changes`: other fields."""
    from ..backends.choice import make_backend
    from ..cache import cache_root

    device = loaded.backend.device if device is None else device
    head = loaded.model.get_output_embeddings().weight.detach()
    backend, rates = make_backend(loaded.model.config, device, precision, cache_root(), head=head)
    return with_backend(loaded, backend, rates, **changes)


def with_backend(loaded, backend, gemm_rates: dict | None = None, **changes):
    """`loaded` with another backend and an engine of its own on the same weights; gemm_rates kept
    unless given; `changes`: other fields to replace."""
    from ..core.engine import Engine
    from .activation_ranges import ranges_for

    engine = Engine(loaded.model, backend, ranges=ranges_for(loaded.tokenizer))
    return replace(loaded, backend=backend, engine=engine,
                   gemm_rates=loaded.gemm_rates if gemm_rates is None else gemm_rates, **changes)
