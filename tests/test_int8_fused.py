"""The int8-fused op (`backends/int8_kernels.py` around oneDNN's int8 GEMM) and int8-maddubs (the
same arithmetic in this package's AVX2 GEMM, for CPUs without VNNI): x @ w within int8's error,
exactly the arithmetic they claim (asymmetric per-token activations, per-output-channel weights,
smoothing, float32 outlier channels, the RMSNorm folded into the row scale), on awkward shapes too,
the eager path when no compiler is there (and the engine line saying so), and the engine against
the float32 reference on the tiny Llama and Qwen2 models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slmclassify import Classifier
from slmclassify.backends import choice, fp32_kernels, gemm, int8_kernels, native
from slmclassify.backends.smoothing import Smoothing
from slmclassify.models.prepare import load_model
from slmclassify.models.precision import agreement

from conftest import kernels_or_skip
from helpers import BACKEND_TASK, random_texts

pytestmark = (pytest.mark.skipif(gemm.int8_engine() is None, reason="this PyTorch has no quantized CPU engine")
              if gemm.int8_engine() is None
              else kernels_or_skip((int8_kernels.unavailable() or "not loaded") if int8_kernels.load() is None else None))
# Every test here but the damaged-library one runs again under `make test`'s ISA caps (the `isa` mark,
# Makefile): a damaged library is found by its recorded SHA-256 whatever the CPU.


FUSED = ["int8-fused", pytest.param("int8-maddubs", marks=pytest.mark.skipif(
    not int8_kernels.has_maddubs(int8_kernels.load()), reason="int8-maddubs needs AVX2"))]
"""The C-fused int8 ops: the same arithmetic around two GEMMs."""


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _smoothing(n_in: int, n_out: int) -> Smoothing:
    torch.manual_seed(3)
    s = torch.rand(n_in) * 4 + 0.25
    return Smoothing(rows=s, inv_in=1 / s, cols=torch.rand(n_out) + 0.5, outliers=torch.tensor([1, 7]))


def _emulated(w, bias, smooth, x, kernel="int8-fused"):
    """The fused op's arithmetic in plain PyTorch: per-token asymmetric int8 of x / s over the row's
    own range (outlier channels apart, in float32), per-output-channel symmetric int8 of s w / cols;
    int32-exact products."""
    w = w * smooth.rows[:, None] / smooth.cols[None]
    bias = bias / smooth.cols
    xs = x * smooth.inv_in
    outl = smooth.outliers
    exact_part = xs[:, outl] @ w[outl]
    xs, w = xs.index_fill(1, outl, 0.0), w.index_fill(0, outl, 0.0)
    lo, hi = xs.amin(1, keepdim=True).clamp_max(0), xs.amax(1, keepdim=True).clamp_min(0)
    rscale = (hi - lo) / 255
    zero = torch.round(lo / rscale)
    col = w.abs().amax(0, keepdim=True) / gemm.int8_weight_levels(kernel)  # 63 where 127 would saturate
    qx, qw = (torch.round(xs / rscale) - zero).clamp(0, 255), torch.round(w / col)  # uint8 activations
    return ((qx + zero).double() @ qw.double()).float() * col * rscale + exact_part + bias


@pytest.mark.isa
@pytest.mark.parametrize("kernel", FUSED)
def test_fused_op_is_the_claimed_arithmetic_and_close_to_x_w(kernel):
    torch.manual_seed(0)
    w, bias, x = torch.randn(48, 40) * 0.1, torch.randn(40), torch.randn(13, 48)
    x[:, 7] *= 50  # an outlier channel, computed in float32 apart
    smooth = _smoothing(48, 40)
    op = gemm.KERNELS[kernel](w, bias, torch.float32, smooth)
    got = op(x)
    torch.testing.assert_close(got, _emulated(w, bias, smooth, x, kernel), rtol=1e-5, atol=1e-5)
    exact = (x @ w + bias) / smooth.cols
    assert float((got - exact).abs().max() / exact.abs().max()) < 0.02
    h = torch.randn(13, 40)
    torch.testing.assert_close(op.add_(h.clone(), x), h + got, rtol=1e-5, atol=1e-5)
    wide = torch.randn(13, 96)[:, 10:58]  # rows with a stride (down's input is a view of gate_up)
    torch.testing.assert_close(op(wide), op(wide.contiguous()), rtol=0, atol=0)


@pytest.mark.isa
@pytest.mark.parametrize("kernel", FUSED)
def test_normed_folds_the_rms_into_the_row_scale(kernel):
    """normed(h) quantises h itself: per-token int8 does not see a per-row factor, so the result
    equals op(rms_norm(h)) up to float32 rounding, and the eager op's `normed` alike."""
    torch.manual_seed(1)
    w, bias, h = torch.randn(48, 40) * 0.1, torch.randn(40), torch.randn(9, 48) * 5
    smooth = _smoothing(48, 40)
    op = gemm.KERNELS[kernel](w, bias, torch.float32, smooth)
    torch.testing.assert_close(op.normed(h, 1e-6), op(gemm.rms_norm(h, 1e-6)), rtol=1e-4, atol=1e-4)
    eager = gemm.KERNELS[gemm.int8_engine()](w, bias, torch.float32, smooth)
    exact = (gemm.rms_norm(h, 1e-6) @ w + bias) / smooth.cols
    for got, used in ((op.normed(h, 1e-6), kernel), (eager.normed(h, 1e-6), gemm.int8_engine())):
        # measured 0.024 with 8-bit weights, 0.041 with 7-bit ones (no VNNI: `gemm.int8_weight_levels`)
        bound = 0.04 if gemm.int8_weight_levels(used) == 127 else 0.06
        assert float((got - exact).abs().max() / exact.abs().max()) < bound


@pytest.mark.isa
@pytest.mark.parametrize("d", [5, 31, 32, 33, 96, 577])
def test_quantise_is_exactly_the_claimed_rounding_on_every_width(d):
    """The quantise pass (32 columns at a time in registers with AVX2, the rest a plain loop) gives
    exactly q = clamp(rint(x * mult * (1 / scale)) - zero, 0, 255) per row, on widths below, at and
    past one 32-column step, with outlier channels, a row stride, and a row of zeros."""
    torch.manual_seed(5)
    lib = int8_kernels.load()
    x = torch.randn(7, d + 3)[:, 1:1 + d] * torch.tensor([1.0, 3.0, 0.01, 100.0, 1.0, 0.5, 1.0])[:, None]
    x[4] = 0.0
    mult = torch.rand(d) + 0.5
    outl = torch.tensor([0, d - 1]) if d > 2 else None
    om = torch.tensor([2.0, 3.0]) if outl is not None else None
    if outl is not None:
        mult[outl] = 0.0
    q, rows, values = int8_kernels.quantise(lib, x, mult, 1e-6, outl, om)
    v = x * mult
    lo, hi = v.amin(1).clamp_max(0), v.amax(1).clamp_min(0)
    scale = ((hi - lo) / 255).clamp_min(1e-30)
    s = 1 / scale
    zero = torch.round(lo * s)
    expected = (torch.round(v * s[:, None]) - zero[:, None]).clamp(0, 255).to(torch.uint8)
    assert torch.equal(q, expected)
    rfac = torch.rsqrt(x.square().mean(1) + 1e-6)
    torch.testing.assert_close(rows[0], scale * rfac, rtol=1e-5, atol=0)
    assert torch.equal(rows[1], zero)
    if outl is not None:
        torch.testing.assert_close(values, x[:, outl] * om * rfac[:, None], rtol=1e-5, atol=0)


@pytest.mark.isa
def test_without_a_compiler_int8_runs_the_eager_path_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(int8_kernels.LIBRARY, "_built", {})  # forget this process's compiled libraries
    monkeypatch.setattr(fp32_kernels.LIBRARY, "_built", {})
    monkeypatch.setenv(native.COMPILER_ENV, "no-such-compiler-here")
    assert int8_kernels.load() is None
    assert "no C compiler found" in int8_kernels.unavailable()
    assert choice.int8_candidates() == [gemm.int8_engine()]
    rates = {"mm": 100.0, "onednn": 90.0, gemm.int8_engine(): 120.0}
    backend = choice.Backend(device=torch.device("cpu"), precision="int8",
                             gemm=choice.kernel_for("int8", torch.device("cpu"), int8_kernel=choice.int8_choice(rates)))
    assert backend.gemm == gemm.int8_engine()
    missing = f"no C compiler found (install gcc, or name one in {native.COMPILER_ENV})"
    arithmetic = gemm.int8_arithmetic(gemm.int8_engine())
    assert backend.describe() == (f"cpu int8 ({gemm.int8_engine()} GEMM; {arithmetic}; eager int8 passes: {missing}; "
                                  f"torch attention ({missing}))")
    # a choice cached where a compiler was does not pick the fused op here
    assert choice.kernel_for("int8", torch.device("cpu"), int8_kernel="int8-fused") == gemm.int8_engine()
    with pytest.raises(Exception, match="int8-fused kernel cannot run here"):
        gemm.KERNELS["int8-fused"](torch.randn(8, 4), None, torch.float32)


@pytest.mark.isa
def test_the_faster_int8_kernel_is_chosen_and_cached(llama_dir):
    loaded = load_model(str(llama_dir), device="cpu", precision="int8")
    rates = loaded.gemm_rates
    candidates = choice.int8_candidates()
    assert {"int8-fused", gemm.int8_engine()} <= set(candidates) <= set(rates["rates"])
    faster = max(candidates, key=lambda k: rates["rates"][k])
    assert rates["int8"] == faster == loaded.backend.gemm
    assert load_model(str(llama_dir), device="cpu", precision="int8").gemm_rates["int8"] == faster


@pytest.mark.isa
@pytest.mark.parametrize("kernel", FUSED)
def test_fused_engine_matches_the_float32_reference(tiny_model_dir, kernel, monkeypatch):
    """The whole engine with the fused op (smoothing from recorded ranges, normed qkv and gate_up)
    against the Hugging Face float32 forward: int8's error, not a wrong kernel's (tens)."""
    monkeypatch.setattr(choice, "int8_candidates", lambda: [kernel])
    clf = Classifier(BACKEND_TASK, model=load_model(str(tiny_model_dir), device="cpu", precision="int8"))
    assert clf.engine.backend.gemm == kernel
    agree, worst = 0, 0.0
    for seed in (5, 6, 7):  # 72 items: the tiny random models' label margins are small
        encoded = clf.encode(random_texts(24, seed=seed))
        fast, ref = clf.score(encoded).scores, clf.reference(encoded, range(24))
        agree += agreement(fast, ref).agree
        worst = max(worst, float(np.abs(fast - ref).max()))
    assert 1e-3 < worst <= 1.5 and agree >= 66, (agree, worst)  # measured 70/72 on Llama and Qwen2 (the eager op 70)


@pytest.mark.isa
@pytest.mark.parametrize("kernel", FUSED)
def test_fused_swiglu_is_silu_gate_times_up(kernel):
    """gate_up's one-pass dequantise + silu(gate) * up (its own exp) against the op's output and
    torch's silu: float32 rounding apart."""
    torch.manual_seed(2)
    w, bias, h = torch.randn(48, 2 * 40) * 0.3, torch.randn(2 * 40), torch.randn(11, 48) * 3
    op = gemm.KERNELS[kernel](w, bias, torch.float32, _smoothing(48, 2 * 40))
    gate, up = op.normed(h, 1e-6).chunk(2, dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    got = op.normed_swiglu(h, 1e-6)
    assert got.shape == (11, 40)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # exp's clamps: no inf, no nan; 19 values: the vector lanes (8 or 16) and the scalar tail
    big = torch.tensor([[-200.0, -80.0, -1.0, 0.0, 1.0, 80.0, 200.0, -3.5, 2.25, -0.5, 0.75, 5.0, -7.0, 12.0,
                         -20.0, 30.0, 0.1, -0.1, 88.5]])
    width = big.shape[1]
    rows = torch.tensor([[1.0], [0.0]])  # scale 1, zero 0
    if kernel == "int8-fused":
        acc = torch.cat([big, torch.ones_like(big)], dim=1)
        out = int8_kernels.swiglu_(op.lib, acc, rows, torch.zeros(2 * width), None, None, None)
    else:  # gate_j = 1 * big_j (the column scale), up_j = 0 + 1 (the bias)
        eye = torch.zeros(2 * width, width, dtype=torch.int8)
        eye[torch.arange(width), torch.arange(width)] = 1
        weight = int8_kernels.MaddubsWeight(op.lib, eye, paired=True)
        cols, zeros, ones = weight.columns, torch.zeros(width), torch.ones(width)
        out = int8_kernels.maddubs_(weight, torch.empty(1, width), torch.ones(1, weight.kp, dtype=torch.uint8), rows,
                                    cols(torch.cat([big[0], zeros])), cols(torch.zeros(2 * width)),
                                    cols(torch.cat([zeros, ones])), None, None, "swiglu")
    torch.testing.assert_close(out, torch.nn.functional.silu(big), rtol=1e-6, atol=1e-6)


@pytest.mark.isa
@pytest.mark.skipif(not int8_kernels.has_maddubs(int8_kernels.load()), reason="int8-maddubs needs AVX2")
@pytest.mark.parametrize("n_in, n_out, n", [(50, 37, 13), (48, 2 * 20, 7), (8, 16, 1), (100, 2 * 44, 40)])
def test_maddubs_on_awkward_shapes_is_the_claimed_arithmetic(n_in, n_out, n):
    """Inputs not a multiple of 4 wide (zero-padded), outputs not a multiple of 16 (odd, or [gate | up]
    halves not a multiple of 8), row counts not a multiple of its 4-row (ymm) or 6-row (zmm) tiles, a strided input:
    every mode (set, add, swiglu) is `_emulated` within float32 rounding, and the kernel reads and
    writes nothing outside its rows (the neighbouring columns of a wider output stay as they were)."""
    torch.manual_seed(4)
    w, bias = torch.randn(n_in, n_out) * 0.1, torch.randn(n_out)
    smooth = _smoothing(n_in, n_out)
    op = gemm.KERNELS["int8-maddubs"](w, bias, torch.float32, smooth)
    x = torch.randn(n, n_in + 6)[:, 3:3 + n_in]  # a view with a row stride
    x[:, 7] *= 50
    expected = _emulated(w, bias, smooth, x, "int8-maddubs")
    torch.testing.assert_close(op(x), expected, rtol=1e-5, atol=1e-5)
    wide = torch.randn(n, n_out + 5)
    h = wide[:, 2:2 + n_out]
    before = wide.clone()
    op.add_(h, x)
    torch.testing.assert_close(h, before[:, 2:2 + n_out] + expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(wide[:, :2], before[:, :2]) and torch.equal(wide[:, 2 + n_out:], before[:, 2 + n_out:])
    if n_out % 2 == 0:
        gate, up = op.normed(x, 1e-6).chunk(2, dim=-1)
        torch.testing.assert_close(op.normed_swiglu(x, 1e-6), torch.nn.functional.silu(gate) * up,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.isa
def test_compiled_library_is_kept_per_cpu(tmp_path, monkeypatch):
    """-march=native: a library built on one CPU is not loaded on another sharing the cache folder."""
    built = []
    for cpu in ("cpu A flags avx2", "cpu B flags avx2 avx512f"):
        monkeypatch.setattr(native, "cpu_identity", lambda cpu=cpu: cpu)
        lib, why = int8_kernels.LIBRARY.build(tmp_path, native.compile_flags())
        assert lib is not None, why
        built.append(sorted(p.name for p in (tmp_path / "kernels").glob("*.so")))
    assert len(built[0]) == 1 and len(built[1]) == 2


@pytest.mark.isa
def test_maddubs_is_timed_only_where_onednn_needs_7_bit_weights(monkeypatch):
    """With VNNI or AMX oneDNN's int8 keeps 8-bit weights (more accurate), so int8-maddubs is not even
    timed; without them both have 7-bit weights and the faster is kept. The engine line names it."""
    built = int8_kernels.has_maddubs(int8_kernels.load())
    real = gemm.int8_weight_levels
    for fused_levels, offered in ((127, False), (63, built), (None, built)):
        monkeypatch.setattr(gemm, "int8_weight_levels",
                            lambda kernel, levels=fused_levels: levels if kernel == "int8-fused" else real(kernel))
        assert ("int8-maddubs" in choice.int8_candidates()) == offered
    monkeypatch.setattr(gemm, "int8_weight_levels", real)
    if built:
        line = choice.Backend(device=torch.device("cpu"), precision="int8", gemm="int8-maddubs").describe()
        assert line.startswith("cpu int8 (int8-maddubs GEMM; 7-bit weights: this package's int8 GEMM")


BUILD_KERNELS = """
import sys
from pathlib import Path
from slmclassify.backends import fp32_kernels, int8_kernels, native
cache = Path(sys.argv[1])
for library in (int8_kernels.LIBRARY, fp32_kernels.LIBRARY):
    lib, why = library.build(cache, native.compile_flags())
    assert lib is not None, why
print("built", flush=True)
"""

LOAD_KERNEL = """
import sys
from pathlib import Path
from slmclassify.backends import int8_kernels, native
lib, why = int8_kernels.LIBRARY.build(Path(sys.argv[1]), native.compile_flags())
assert lib is not None, why
print("loaded", flush=True)
"""


@pytest.fixture(scope="module")
def built_kernels(tmp_path_factory):
    """A cache folder where a fresh process built the int8 and float32 kernels (once for the module)."""
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("built-kernels")
    first = subprocess.run([sys.executable, "-c", BUILD_KERNELS, str(folder)], capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0 and "built" in first.stdout, first.stderr
    return folder


@pytest.mark.parametrize("damage", ["truncated", "text-bytes-flipped", "another-library"])
def test_a_damaged_compiled_kernel_is_built_again_not_loaded(tmp_path, damage, built_kernels):
    """Before: a kernel library truncated to 4 KB died with a bus error, bytes flipped in its code
    with an illegal instruction or a segmentation fault, another library copied over it with a
    traceback (undefined symbol), at every later start. Now its SHA-256 is recorded at build and
    checked before loading (and every symbol when binding): it is built again. (Each damage on its own
    copy of one build.)"""
    import shutil
    import subprocess
    import sys

    shutil.copytree(built_kernels, tmp_path, dirs_exist_ok=True)
    (target,) = (tmp_path / "kernels").glob("int8-*.so")
    data = bytearray(target.read_bytes())
    if damage == "truncated":
        target.write_bytes(bytes(data[:4096]))
    elif damage == "text-bytes-flipped":
        for i in range(len(data) // 3, len(data) // 3 + 64):
            data[i] ^= 0xFF
        target.write_bytes(bytes(data))
    else:  # another library copied over it
        (other,) = (tmp_path / "kernels").glob("fp32-attention-*.so")
        target.write_bytes(other.read_bytes())
    second = subprocess.run([sys.executable, "-c", LOAD_KERNEL, str(tmp_path)], capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0 and "loaded" in second.stdout, (second.returncode, second.stderr[-2000:])
    assert native._intact(target)
