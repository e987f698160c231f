"""The float32 C kernels (`backends/fp32_kernels.py`): packed-row attention against a float64
reference written out here (prefix, causal rows, trie masks, GQA, head sizes 8-64, read-only
queries), the fused RMSNorm and SwiGLU passes against torch, the engine with and without them on
tiny random Llama/Qwen2 models, the fallback without a compiler, and an AVX2-only build."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from slmclassify.classifier import engine_line
from slmclassify import Classifier, Task
from slmclassify.backends import fp32_kernels, gemm, native
from slmclassify.backends.device import Backend
from slmclassify.models.prepare import load_model

from conftest import kernels_or_skip
from helpers import random_texts

pytestmark = [pytest.mark.isa,  # all of it runs again under `make test`'s ISA caps (Makefile)
              kernels_or_skip((fp32_kernels.unavailable() or "not loaded") if fp32_kernels.load() is None else None)]

FULL = Task(labels=("billing", "technical", "account", "accounting"), mode="full",
            user_template="Ticket: {text}\nCategory:")
FIRST = Task(labels=("billing", "technical", "account"), mode="first", user_template="Ticket: {text}\nCategory:")


def _reference(qkv, H, starts, lengths, anc, prefix, read_only):
    """What `attend_rows` computes, in float64 with an explicit mask per row."""
    N, heads, D = qkv.shape
    Hkv = (heads - H) // 2
    T = 0 if anc is None else anc.shape[0]
    outs = []
    for b in range(len(starts)):
        L, s = int(lengths[b]), int(starts[b])
        x = qkv[s : s + L + T].double()
        k, v = x[:, H : H + Hkv], x[:, H + Hkv :]
        if prefix is not None:
            k = torch.cat([prefix[0].double().transpose(0, 1), k])
            v = torch.cat([prefix[1].double().transpose(0, 1), v])
        P = k.shape[0] - L - T
        allowed = torch.zeros(L + T, P + L + T, dtype=torch.bool)
        allowed[:, :P] = True
        for i in range(L + T):
            if i < L:
                allowed[i, P : P + i + 1] = True
            else:
                allowed[i, P : P + L] = True
                allowed[i, P + L :] = anc[i - L].bool()
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        scores = torch.einsum("qhd,khd->hqk", x[:, :H], k) / math.sqrt(D)
        out = torch.einsum("hqk,khd->qhd", scores.masked_fill(~allowed[None], -math.inf).softmax(-1), v)
        outs.append(out[L - 1 :] if read_only else out)
    return torch.cat(outs).float()


def _rows(H, Hkv, D, T, P, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 1, 17, 33, 2, 70], dtype=torch.int64)
    starts = torch.cumsum(lengths + T, 0) - (lengths + T)
    qkv = torch.randn(int((lengths + T).sum()), H + 2 * Hkv, D, generator=gen)
    anc = None
    if T:  # node 0 a root, node t's parent t - 1 for odd t, else node 0
        anc = torch.eye(T, dtype=torch.uint8)
        for t in range(1, T):
            anc[t, t - 1 if t % 2 else 0] = 1
    prefix = (torch.randn(Hkv, P, D, generator=gen), torch.randn(Hkv, P, D, generator=gen)) if P else None
    return qkv, starts, lengths, anc, prefix


@pytest.mark.parametrize("H, Hkv, D, T, P", [(9, 3, 64, 0, 28), (9, 3, 64, 5, 28), (4, 2, 16, 3, 0), (4, 4, 24, 0, 7),
                                             (8, 2, 8, 4, 5), (3, 1, 16, 0, 0), (2, 1, 128, 2, 40)])
@pytest.mark.parametrize("read_only", [False, True])
def test_attend_rows_matches_reference(H, Hkv, D, T, P, read_only):
    qkv, starts, lengths, anc, prefix = _rows(H, Hkv, D, T, P)
    out = fp32_kernels.attend_rows(fp32_kernels.load(), qkv, H, starts, lengths, anc, prefix, read_only)
    ref = _reference(qkv, H, starts, lengths, anc, prefix, read_only)
    assert out.shape == ref.shape
    assert (out - ref).abs().max() <= 5e-6, float((out - ref).abs().max())


def test_fused_passes_match_torch():
    lib = fp32_kernels.load()
    x = torch.randn(37, 72) * 3
    assert torch.allclose(fp32_kernels.rms_norm(lib, x, 1e-5), gemm.rms_norm(x, 1e-5), rtol=1e-5, atol=1e-6)
    wide = torch.randn(37, 100)
    assert torch.allclose(fp32_kernels.rms_norm(lib, wide[:, :72], 1e-5), gemm.rms_norm(wide[:, :72], 1e-5),
                          rtol=1e-5, atol=1e-6)  # rows 100 apart
    gate_up = torch.randn(37, 2 * 50) * 4
    expected = torch.nn.functional.silu(gate_up[:, :50]) * gate_up[:, 50:]
    got = fp32_kernels.swiglu_(lib, gate_up.clone())
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6), float((got - expected).abs().max())


@pytest.mark.parametrize("task", [FULL, FIRST], ids=["trie", "first-token"])
def test_engine_with_and_without_kernels(tiny_model_dir, task, monkeypatch):
    clf = Classifier(task, model=load_model(str(tiny_model_dir), device="cpu", precision="fp32"))
    encoded = clf.encode(random_texts(24, seed=5))
    calls = []
    attend = fp32_kernels.attend_rows
    monkeypatch.setattr(fp32_kernels, "attend_rows", lambda *a: calls.append(a[-1]) or attend(*a))
    fast = clf.score(encoded).scores
    if fp32_kernels.attention_pays(fp32_kernels.load()):  # an AVX2 or AVX-512 build
        assert set(calls) == {False, True}  # every layer but the last, and the last's read-only queries
    monkeypatch.setattr(fp32_kernels, "ENABLED", False)
    calls.clear()
    torch_path = clf.score(encoded).scores
    assert not calls
    ref = clf.reference(encoded, range(24))
    assert np.abs(fast - torch_path).max() <= 2e-5, f"C:\n{fast}\ntorch:\n{torch_path}"
    assert np.abs(fast - ref).max() <= 1e-4, f"C:\n{fast}\nreference:\n{ref}"
    assert (fast.argmax(1) == ref.argmax(1)).all()


def test_no_compiler_falls_back(tiny_model_dir, monkeypatch):
    """Without a compiler float32 runs on a vendor GEMM (the faster of `mm` and oneDNN, measured again: the
    cached measurement chose the ordered GEMM, built then) and torch's attention, and the engine line says the
    scores are not batch-invariant and why."""
    from slmclassify.backends import ordered_gemm

    for library in (fp32_kernels.LIBRARY, ordered_gemm.LIBRARY):
        monkeypatch.setattr(library, "_built", {})  # forget this process's compiled libraries
    monkeypatch.setenv(native.COMPILER_ENV, "")
    assert fp32_kernels.load() is None and ordered_gemm.load() is None
    assert "disabled" in fp32_kernels.unavailable()
    clf = Classifier(FULL, model=load_model(str(tiny_model_dir), device="cpu", precision="fp32"))
    assert not clf.engine.backend.packs_attention(clf.engine.head_dim)
    vendor = clf.engine.backend.gemm
    assert vendor in ("mm", "onednn")  # which is faster is measured: either may win on a busy machine
    assert (f"; not batch-invariant: the {vendor} GEMM orders its sums by the call's shape on this CPU; the ordered GEMM "
            "cannot run here: disabled (SLMCLASSIFY_CC is empty)") in engine_line(clf)
    encoded = clf.encode(random_texts(12, seed=3))
    fast, ref = clf.score(encoded).scores, clf.reference(encoded, range(12))
    assert np.abs(fast - ref).max() <= 1e-4


def test_avx2_only_build(tmp_path):
    """The kernel as an AVX2 machine compiles it (x86-64-v3: AVX2 and FMA, no AVX-512) computes the same."""
    if "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU has no AVX2")
    flags = ("-O3", "-march=x86-64-v3", "-fopenmp", "-shared", "-fPIC")
    lib = fp32_kernels.load(tmp_path, flags)
    assert lib is not None, fp32_kernels.LIBRARY.unavailable(tmp_path, flags)
    built = list((tmp_path / "kernels").glob("fp32-attention-*.so"))
    assert len(built) == 1 and fp32_kernels.attention_pays(lib) and lib.vector_width() == 8
    qkv, starts, lengths, anc, prefix = _rows(9, 3, 64, 5, 28)
    out = fp32_kernels.attend_rows(lib, qkv, 9, starts, lengths, anc, prefix, False)
    assert (out - _reference(qkv, 9, starts, lengths, anc, prefix, False)).abs().max() <= 5e-6
    x = torch.randn(9, 40)
    assert torch.allclose(fp32_kernels.rms_norm(lib, x, 1e-6), gemm.rms_norm(x, 1e-6), rtol=1e-5, atol=1e-6)


def test_the_engine_line_names_the_attention_kernel(monkeypatch):
    backend = Backend(device=torch.device("cpu"), precision="fp32", gemm="mm")
    lib = fp32_kernels.load()
    if lib is None:
        assert backend.describe() == f"cpu fp32 (mm GEMM; torch attention ({fp32_kernels.unavailable()}))"
    elif fp32_kernels.attention_pays(lib):
        assert backend.describe() == "cpu fp32 (mm GEMM; C attention (heads up to 256 wide))"
    else:
        assert backend.describe() == "cpu fp32 (mm GEMM; torch attention (the C kernel needs AVX2))"
    monkeypatch.setattr(fp32_kernels, "ENABLED", False)
    assert backend.describe() == "cpu fp32 (mm GEMM; torch attention (switched off))"
    bf16 = Backend(device=torch.device("cpu"), precision="bf16", gemm="bf16")
    assert bf16.describe() == "cpu bf16 (bf16 GEMM)"  # low-precision attention is torch's
