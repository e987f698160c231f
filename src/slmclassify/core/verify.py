"""Check the fast path against the per-item reference path on probe items.

Probes are spread across the length range (shortest to longest), because a padding or
position bug shows on padded rows, and a prefix bug on every row. Items longer than
`PROBE_MAX_TOKENS` are left out (the per-item path costs quadratically more on them, and a long
item shows no bug a 1024-token one would not), so a few huge texts cannot stall the check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .encode import EncodedItems

DEFAULT_TOLERANCE = 1e-3
PROBE_MAX_TOKENS = 1024
LOW_PRECISION_AGREEMENT = 0.99
"""Share of probes whose prediction must equal the float32 reference's in bf16/fp16/int8."""


@dataclass(frozen=True)
class VerifyReport:
    """Agreement of fast and reference label scores on probe items."""

    indices: tuple[int, ...]
    """Probe item indices (input order)."""
    agree: int
    """Probes whose predicted label is the same on both paths."""
    max_abs_diff: float
    """Largest |fast − reference| label log-probability over all probes and labels."""
    reference_seconds: float
    """Time the reference path took for the probes."""
    disagreements: tuple[int, ...] = ()
    tolerance: float = DEFAULT_TOLERANCE
    precision: str = "fp32"
    """The fast path's precision; in bf16/fp16/int8 the log-prob tolerance gives way to agreement."""
    max_prob_diff: float = 0.0
    """Largest |fast − reference| label probability (softmax over the labels' scores)."""

    @property
    def n(self) -> int:
        return len(self.indices)

    @property
    def ok(self) -> bool:
        if self.precision != "fp32":
            return self.agree >= LOW_PRECISION_AGREEMENT * self.n
        return self.agree == self.n and self.max_abs_diff <= self.tolerance

    @property
    def reference_items_per_s(self) -> float:
        return self.n / self.reference_seconds if self.reference_seconds else 0.0

    def reference_speed(self) -> str:
        """The per-item path's speed on the probes, readable when it is slow: '2.5 items/s' or '3.2 s per item'."""
        if not self.n:
            return "no probes"
        rate = self.reference_items_per_s
        return f"{rate:.1f} items/s" if rate >= 1 else f"{self.reference_seconds / self.n:.1f} s per item"

    def summary(self) -> str:
        if self.precision != "fp32":
            share = 100 * self.agree / self.n if self.n else 100.0
            verdict = f"≥ {100 * LOW_PRECISION_AGREEMENT:.0f}% agree" if self.ok else "AGREEMENT TOO LOW"
            return (f"{self.agree}/{self.n} probes ({share:.1f}%) agree with the float32 per-item path, "
                    f"max |Δ probability| {self.max_prob_diff:.1e} ({self.precision}: {verdict})")
        verdict = "identical predictions" if self.ok else "MISMATCH"
        return (f"{self.agree}/{self.n} probes agree with the per-item path, "
                f"max |Δ log-prob| {self.max_abs_diff:.1e} ({verdict})")


def pick_probes(encoded: EncodedItems, n: int, max_tokens: int | None = PROBE_MAX_TOKENS) -> list[int]:
    """Up to n scored items evenly spread over the prompt-length order, among the items of at most
    `max_tokens` prompt tokens (the n shortest when none is that short; None: no limit)."""
    scored = encoded.scored
    if n <= 0 or not len(scored):
        return []
    by_length = scored[np.argsort([len(encoded.ids[i]) for i in scored], kind="stable")]
    if max_tokens is not None:
        short = [i for i in by_length if len(encoded.ids[i]) <= max_tokens]
        by_length = np.array(short, dtype=np.int64) if short else by_length[:n]
    picks = np.unique(np.linspace(0, len(by_length) - 1, num=min(n, len(by_length))).round().astype(int))
    return sorted(int(by_length[p]) for p in picks)


def compare(classifier, encoded: EncodedItems, fast_scores: np.ndarray, indices: list[int],
            tolerance: float = DEFAULT_TOLERANCE) -> VerifyReport:
    """Run the reference path on `indices` and compare with the fast scores of those items."""
    start = time.perf_counter()
    reference = classifier.reference(encoded, indices)  # [k, L]
    seconds = time.perf_counter() - start
    fast = fast_scores[indices] if indices else np.zeros_like(reference)
    same = fast.argmax(axis=1) == reference.argmax(axis=1) if indices else np.array([], dtype=bool)
    diff = float(np.abs(fast - reference).max()) if indices else 0.0
    prob_diff = float(np.abs(_softmax(fast) - _softmax(reference)).max()) if indices else 0.0
    return VerifyReport(
        indices=tuple(indices),
        agree=int(same.sum()),
        max_abs_diff=diff,
        reference_seconds=seconds,
        disagreements=tuple(i for i, s in zip(indices, same) if not s),
        tolerance=tolerance,
        precision=classifier.engine.backend.precision,
        max_prob_diff=prob_diff,
    )


def _softmax(scores: np.ndarray) -> np.ndarray:
    z = np.exp(scores - scores.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)
