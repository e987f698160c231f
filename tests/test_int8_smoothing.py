"""Int8 smoothing (SmoothQuant scales, float32 outlier channels) and its activation ranges: exact in
float arithmetic (quantisation replaced by identity), better than plain int8 on inputs with outlier
channels, and the calibration deterministic and cached per model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slmclassify import Classifier, Task
from slmclassify.models import activation_ranges
from slmclassify.backends import choice, gemm, smoothing
from slmclassify.backends.smoothing import Smoothing
from slmclassify.core.engine import Engine
from slmclassify.cache import cache_root
from slmclassify.models.prepare import load_model

from helpers import random_texts

pytestmark = [pytest.mark.isa,  # all of it runs again under `make test`'s ISA caps (Makefile)
              pytest.mark.skipif(gemm.int8_engine() is None, reason="this PyTorch has no quantized CPU engine")]
TASK = Task(labels=("billing", "technical", "account", "accounting"), mode="full",
            user_template="Ticket: {text}\nCategory:")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


class _Unquantised(gemm.Int8Linear):
    """The int8 op with its quantisation replaced by identity: every rescaling stays, in float32."""

    def _pack(self, w):
        return w.t().contiguous()

    def _matmul(self, x, packed):
        return torch.mm(x, packed)


def _smoothing(n_in: int, n_out: int, outliers=None, divide=True) -> Smoothing:
    torch.manual_seed(3)
    s = torch.rand(n_in) * 10 + 0.1
    return Smoothing(rows=s, inv_in=1 / s if divide else None, cols=torch.rand(n_out) + 0.5,
                     outliers=None if outliers is None else torch.tensor(outliers))


@pytest.mark.parametrize("outliers", [None, [1, 7]])
def test_smoothed_op_is_exact_without_quantisation(outliers):
    """(x @ w + b) / cols, for an input the op divides itself and for one divided upstream."""
    torch.manual_seed(0)
    w, bias, x = torch.randn(16, 12), torch.randn(12), torch.randn(5, 16)
    for divide in (True, False):
        smooth = _smoothing(16, 12, outliers, divide)
        op = _Unquantised(w, bias, torch.float32, smooth)
        given = x if divide else x / smooth.rows
        torch.testing.assert_close(op(given), (x @ w + bias) / smooth.cols, rtol=1e-5, atol=1e-5)


def test_smoothing_and_outliers_cut_the_error_of_outlier_channels():
    """Two input channels 60x larger than the rest in every token (as in real models): per-token
    int8 spends its levels on them; smoothing moves that range into the weight, outliers skip int8."""
    torch.manual_seed(0)
    w, x = torch.randn(64, 48) * 0.05, torch.randn(32, 64)
    x[:, [5, 40]] *= 60
    exact = x @ w
    act_max = x.abs().amax(0)

    def error(smooth):
        got = gemm.KERNELS[gemm.int8_engine()](w, None, torch.float32, smooth)(x)
        return float((got - exact).abs().max() / exact.abs().max())

    s = smoothing.scales(act_max, w.abs().amax(1), 0.5)
    plain = error(None)
    smoothed = error(Smoothing(rows=s, inv_in=1 / s))
    split = error(Smoothing(rows=torch.ones(64), inv_in=None, outliers=torch.tensor([5, 40])))
    assert smoothed < plain / 2 and split < plain / 2, (plain, smoothed, split)


@pytest.mark.parametrize("outlier_ratio", [None, 1.0])
def test_int8_engine_is_exact_without_quantisation(tiny_model_dir, monkeypatch, outlier_ratio):
    """The whole smoothed int8 engine (scales folded into v and up, divided in the qkv and gate_up
    ops, outlier channels apart) computes the float32 function: within fp32's 1e-4 of the reference."""
    for kernel in choice.int8_candidates():  # whichever the measurement chose
        monkeypatch.setitem(gemm.KERNELS, kernel, _Unquantised)
    monkeypatch.setattr(smoothing, "OUTLIER_RATIO", outlier_ratio)  # 1.0: half of all channels
    plans = []
    real = smoothing.plan_layer
    monkeypatch.setattr("slmclassify.core.engine.arrange.plan_layer", lambda *a, **k: plans.append(real(*a, **k)) or plans[-1])
    clf = Classifier(TASK, model=load_model(str(tiny_model_dir), device="cpu", precision="int8"))
    assert len(plans) == 2 and all((p["qkv"].rows != p["qkv"].rows[0]).any() for p in plans)  # really smoothed
    assert all((p["down"].outliers is not None) == (outlier_ratio is not None) for p in plans)
    encoded = clf.encode(random_texts(12, seed=5))
    fast, ref = clf.score(encoded).scores, clf.reference(encoded, range(12))
    assert np.abs(fast - ref).max() <= 1e-4, f"fast:\n{fast}\nreference:\n{ref}"


def test_ranges_are_deterministic_and_cached(tiny_model_dir, monkeypatch):
    loaded = load_model(str(tiny_model_dir), device="cpu")
    ranges = activation_ranges.ranges_for(loaded.tokenizer)
    first = ranges(Engine(loaded.model))
    assert len(first) == 2 and all(set(r) == set(activation_ranges.OPS) for r in first)
    assert first[0]["qkv"].shape == (64,) and first[0]["down"].shape == (128,)
    files = list(cache_root().glob("activation-ranges-*.pt"))
    assert len(files) == 1
    recorded = activation_ranges.record(Engine(loaded.model), activation_ranges.calibration_prompts(loaded.tokenizer))
    for mine, again in zip(first, recorded):  # recording again gives the very same values
        assert all(torch.equal(mine[name], again[name]) for name in activation_ranges.OPS)

    def no_recording(*args):
        raise AssertionError("recorded again although cached")

    monkeypatch.setattr(activation_ranges, "record", no_recording)
    other = load_model(str(tiny_model_dir), device="cpu")  # a second load of the same model
    cached = activation_ranges.ranges_for(other.tokenizer)(Engine(other.model))
    assert all(torch.equal(a[name], b[name]) for a, b in zip(first, cached) for name in activation_ranges.OPS)


def test_other_weights_are_calibrated_apart(tiny_model_dir):
    loaded = load_model(str(tiny_model_dir), device="cpu")
    before = activation_ranges.fingerprint(Engine(loaded.model))
    assert activation_ranges.fingerprint(Engine(loaded.model)) == before  # arranging twice changes nothing
    with torch.no_grad():
        loaded.model.model.layers[1].mlp.down_proj.weight.mul_(1.5)
    assert activation_ranges.fingerprint(Engine(loaded.model)) != before


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_calibration_prior_is_measured_in_float32(tiny_model_dir, precision):
    """The content-free prior is the float32 engine's in every precision (same weights, no copy),
    while items are still scored in the low precision."""
    if precision == "bf16" and not torch.backends.mkldnn.is_available():
        pytest.skip("no bf16 CPU kernels")
    fp32 = Classifier(TASK, model=load_model(str(tiny_model_dir), device="cpu"))
    low = Classifier(TASK, model=load_model(str(tiny_model_dir), device="cpu", precision=precision))
    assert low.engine.backend.precision == precision and low.engine.exact() is not low.engine
    assert np.abs(low.bias - fp32.bias).max() <= 1e-5, (low.bias, fp32.bias)
    encoded = low.encode(random_texts(6, seed=3))
    assert not np.allclose(low.score(encoded).scores, fp32.score(encoded).scores, atol=1e-6)  # items: low precision
    assert fp32.engine.exact() is fp32.engine
    exact_ops = low.engine.exact().layers[0]
    assert exact_ops.qkv.weight.dtype == torch.float32 and low.engine.layers[0].qkv is not exact_ops.qkv
