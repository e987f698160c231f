"""An item's scores are the same bits whichever batch it runs in: alone, in a batch of 64, in batches of
another budget, row cap and order, its head features too; the kernels' invariance probe
(`gemm.invariant_rows`) and the padding that makes small calls take the invariant path (`gemm.PaddedRows`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from slmclassify import Classifier, EngineSettings, Task
from slmclassify.backends import gemm
from slmclassify.core.taps import Taps
from slmclassify.backends.choice import int8_candidates
from slmclassify.backends.device import Backend, cpu_native
from slmclassify.models.engines import with_backend
from helpers import random_texts

TASKS = {"first": Task(labels=("billing", "technical", "account"), mode="first", user_template="Ticket: {text}"),
         "full": Task(labels=("billing", "technical", "account", "accounting"), mode="full",
                      user_template="Ticket: {text}")}
BATCHES = {"one batch of 64": EngineSettings(token_budget=10**6, max_rows=64),
           "budget 200, 5 rows, input order": EngineSettings(token_budget=200, max_rows=5, sort=False),
           "budget 600, 13 rows": EngineSettings(token_budget=600, max_rows=13)}


def kernels() -> list[str]:
    """The kernels of this machine: the exact float32 ones and, where the CPU runs it, int8's."""
    found = ["mm"] + (["onednn"] if torch.backends.mkldnn.is_available() else [])
    return found + (int8_candidates() if cpu_native("int8") else [])


def backend_of(loaded, kernel: str) -> Backend:
    precision = "int8" if kernel.startswith("int8") else "fp32"
    return dataclasses.replace(loaded.backend, precision=precision, gemm=kernel)


@pytest.mark.parametrize("kernel", kernels())
@pytest.mark.parametrize("mode", ["first", "full"])
def test_an_items_scores_are_the_same_bits_in_any_batch(tiny_loaded, kernel, mode):
    backend = backend_of(tiny_loaded, kernel)
    if kernel not in dict(backend.invariant):
        pytest.skip(f"{kernel} was not timed on this machine")
    model = tiny_loaded if backend == tiny_loaded.backend else with_backend(tiny_loaded, backend)
    if not model.engine.batch_invariant:  # the engine line says so; a resumed run keeps its schedule then
        pytest.skip(f"not batch-invariant here: {model.engine.batch_variance()}")
    texts = random_texts(64, seed=11, max_words=60)
    alone = Classifier(TASKS[mode], model=model, settings=EngineSettings(max_rows=1))
    encoded = alone.encode(texts)
    want = alone.score(encoded, taps=Taps(last=(1, 2))) if backend.precision == "fp32" else alone.score(encoded)
    for name, settings in BATCHES.items():
        clf = alone.with_settings(settings)
        got = clf.score(encoded, taps=Taps(last=(1, 2))) if backend.precision == "fp32" else clf.score(encoded)
        assert got.stats.batches != want.stats.batches, name
        np.testing.assert_array_equal(got.scores, want.scores, err_msg=f"{kernel}, {name}")
        if backend.precision == "fp32":
            np.testing.assert_array_equal(got.states, want.states, err_msg=f"{kernel} head features, {name}")


def test_the_probe_finds_where_a_kernel_stops_changing_its_path():
    """A planted kernel that rounds otherwise below 5 rows and at 9 rows is invariant from 10; one that
    never settles within `MAX_PADDED_ROWS` is not invariant; a row-by-row kernel is invariant from 1."""
    w = torch.randn(16, 8)

    def path_changes(bad):
        return lambda x: (x @ w) + (1e-3 if bad(x.shape[0]) else 0.0)

    assert gemm.invariant_rows(path_changes(lambda n: n < 5 or n == 9), 16, torch.device("cpu")) == 10
    assert gemm.invariant_rows(path_changes(lambda n: n < 40), 16, torch.device("cpu")) is None
    assert gemm.invariant_rows(lambda x: torch.stack([row @ w for row in x]), 16, torch.device("cpu")) == 1


def test_padded_calls_give_small_calls_the_big_calls_bits():
    """`mm` padded to its probed rows: every call of 1 .. 40 rows gives each row the bits of one
    160-row call, for the product, the residual add, the scaled add and the normed products."""
    weight = torch.randn(96, 200) * 0.1
    rows = gemm.invariant_rows(lambda x: gemm.MmLinear(weight, None, torch.float32)(x), 96, torch.device("cpu"))
    assert rows is not None
    op = gemm.PaddedRows(gemm.MmLinear(weight, None, torch.float32), rows) if rows > 1 else gemm.MmLinear(
        weight, None, torch.float32)
    x, h = torch.randn(160, 96), torch.randn(160, 200)
    full = {"call": op(x), "add": op.add_(h.clone(), x), "scaled": op.add_scaled_(h.clone(), x, 0.3),
            "normed": op.normed(x, 1e-6)}
    for n in range(1, 41):
        assert torch.equal(op(x[:n]), full["call"][:n]), n
        assert torch.equal(op.add_(h[:n].clone(), x[:n]), full["add"][:n]), n
        assert torch.equal(op.add_scaled_(h[:n].clone(), x[:n], 0.3), full["scaled"][:n]), n
        assert torch.equal(op.normed(x[:n], 1e-6), full["normed"][:n]), n


def test_the_engine_line_says_whether_scores_depend_on_the_batch(tiny_loaded):
    """The `engine:` line says batch-invariant, or why not: an int8 kernel whose rows share a quantisation
    range, a GEMM not probed, torch's attention."""
    clf = Classifier(TASKS["first"], model=tiny_loaded)
    assert tiny_loaded.backend.invariant and "lm_head" in dict(tiny_loaded.backend.invariant)
    line = clf.engine_line()
    if tiny_loaded.engine.batch_invariant:
        assert "; batch-invariant (an item's scores are the same bits in any batch)" in line
    else:
        assert f"; not batch-invariant: {tiny_loaded.engine.batch_variance()}" in line
    shared = dataclasses.replace(tiny_loaded.backend, precision="int8", gemm="int8-onednn")
    assert shared.gemm_variance() == "the int8-onednn GEMM shares one quantisation range across a call's rows"
    assert dataclasses.replace(tiny_loaded.backend, invariant=()).gemm_variance() is None
    assert dataclasses.replace(tiny_loaded.backend, invariant=()).invariant_rows("mm") == 1
