"""Calibration of label scores: contextual calibration and temperature scaling.

Contextual calibration (Zhao et al. 2021, "Calibrate Before Use"): the label distribution the
model gives for content-free inputs ("", "N/A", "[MASK]") is its prior; dividing it out
(subtracting its log) removes a label's head start. Temperature scaling divides the scores by a
T fitted on labelled items (minimum negative log-likelihood), so confidences match accuracy.
Both are cheap: the content-free inputs are a few forward passes that reuse the prefix cache.
"""

from __future__ import annotations

import numpy as np

from .results import softmax

CONTENT_FREE = ("", "N/A", "[MASK]")


def prior_from_scores(scores: np.ndarray) -> np.ndarray:
    """[k, L] content-free label scores → [L] log of the mean label distribution (the bias)."""
    return np.log(softmax(scores).mean(axis=0))


def adjust(scores: np.ndarray, bias: np.ndarray | None, temperature: float) -> np.ndarray:
    """Calibrated scores: (scores − bias) / temperature. NaN rows (empty items) stay NaN."""
    out = scores if bias is None else scores - bias[None, :]
    return out / temperature


def fit_temperature(scores: np.ndarray, gold: np.ndarray, low: float = 0.05, high: float = 50.0) -> float:
    """The T minimising the mean negative log-likelihood of softmax(scores / T) at `gold`.

    The NLL is unimodal in log T, so a golden-section search over [low, high] finds it.
    """
    def nll(log_t: float) -> float:
        z = scores / np.exp(log_t)
        z = z - z.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(z).sum(axis=1))
        return float((log_norm - z[np.arange(len(gold)), gold]).mean())

    a, b = np.log(low), np.log(high)
    ratio = (np.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    for _ in range(80):
        if nll(c) < nll(d):
            b = d
        else:
            a = c
        c, d = b - ratio * (b - a), a + ratio * (b - a)
    return float(np.exp((a + b) / 2))
