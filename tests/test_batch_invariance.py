"""An item's scores are the same bits whichever batch it runs in: alone, in a batch of 64, in batches of
another budget, row cap and order, at another thread count, its head features too, on the kernel the
engine chooses by default (the ordered GEMM: invariant by construction, `backends/ordered_gemm.py`);
the invariance check (`gemm.batch_invariant`) that tests every entry point the engine calls, and fails
on a kernel planted to change paths; and what the engine line says on each kernel."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from slmclassify.classifier import engine_line
from slmclassify import Classifier, EngineSettings, Task
from slmclassify.backends import gemm
from slmclassify.core.taps import Taps
from slmclassify.backends import ordered_gemm
from slmclassify.models.engines import with_backend
from conftest import kernels_or_skip
from helpers import random_texts

pytestmark = [pytest.mark.isa, kernels_or_skip(ordered_gemm.unavailable())]

TASKS = {"first": Task(labels=("billing", "technical", "account"), mode="first", user_template="Ticket: {text}"),
         "full": Task(labels=("billing", "technical", "account", "accounting"), mode="full",
                      user_template="Ticket: {text}")}
BATCHES = {"one batch of 64": EngineSettings(token_budget=10**6, max_rows=64),
           "budget 200, 5 rows, input order": EngineSettings(token_budget=200, max_rows=5, sort=False),
           "budget 600, 13 rows": EngineSettings(token_budget=600, max_rows=13)}


def _scores(clf, encoded):
    return clf.score(encoded, taps=Taps(last=(1, 2)))


@pytest.mark.parametrize("mode", ["first", "full"])
def test_an_items_scores_are_the_same_bits_in_any_batch(tiny_loaded, mode):
    """The promise on the machine the suite runs on, on the default float32 engine: no skip where it does
    not hold (the ordered GEMM builds here, or the module is skipped, and fails under SLMCLASSIFY_REQUIRE_KERNELS)."""
    assert tiny_loaded.backend.gemm == "ordered"
    assert tiny_loaded.engine.batch_invariant, tiny_loaded.engine.batch_variance()
    texts = random_texts(64, seed=11, max_words=60)
    alone = Classifier(TASKS[mode], model=tiny_loaded, settings=EngineSettings(max_rows=1))
    encoded = alone.encode(texts)
    want = _scores(alone, encoded)
    for name, settings in BATCHES.items():
        got = _scores(alone.variant(settings), encoded)
        assert got.stats.batches != want.stats.batches, name
        np.testing.assert_array_equal(got.scores, want.scores, err_msg=name)
        np.testing.assert_array_equal(got.states, want.states, err_msg=f"head features, {name}")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if before > 1 else 2)  # the service's worker may run at another count
        got = _scores(alone.variant(BATCHES["one batch of 64"]), encoded)
    finally:
        torch.set_num_threads(before)
    np.testing.assert_array_equal(got.scores, want.scores, err_msg="another thread count")
    np.testing.assert_array_equal(got.states, want.states, err_msg="head features, another thread count")


class _Planted(gemm.LinearOp):
    """x @ w in float32, except where `bad(entry point, rows, first row)` says: rounded through float16 there."""

    def __init__(self, w, bad):
        self.w, self.bad, self.out_features = w, bad, w.shape[1]
        self.first = 0

    def _mm(self, x, entry):
        out = x @ self.w
        return out.half().float() if self.bad(entry, x.shape[0], float(x[0, 0])) else out

    def __call__(self, x):
        return self._mm(x, "call")

    def add_scaled_(self, h, x, scale):
        return h.add_(self._mm(x, "add_scaled_"), alpha=scale)


def test_the_check_fails_on_a_kernel_that_changes_paths():
    """Planted kernels, each wrong in one way the check must see: small calls rounded otherwise (the AMD
    EPYC's MKL below 12 rows), only the scaled add of a one-row call (the Intel Xeon's MKL, round 6),
    only a call's last rows (a position-dependent edge tile); a clean one passes."""
    w, cpu = torch.randn(16, 8), torch.device("cpu")
    first_row = float(torch.randn(160, 16, generator=torch.Generator().manual_seed(0))[0, 0])
    assert gemm.batch_invariant(_Planted(w, lambda e, n, x0: False), 16, cpu)
    assert not gemm.batch_invariant(_Planted(w, lambda e, n, x0: n < 12), 16, cpu)
    assert not gemm.batch_invariant(_Planted(w, lambda e, n, x0: e == "add_scaled_" and n == 1), 16, cpu)
    assert gemm.batch_invariant(_Planted(w, lambda e, n, x0: e == "add_scaled_" and n == 1), 16, cpu,
                                points=("call",))  # the old probe's blind spot: the plain call alone is clean
    assert not gemm.batch_invariant(_Planted(w, lambda e, n, x0: n < 160 and x0 != first_row), 16, cpu)


@pytest.mark.parametrize("shape", [(96, 200), (37, 50), (300, 33), (576, 960)])
def test_the_ordered_gemm_passes_the_check_on_every_entry_point(shape):
    """Every entry point (product, residual add, scaled add, normed, normed SwiGLU), odd shapes (edge
    tiles in both directions), K over one packed chunk (300 > 128), a bias; and the output layer on a
    transposed [vocab, hidden] weight."""
    cpu = torch.device("cpu")
    weight = torch.randn(*shape) * 0.1
    assert gemm.batch_invariant(gemm.OrderedLinear(weight, None, torch.float32), shape[0], cpu)
    assert gemm.batch_invariant(gemm.OrderedLinear(weight, torch.randn(shape[1]), torch.float32), shape[0], cpu)
    head = torch.randn(1000, shape[0]) * 0.1
    assert gemm.batch_invariant(gemm.output_layer("ordered", head), shape[0], cpu, points=("call",))


def test_a_row_alone_is_the_same_bits_anywhere_in_a_large_call():
    """A row alone against the same row at every 97th place of a 1,000-row call: edge tiles, full tiles,
    the blocks each thread takes."""
    weight, x = torch.randn(200, 300) * 0.1, torch.randn(1000, 200)
    op = gemm.OrderedLinear(weight, None, torch.float32)
    full, h = op(x), torch.randn(1000, 300)
    added = op.add_scaled_(h.clone(), x, 0.7)
    for i in range(0, 1000, 97):
        assert torch.equal(op(x[i : i + 1]), full[i : i + 1]), i
        assert torch.equal(op.add_scaled_(h[i : i + 1].clone(), x[i : i + 1], 0.7), added[i : i + 1]), i


def test_the_engine_line_says_whether_scores_depend_on_the_batch(tiny_loaded, monkeypatch):
    """The `engine:` line says batch-invariant on the default engine, and why not on every other kernel:
    a vendor float32 kernel asked for, an int8 kernel whose rows share a quantisation range, bf16; an
    ordered GEMM that failed its check here says so."""
    clf = Classifier(TASKS["first"], model=tiny_loaded)
    assert dict(tiny_loaded.backend.invariant) == {"ordered": True, "lm_head": True}
    assert "; batch-invariant (an item's scores are the same bits in any batch)" in engine_line(clf)
    backend = tiny_loaded.backend
    pinned = dataclasses.replace(backend, gemm="mm")
    assert pinned.gemm_variance() == ("the mm GEMM orders its sums by the call's shape on this CPU "
                                      "(asked for by SLMCLASSIFY_FP32_KERNEL)")
    mm = with_backend(tiny_loaded, pinned)
    assert f"; not batch-invariant: {pinned.gemm_variance()}" in engine_line(Classifier(TASKS["first"], model=mm))
    shared = dataclasses.replace(backend, precision="int8", gemm="int8-onednn")
    assert shared.gemm_variance() == "the int8-onednn GEMM shares one quantisation range across a call's rows"
    assert dataclasses.replace(backend, precision="bf16", gemm="bf16").gemm_variance().startswith(
        "the bf16 GEMM orders its sums by the call's shape")
    failed = dataclasses.replace(backend, invariant=(("lm_head", True), ("ordered", False)))
    assert failed.gemm_variance().startswith("the ordered GEMM failed its invariance check here (ordered)")
    assert dataclasses.replace(backend, invariant=()).gemm_variance() is None  # by construction, unchecked
