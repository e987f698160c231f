"""Activation ranges for int8 smoothing: each linear op's max |x| per input channel, recorded by
the float32 engine over fixed calibration prompts, once per model, and cached.

The prompts are the article's first `N_PROMPTS` tickets rendered with the article's task through
the model's own chat template, each followed by its label, each run alone through `Engine.prefill`:
the same text in the same batches on every run, so the ranges are identical for the same model
whatever is classified later, and in what order. The maximum over tokens does not depend on the
order in which prompts run. Recording costs a few seconds of float32 compute, so the result is
kept in the user cache (`<cache>/activation-ranges-<fingerprint>.pt`), keyed by a fingerprint of
the arranged weights and the calibration's version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from ..backends.gemm import LinearOp, rms_norm
from ..core.engine import Engine
from ..cache import cache_root, tool_version

N_PROMPTS = 32
VERSION = "1"
"""Bump when the prompts or the recording change: cached ranges of other versions are not used."""
OPS = ("qkv", "o", "gate_up", "down")


def calibration_prompts(tokenizer) -> list[list[int]]:
    """Token ids of the calibration prompts: article tickets in the article's task, each with its label."""
    from ..core.prompts import PromptRenderer
    from ..core.article_tickets import ARTICLE_TASK, article_tickets

    renderer = PromptRenderer(tokenizer, ARTICLE_TASK)
    labels = ARTICLE_TASK.labels
    texts = [renderer.render(t) + labels[i % len(labels)] for i, t in enumerate(article_tickets(N_PROMPTS))]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


class _Recorder:
    """A linear op that also keeps the running max |x| per input channel of what it is given."""

    def __init__(self, op):
        self.op, self.max = op, None

    def _see(self, x: torch.Tensor) -> None:
        seen = x.detach().abs().amax(0).float()  # [in]
        self.max = seen if self.max is None else torch.maximum(self.max, seen)

    def __call__(self, x):
        self._see(x)
        return self.op(x)

    def add_(self, h, x):
        self._see(x)
        return self.op.add_(h, x)

    def add_scaled_(self, h, x, scale):
        self._see(x)
        return self.op.add_scaled_(h, x, scale)

    def normed(self, h, eps):
        x = rms_norm(h, eps)
        self._see(x)
        return self.op(x)

    normed_swiglu = LinearOp.normed_swiglu  # through `normed`, which records


def record(engine: Engine, prompts: list[list[int]]) -> list[dict[str, torch.Tensor]]:
    """Per layer {op: [in] max |x|} over every token of `prompts`, each run alone through the engine."""
    layers = engine.layers
    recorders = [{name: _Recorder(getattr(layer, name)) for name in OPS} for layer in layers]
    engine.layers = [dataclasses.replace(layer, **rec) for layer, rec in zip(layers, recorders)]
    try:
        for ids in prompts:
            engine.prefill(list(ids))
    finally:
        engine.layers = layers
    return [{name: rec[name].max.cpu() for name in OPS} for rec in recorders]


def fingerprint(engine: Engine) -> str:
    """A short hash of the engine's arranged float32 weights (a strided sample of every tensor)
    and their shapes: different models, or the same model's shapes with other weights, differ."""
    digest = hashlib.sha256(VERSION.encode())
    for layer in engine.layers:
        for name in OPS:
            w = getattr(layer, name).weight  # the exact `mm` ops hold the arranged [in, out] weight
            digest.update(repr(tuple(w.shape)).encode())
            digest.update(w.reshape(-1)[::97].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:20]


def ranges_for(tokenizer, cache_dir: Path | None = None) -> Callable[[Engine], list[dict[str, torch.Tensor]]]:
    """The `ranges` argument of `Engine` for a model with this tokenizer: read from the cache, or
    recorded (and cached) when this model was not calibrated before. `cache_dir` None: the user cache."""

    def ranges(engine: Engine) -> list[dict[str, torch.Tensor]]:
        folder = Path(cache_dir) if cache_dir is not None else cache_root()
        source = {"fingerprint": fingerprint(engine), "version": tool_version()}
        path = folder / f"activation-ranges-{source['fingerprint']}.pt"
        cached = _read(path, len(engine.layers), source)
        if cached is not None:
            return cached
        found = record(engine, calibration_prompts(tokenizer))
        _write(path, found, source)
        return found

    return ranges


def _read(path: Path, n_layers: int, source: dict) -> list[dict[str, torch.Tensor]] | None:
    """The ranges kept at `path` if they were recorded for `source` (the engine's fingerprint and this
    version: a file copied under another model's name is a miss) and have this model's shape."""
    try:
        data = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("source") != source:
        return None
    ranges = data.get("ranges")
    if not isinstance(ranges, list) or len(ranges) != n_layers or not all(
            isinstance(d, dict) and set(d) == set(OPS) for d in ranges):
        return None
    return ranges


def _write(path: Path, ranges: list[dict[str, torch.Tensor]], source: dict) -> None:
    """Atomic write; a cache folder that cannot be written only costs recording again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".activation-ranges-")
        with os.fdopen(fd, "wb") as fh:
            torch.save({"source": source, "ranges": ranges}, fh)
        os.replace(tmp, path)
    except OSError:
        pass
