"""`--precision auto` on a CPU: a low precision only where it is faster here AND agrees with fp32.

Candidates are the low precisions this CPU runs natively (`backends.cpu_native`: bf16/fp16 need
AVX512-BF16/FP16 or AMX, int8 any x86 CPU) whose GEMM rate on the model's shapes, measured at
load (`backends.choice`), beats the float32 kernel by `MIN_SPEEDUP`. The fastest candidate is then
checked on `AGREEMENT_ITEMS` article tickets scored with the Classifier's own task: it is picked
only if ≥ `MIN_AGREEMENT` of its predictions equal the float32 fast path's (which is itself exact
against the reference). Otherwise the next candidate, and float32 when none passes. The decision
is cached per machine, model and task in the backends cache, so it is made once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from .activation_ranges import ranges_for
from .backends.choice import make_backend, machine_key, model_key, speedup
from .backends.choice import _read, _write
from .backends.device import cpu_native
from .engine import Engine
from .loading import cache_root

LOW_PRECISIONS = ("int8", "bf16", "fp16")
MIN_SPEEDUP = 1.2
MIN_AGREEMENT = 0.99
AGREEMENT_ITEMS = 200


@dataclass(frozen=True)
class Agreement:
    """How a low precision's label scores compare with float32's on the same items."""

    n: int
    agree: int
    """Items with the same predicted label."""
    max_prob_diff: float
    """Largest |Δ probability| of any label (softmax over the labels' scores)."""

    @property
    def share(self) -> float:
        return self.agree / self.n if self.n else 1.0

    @property
    def ok(self) -> bool:
        return self.share >= MIN_AGREEMENT


def agreement(low: np.ndarray, fp32: np.ndarray) -> Agreement:
    """Compare [n, L] label scores (rows of NaN, the empty items, are skipped)."""
    keep = ~np.isnan(fp32).any(axis=1)
    low, fp32 = low[keep], fp32[keep]
    if not len(fp32):
        return Agreement(0, 0, 0.0)
    same = low.argmax(axis=1) == fp32.argmax(axis=1)
    diff = np.abs(_softmax(low) - _softmax(fp32)).max()
    return Agreement(n=len(fp32), agree=int(same.sum()), max_prob_diff=float(diff))


def _softmax(scores: np.ndarray) -> np.ndarray:
    z = np.exp(scores - scores.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def candidates(measured: dict, device) -> list[str]:
    """Native low precisions faster than float32 here, fastest first."""
    fast = [p for p in LOW_PRECISIONS if cpu_native(p) and speedup(measured, p, device) >= MIN_SPEEDUP]
    return sorted(fast, key=lambda p: -speedup(measured, p, device))


def settle_auto(classifier, texts: list[str] | None = None, log=None) -> str:
    """Resolve `--precision auto` for the classifier's model; returns the precision chosen.

    Swaps the model's engine (and the classifier's prefix cache) to the chosen backend.
    """
    from .workload import article_tickets

    loaded = classifier.loaded
    loaded.auto_precision = False
    config, device = loaded.model.config, loaded.backend.device
    task = hashlib.sha256(repr(classifier.task).encode()).hexdigest()[:12]
    key = f"auto|{machine_key(device)}|{model_key(config)}|task {task}"
    cache = _read(cache_root())
    decided = cache.get(key)
    if decided is None:
        decided = _decide(classifier, texts or article_tickets(AGREEMENT_ITEMS), log)
        cache = _read(cache_root())
        cache[key] = decided
        _write(cache_root(), cache)
    loaded.auto_decision = decided
    if decided["precision"] != loaded.backend.precision:
        _use(classifier, decided["precision"])
    return decided["precision"]


def _decide(classifier, texts: list[str], log) -> dict:
    loaded = classifier.loaded
    device = loaded.backend.device
    tried = {}
    order = candidates(loaded.gemm_rates, device)
    if not order:
        return {"precision": "fp32", "tried": tried}
    encoded = classifier.encode(texts)
    stats = classifier.stats
    fp32_engine, fp32_prefix = classifier.engine, classifier.prefix
    reference = classifier.score(encoded)
    for precision in order:
        _use(classifier, precision)
        result = agreement(classifier.score(encoded), reference)
        tried[precision] = {"agree": result.agree, "n": result.n, "max_prob_diff": result.max_prob_diff,
                            "gemm_speedup": round(speedup(loaded.gemm_rates, precision, device), 2)}
        if log:
            log(f"precision auto: {precision} agrees with fp32 on {result.agree}/{result.n}, "
                f"max |Δ probability| {result.max_prob_diff:.1e}")
        if result.ok:
            classifier.stats = stats
            return {"precision": precision, "tried": tried}
    loaded.engine, loaded.backend = fp32_engine, fp32_engine.backend
    classifier.engine, classifier.prefix = fp32_engine, fp32_prefix
    classifier.stats = stats
    return {"precision": "fp32", "tried": tried}


def _use(classifier, precision: str) -> None:
    """Build the engine of `precision` for the classifier's model and re-run its prefix."""
    loaded = classifier.loaded
    backend, _ = make_backend(loaded.model.config, loaded.backend.device, precision, cache_root())
    loaded.backend = backend
    ranges = ranges_for(loaded.tokenizer)
    loaded.engine = classifier.engine = Engine(loaded.model, backend, ranges=ranges)
    classifier.prefix = classifier.engine.prefill(classifier.prefix_ids) if classifier.prefix_ids else None
