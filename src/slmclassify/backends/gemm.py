"""Linear-layer kernels: one small op object per weight, called by the engine instead of
`torch.mm(x, w)`. Each computes x @ w (+ bias) for x [N, in] and a weight given as [in, out].

    ordered      float32, this package's own GEMM (`ordered_gemm.py`): every output element summed in one
                 fixed order, so a row's bits never depend on its call; the float32 default where it builds
    mm           float32 `torch.mm` on the weight itself (MKL on CPU, cuBLAS on CUDA); no copy
    onednn       float32 oneDNN with the weight re-packed once into its blocked layout (a copy)
    int8-<eng>   dynamic int8 quantisation (PyTorch's quantized engine <eng>: onednn, x86, fbgemm):
                 weights quantised once per output channel, activations per token per call; output float32;
                 optionally smoothed (SmoothQuant scales, float32 outlier channels: `smoothing.py`)
    int8-fused   the same smoothing and weights, activations asymmetric per token, one C pass each side
                 of oneDNN's prepacked int8 GEMM (`int8_kernels.py`); needs a C compiler at first use
                 (int8 weights use 7 bits where the CPU's int8 kernel would saturate: `int8_weight_levels`)
    int8-maddubs int8-fused's arithmetic with 7-bit weights, the GEMM this package's own (AVX2 or
                 AVX-512 BW, `vpmaddubsw`) with the dequantise pass as its epilogue: CPUs without VNNI
    bf16, fp16   the weight cast once; inputs cast per call; output in that precision

`add_(h, x)` adds the product into the float32 residual stream in place; `normed(h, eps)` computes
rms_norm(h) @ w (+ bias) (the RMSNorm's weight is folded into w by the engine).

Batch invariance: only `ordered` is batch-invariant by construction. The vendor kernels choose their
blocking, and with it the order of every sum, from the call's shape, the thread count and the CPU
(MKL's `mm` on an AMD EPYC: from 12 rows on; on an Intel Xeon with AMX a one-row call with a scale
differs from any larger one; docs/results.md), so a row's last bits follow its batch there, and no
probe run on one CPU says which paths another takes. `batch_invariant` still checks the kernel that
will run, through every entry point the engine calls, at the row and thread counts it uses: a
check of the construction, never a substitute for it.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Sequence
from functools import lru_cache

import torch
import torch.nn.functional as F

from ..errors import TaskError
from ..timing import Side, interleave
from . import fp32_kernels as fp32_passes
from . import int8_kernels, ordered_gemm
from .smoothing import Smoothing, split_weight
from .sync import sync_of


@lru_cache(maxsize=None)
def int8_weight_levels(kernel: str) -> int | None:
    """The largest |int8 weight| with which `kernel` multiplies exactly on this CPU (probed once).

    127 (8-bit weights) with VNNI or AMX, which add u8 x s8 products in 32 bits. Without them
    (AVX2-only CPUs such as AMD Zen 2/3, AVX-512 without VNNI such as Skylake servers) oneDNN adds
    pairs of products in 16 bits (`vpmaddubsw`), which saturates for full-range values: 2 * 255 * 127
    > 32767. With 7-bit weights (|w| <= 63) no pair can: 2 * 255 * 63 = 32130. None where neither
    is exact: int8 is then refused here (`check_int8`).
    """
    for levels in (127, 63):
        try:
            exact = _int8_exact(kernel, levels)
        except RuntimeError:  # the kernel does not run at all here (e.g. no oneDNN int8 ops on this CPU)
            return None
        if exact:
            return levels
    return None


def _int8_exact(kernel: str, levels: int) -> bool:
    """Whether `kernel`'s int8 GEMM gives the exact integer product of full-range activations and
    weights within ±`levels` (the fused op's uint8 activations 0..255; the eager op's -128..127
    quantise to themselves: scale 1, zero point 128)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-128, 128, (64, 256), generator=g)  # [N, K]
    x[0], x[1, ::2], x[1, 1::2] = 127, -128, 127  # the extremes, in pairs
    w = torch.randint(-levels, levels + 1, (96, 256), generator=g)  # [M, K]
    w[0], w[1] = levels, -levels
    if kernel == "int8-maddubs":
        x = (x + 128).to(torch.uint8)  # its activations are uint8
        lib = int8_kernels.load()
        if not int8_kernels.has_maddubs(lib):
            raise RuntimeError("int8-maddubs is not built here")
        weight = int8_kernels.MaddubsWeight(lib, w.to(torch.int8), paired=False)
        ones, zeros = weight.columns(torch.ones(96)), weight.columns(torch.zeros(96))
        got = int8_kernels.maddubs_(weight, torch.empty(64, 96), x, torch.stack([torch.ones(64), torch.zeros(64)]),
                                    ones, zeros, None, None, None, "set")
        exact = x.double() @ w.double().t()
    elif kernel == "int8-fused":
        x = x + 128  # its activations are uint8
        exact = x.double() @ w.double().t()  # below 2**24: exact in float32 too
        packed = torch.ops.onednn.qlinear_prepack(w.to(torch.int8), None)
        got = torch.ops.onednn.qlinear_pointwise(x.to(torch.uint8), 1.0, 0, packed, torch.ones(96),
                                                 torch.zeros(96, dtype=torch.long), None, 1.0, 0, torch.float32,
                                                 "none", [], "")
    else:
        exact = x.double() @ w.double().t()
        previous = torch.backends.quantized.engine
        try:
            torch.backends.quantized.engine = kernel.removeprefix("int8-")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                q = torch.quantize_per_channel(w.float(), torch.ones(96, dtype=torch.double),
                                               torch.zeros(96, dtype=torch.long), 0, torch.qint8)
                got = torch.ops.quantized.linear_dynamic(x.float(), torch.ops.quantized.linear_prepack(q, None), False)
        finally:
            torch.backends.quantized.engine = previous
    return bool(torch.equal(got.double(), exact))


def int8_arithmetic(kernel: str) -> str:
    """How `kernel` multiplies here, for the engine line."""
    levels = int8_weight_levels(kernel)
    if levels == 127:
        return "8-bit weights"
    if levels == 63 and kernel == "int8-maddubs":
        return "7-bit weights: this package's int8 GEMM, products added in pairs in 16 bits (vpmaddubsw; no VNNI)"
    if levels == 63:
        return "7-bit weights: this CPU's int8 kernel adds products in 16 bits (no VNNI)"
    return "not exact here"


def check_int8(kernel: str) -> int:
    """`int8_weight_levels(kernel)`; raises where `kernel` cannot multiply int8 exactly on this CPU (None)."""
    levels = int8_weight_levels(kernel)
    if levels is None:
        raise TaskError(f"precision int8 cannot run on this CPU: its int8 kernel ({kernel}) does not run here or "
                        f"is not exact even with 7-bit weights; use precision fp32 (or bf16 where the CPU has it)")
    return levels


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without its weight (folded into the next projection: `core/engine/arrange.py`'s `_take_norm`).

    One fused reduction (the vector norm) and one multiply: faster than F.rms_norm on CPU.
    """
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # [N, 1]
    return x * norm.square_().div_(x.shape[-1]).add_(eps).rsqrt_()


def swiglu_(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up [N, I] for gate_up [N, 2I] = [gate | up], written over the gate half."""
    gate, up = gate_up.chunk(2, dim=-1)  # [N, I] each
    return F.silu(gate, inplace=True).mul_(up)


class LinearOp:
    """x @ w (+ bias) for x [N, in]."""

    out_features: int
    rows_apart: bool = True
    """Whether each row's arithmetic is its own (False: a call's rows share something, such as one
    quantisation range, so a row's result depends on the others whatever the number of rows)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def add_(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """h += x @ w (+ bias), in place; returns h."""
        return h.add_(self(x))

    def add_scaled_(self, h: torch.Tensor, x: torch.Tensor, scale: float) -> torch.Tensor:
        """h += scale * (x @ w (+ bias)), in place (Granite's residual multiplier); returns h."""
        return h.add_(self(x), alpha=scale)

    def normed(self, h: torch.Tensor, eps: float) -> torch.Tensor:
        """rms_norm(h, eps) @ w (+ bias) for the residual stream h [N, in]."""
        return self(rms_norm(h, eps))

    def normed_swiglu(self, h: torch.Tensor, eps: float) -> torch.Tensor:
        """silu(gate) * up [N, I] for [gate | up] = rms_norm(h, eps) @ w (+ bias) (gate_up's weight).
        The result may be a view of this thread's `scratch` buffer: consumed before the next call."""
        return swiglu_(self.normed(h, eps))


PROBE_ROWS = (1, 2, 3, 4, 5, 7, 8, 11, 12, 13, 16, 17, 31, 33, 64, 100)
"""Row counts the invariance check calls an op with, each as the first and as the last rows of one
larger call: small counts, where vendor GEMMs change paths (MKL on 2 threads: 1-3, 5-7 and 9-11 rows
on an AMD EPYC), and counts on both sides of the ordered GEMM's tile edges (8 rows with AVX-512, 4
with AVX2)."""
PROBE_BASE = 160
"""Rows of that larger call: more than a GEMM takes at the smallest path-changing sizes seen."""


def entry_points(op: LinearOp) -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """{name: f(x [N, in], h [N, out]) -> [N, ...]}: every way the engine calls a linear op
    (`core/engine/forward.py`), each on fresh copies (an in-place add must not see another's output)."""
    points = {"call": lambda x, h: op(x),
              "add_": lambda x, h: op.add_(h.clone(), x),
              "add_scaled_": lambda x, h: op.add_scaled_(h.clone(), x, 0.3),
              "normed": lambda x, h: op.normed(x, 1e-6)}
    if op.out_features % 2 == 0:  # [gate | up]: its result may be a view of a reused buffer
        points["normed_swiglu"] = lambda x, h: op.normed_swiglu(x, 1e-6).clone()
    return points


def batch_invariant(op: LinearOp, in_features: int, device: torch.device, base: int = PROBE_BASE,
                    rows: Sequence[int] = PROBE_ROWS, points: Sequence[str] | None = None) -> bool:
    """Whether every entry point of `op` (`entry_points`, or those named in `points`) gives each row
    the bits one `base`-row call gives it: each of `rows` as the first and as the last rows of that
    call, at every thread count a call may run with here (`probe_threads`), the large call itself
    at each. Seeded inputs of ±1-scale values. A check of what runs, with the engine's own calls:
    it can fail (tests plant a kernel that changes paths), but passing it on one CPU says nothing of
    another's paths; only a construction does (`ordered_gemm`)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(base, in_features, generator=g).to(device)
    h = torch.randn(base, op.out_features, generator=g).to(device)
    calls = {k: f for k, f in entry_points(op).items() if points is None or k in points}
    before = torch.get_num_threads()
    try:
        with torch.inference_mode():
            full = {}
            for threads in probe_threads(device):
                torch.set_num_threads(threads)
                for name, f in calls.items():
                    big = f(x, h)
                    if full.setdefault(name, big) is not big and not torch.equal(big, full[name]):
                        return False
                    for n in rows:
                        if n < base and not (torch.equal(f(x[:n], h[:n]), full[name][:n])
                                             and torch.equal(f(x[-n:], h[-n:]), full[name][-n:])):
                            return False
    finally:
        torch.set_num_threads(before)
    return True


def probe_threads(device: torch.device) -> list[int]:
    """The intra-op thread counts the invariance check runs a CPU kernel at: this process's, one, and
    the machine's cores (a thread that never set its count, such as the service's worker, may get them)."""
    if device.type != "cpu":
        return [torch.get_num_threads()]
    import os

    return sorted({torch.get_num_threads(), 1, os.cpu_count() or 1}, reverse=True)


INVARIANT_KERNELS = ("ordered",)
"""The kernels batch-invariant by construction: the only ones an engine says so of."""


def kernel_invariance(weights: Sequence[torch.Tensor], head_shape: tuple[int, int],
                      head: torch.Tensor | None = None) -> dict[str, bool]:
    """{"ordered": `batch_invariant` on every one of `weights` ([in, out], the model's shapes),
    "lm_head": the same for its output layer (`output_layer`) on `head` [vocab, hidden] or a random
    weight of `head_shape`}, where the ordered GEMM runs here (else {})."""
    device = weights[0].device
    if device.type != "cpu" or ordered_unavailable() is not None:
        return {}
    ops = [OrderedLinear(w, None, torch.float32) for w in weights]
    out = {"ordered": all(batch_invariant(op, w.shape[0], device) for op, w in zip(ops, weights))}
    if head is None:
        head = torch.randn(*head_shape, generator=torch.Generator().manual_seed(1)).mul_(0.02).to(device)
    out["lm_head"] = batch_invariant(output_layer("ordered", head.float()), head_shape[1], device, base=48,
                                     rows=(1, 3, 12, 13, 33), points=("call",))
    return out


def output_layer(kernel: str, weight: torch.Tensor, bias: torch.Tensor | None = None) -> LinearOp:
    """The output layer's x @ weight.T (+ bias) for its weight [vocab, hidden] (the embeddings' when
    tied, so no copy), on the transposed view: the ordered GEMM where `kernel` is `ordered`, else
    `torch.mm` (the same bits as `F.linear`, which the reference path's `lm_head` calls)."""
    op = OrderedLinear if kernel == "ordered" else MmLinear
    return op(weight.t(), bias, torch.float32)


def log_softmax(kernel: str, logits: torch.Tensor) -> torch.Tensor:
    """log_softmax over the last dimension of float32 `logits`: each row's log-sum-exp in one fixed order
    (`ordered_gemm.lse`) where `kernel` is `ordered`, else torch's."""
    if kernel != "ordered" or logits.device.type != "cpu":
        return torch.log_softmax(logits, dim=-1)
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    return (flat - ordered_gemm.lse(ordered_gemm.load(), flat)[:, None]).view(logits.shape)


class _Scratch(threading.local):
    buffer: torch.Tensor | None = None


_SCRATCH = _Scratch()


def scratch(rows: int, cols: int) -> torch.Tensor:
    """A [rows, cols] float32 CPU tensor over this thread's reused buffer (grown as needed), for an
    output its caller consumes before asking again: the SiLU-gated projection's [gate | up].

    A fresh tensor each call is mapped anew by glibc when it is above its mmap threshold (32 MiB at
    most; LFM2-350M's [gate | up] of 1024 tokens is 36 MiB), every page faulted in and zeroed, then
    unmapped: the GEMM into it ran at 305-312 GFLOP/s against 357-365 into a reused one
    (1024 x 1024 x 9216, Intel Xeon with AMX, 2 threads)."""
    need = rows * cols
    if _SCRATCH.buffer is None or _SCRATCH.buffer.numel() < need:
        _SCRATCH.buffer = None  # the old one freed before the new one is taken
        _SCRATCH.buffer = torch.empty(need)
    return _SCRATCH.buffer[:need].view(rows, cols)


class MmLinear(LinearOp):
    """float32 `torch.mm` on the shared [in, out] weight (no copy)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        self.weight, self.bias, self.out_features = weight, bias, weight.shape[1]

    def __call__(self, x):
        return torch.mm(x, self.weight) if self.bias is None else torch.addmm(self.bias, x, self.weight)

    def add_(self, h, x):
        h.addmm_(x, self.weight)
        return h if self.bias is None else h.add_(self.bias)

    def add_scaled_(self, h, x, scale):
        h.addmm_(x, self.weight, alpha=scale)  # the scale applied in the GEMM's own write-back
        return h if self.bias is None else h.add_(self.bias, alpha=scale)

    def normed(self, h, eps):
        lib = fp32_passes.elementwise() if h.device.type == "cpu" and h.stride(-1) == 1 else None
        return self(rms_norm(h, eps) if lib is None else fp32_passes.rms_norm(lib, h, eps))

    def normed_swiglu(self, h, eps):
        lib = fp32_passes.elementwise() if h.device.type == "cpu" and h.stride(-1) == 1 else None
        if lib is None:
            return swiglu_(self.normed(h, eps))
        x = fp32_passes.rms_norm(lib, h, eps)
        gate_up = scratch(x.shape[0], self.out_features)  # [N, 2I], consumed by the down projection
        if self.bias is None:
            torch.mm(x, self.weight, out=gate_up)
        else:
            torch.addmm(self.bias, x, self.weight, out=gate_up)
        return fp32_passes.swiglu_(lib, gate_up)  # one C pass


class OrderedLinear(LinearOp):
    """float32 on the shared [in, out] weight (no copy), each output element summed in one fixed order
    (`ordered_gemm`): a row's result is the same bits in any call. Its norms and SwiGLU are the C passes
    of `fp32_kernels` (one fixed order per row too)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        if (why := ordered_unavailable()) is not None:
            raise TaskError(f"the ordered float32 GEMM cannot run here: {why}; use the mm kernel "
                            f"(SLMCLASSIFY_FP32_KERNEL=mm), whose scores may differ in their last bits with the batch")
        self.lib, self.passes = ordered_gemm.load(), fp32_passes.load()
        self.weight, self.out_features = weight, weight.shape[1]
        self.bias = None if bias is None else bias.float().contiguous()

    @staticmethod
    def _rows(x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return x if x.stride(-1) == 1 else x.contiguous()

    def __call__(self, x):
        x = self._rows(x)
        return ordered_gemm.gemm(self.lib, x, self.weight, self.bias, torch.empty(x.shape[0], self.out_features))

    def add_(self, h, x):
        return ordered_gemm.gemm(self.lib, self._rows(x), self.weight, self.bias, h, ordered_gemm.ADD)

    def add_scaled_(self, h, x, scale):
        return ordered_gemm.gemm(self.lib, self._rows(x), self.weight, self.bias, h, ordered_gemm.ADD, scale)

    def normed(self, h, eps):
        return self(fp32_passes.rms_norm(self.passes, self._rows(h), eps))

    def normed_swiglu(self, h, eps):
        x = fp32_passes.rms_norm(self.passes, self._rows(h), eps)
        gate_up = scratch(x.shape[0], self.out_features)  # [N, 2I], consumed by the down projection
        ordered_gemm.gemm(self.lib, x, self.weight, self.bias, gate_up)
        return fp32_passes.swiglu_(self.passes, gate_up)  # one C pass


class OneDnnLinear(LinearOp):
    """float32 oneDNN linear on a weight re-packed once (a copy in oneDNN's blocked layout)."""

    def __init__(self, weight, bias, dtype):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.t().contiguous(), None)
        self.bias, self.out_features = bias, weight.shape[1]

    def __call__(self, x):
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class Int8Linear(LinearOp):
    """Dynamic int8: the weight quantised symmetrically per output channel, activations per token per call.

    With a `smoothing.Smoothing`: the weight's rows scaled by s (and columns divided by the next op's
    s) before quantising, the input multiplied by 1/s, outlier input channels in float32 apart.
    """

    engine = "onednn"
    rows_apart = False  # the kernel quantises a call's activations with one range: a row's codes depend on the others

    def __init__(self, weight, bias, dtype, smooth=None):
        w, bias, self.outlier_weight = split_weight(weight, bias, smooth)  # [in, out], [out], [k, out]
        self.inv_in = None if smooth is None else smooth.inv_in
        self.outliers = None if self.outlier_weight is None else smooth.outliers
        self.packed = self._pack(w.t().contiguous())
        self.bias = bias
        self.out_features = weight.shape[1]

    def _pack(self, w: torch.Tensor):
        """The [out, in] weight quantised per output channel (±`int8_weight_levels`) and packed for `_matmul`."""
        kernel = f"int8-{self.engine}"
        scale = (w.abs().amax(dim=1) / check_int8(kernel)).clamp_min(1e-12).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        previous = torch.backends.quantized.engine
        try:
            torch.backends.quantized.engine = self.engine
            with warnings.catch_warnings():  # quantized tensors are deprecated but still the only CPU int8 path
                warnings.simplefilter("ignore")
                q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
                return torch.ops.quantized.linear_prepack(q, None)  # bias added after the row scales
        finally:
            torch.backends.quantized.engine = previous

    def _matmul(self, x: torch.Tensor, packed) -> torch.Tensor:
        """x [N, in] with every |x| <= 1 → x @ w, activations quantised with one scale for all of x.
        reduce_range=False: full 8-bit activations; safe with VNNI/AMX and with the onednn engine."""
        return torch.ops.quantized.linear_dynamic(x, packed, False)

    def _scaled(self, x: torch.Tensor):
        """(x @ w computed in int8 without the row scales [N, out], the row scales [N, 1], the
        outlier channels' float32 part [N, k] or None), for x [N, in] (see `__call__`)."""
        # The kernel quantises its input with one scale for the whole tensor, so one token with
        # large activations (the chat template's special tokens have them) would leave every other
        # token of the batch a few levels of 8 bits. Each row is scaled to max |x| = 1 first and
        # the output row scaled back (x @ w is linear in each row): per-token quantisation, which
        # also keeps an item's result nearly independent of what it is batched with.
        x = x.float()
        own = self.inv_in is not None
        if own:
            x = x * self.inv_in  # [N, in] smoothed (a new tensor)
        outlying = None
        if self.outliers is not None:
            outlying = x.index_select(1, self.outliers)  # [N, k]
            x = x.index_fill_(1, self.outliers, 0.0) if own else x.index_fill(1, self.outliers, 0.0)
            own = True
        scale = torch.linalg.vector_norm(x, ord=float("inf"), dim=1, keepdim=True).clamp_min_(1e-30)
        x = x.div_(scale) if own else x / scale
        return self._matmul(x, self.packed), scale, outlying

    def __call__(self, x):
        out, scale, outlying = self._scaled(x)
        out.mul_(scale)
        if outlying is not None:
            out.addmm_(outlying, self.outlier_weight)
        return out if self.bias is None else out.add_(self.bias)

    def add_(self, h, x):
        out, scale, outlying = self._scaled(x)
        h.addcmul_(out, scale)  # one pass over the output instead of scaling it, then adding
        if outlying is not None:
            h.addmm_(outlying, self.outlier_weight)
        return h if self.bias is None else h.add_(self.bias)


class Int8FusedLinear(LinearOp):
    """`Int8Linear`'s smoothing, float32 outlier channels and per-output-channel weights, activations
    quantised per token over the token's own [min, max] (asymmetric), with the passes around the GEMM fused (`int8_kernels.py`) and oneDNN's
    int8 GEMM on a weight prepacked once (`onednn::qlinear_pointwise`, AMX/VNNI where the CPU has them).

    After an RMSNorm (`normed`) the un-normed h is quantised: per-token quantisation is invariant to
    the row's 1/rms, which joins the row scale, so the norm's own pass disappears.
    """

    kernel = "int8-fused"

    def __init__(self, weight, bias, dtype, smooth=None):
        self.lib = int8_kernels.load()
        if self.lib is None:
            raise TaskError(f"the int8-fused kernel cannot run here: {int8_kernels.unavailable()}; use int8-onednn")
        w, bias, self.outlier_weight = split_weight(weight, bias, smooth)  # [in, out], [out], [k, out]
        divided = smooth is not None and smooth.inv_in is not None
        mult = smooth.inv_in.float().clone() if divided else torch.ones(w.shape[0])  # [in] x's multiplier (0: outlier)
        self.outliers = self.outlier_mult = None
        if self.outlier_weight is not None:
            self.outliers = smooth.outliers.long().contiguous()  # [k]
            self.outlier_mult = mult[self.outliers].contiguous()  # [k]
            mult[self.outliers] = 0.0  # their int8 part is zero and sets no scale
        self.mult = mult.contiguous()
        w = w.t().contiguous()  # [out, in]
        levels = check_int8(self.kernel)  # 63 where 8-bit weights would saturate
        self.col_scale = (w.abs().amax(dim=1) / levels).clamp_min(1e-12)  # [out] per output channel
        q = torch.round(w / self.col_scale[:, None]).clamp(-levels, levels).to(torch.int8)
        self.colsum = (q.sum(dim=1, dtype=torch.int64).float() * self.col_scale).contiguous()  # [out] for the zeros
        self.bias = None if bias is None else bias.contiguous()
        self.out_features = w.shape[0]
        self._pack(q)

    def _pack(self, q: torch.Tensor) -> None:
        """Keep the quantised weight q [out, in] int8 in the GEMM's own form."""
        self.packed = torch.ops.onednn.qlinear_prepack(q, None)
        self.zero = torch.zeros(q.shape[0], dtype=torch.long)

    def _quantise(self, x: torch.Tensor, eps: float | None, width: int | None = None):
        """`int8_kernels.quantise` of x with this op's smoothing and outlier channels."""
        x = x.float()
        if x.stride(1) != 1:
            x = x.contiguous()
        return int8_kernels.quantise(self.lib, x, self.mult, eps, self.outliers, self.outlier_mult, width)

    def _acc(self, x: torch.Tensor, eps: float | None):
        """(x @ w without the row scales and zeros [N, out], [row scales; zeros] [2, N], outlier values [N, k] or None)."""
        q, rows, values = self._quantise(x, eps)
        acc = torch.ops.onednn.qlinear_pointwise(q, 1.0, 0, self.packed, self.col_scale, self.zero, None, 1.0, 0,
                                                 torch.float32, "none", [], "")  # [N, out] = q @ w_int8 * col_scale
        return acc, rows, values

    def __call__(self, x):
        return self.normed(x, None)

    def normed(self, h, eps):
        """As `LinearOp.normed`; `eps` None: h is the input itself (`__call__`)."""
        acc, rows, values = self._acc(h, eps)
        return int8_kernels.dequantise_(self.lib, acc, acc, rows, self.colsum, self.bias, values, self.outlier_weight,
                                        add=False)

    def normed_swiglu(self, h, eps):
        acc, rows, values = self._acc(h, eps)
        return int8_kernels.swiglu_(self.lib, acc, rows, self.colsum, self.bias, values, self.outlier_weight)

    def add_(self, h, x):
        acc, rows, values = self._acc(x, None)
        return int8_kernels.dequantise_(self.lib, h, acc, rows, self.colsum, self.bias, values, self.outlier_weight,
                                        add=True)


class Int8MaddubsLinear(Int8FusedLinear):
    """`Int8FusedLinear`'s arithmetic (7-bit weights) with this package's own GEMM (AVX2, or AVX-512 BW
    registers where the CPU has them) in place of oneDNN's, for CPUs without VNNI, where both add u8 x s8
    products in 16-bit pairs (`vpmaddubsw`).
    Its epilogue is the dequantise pass (and gate_up's silu(gate) * up), so the int32 sums never
    leave the registers: faster than oneDNN's AVX2 int8 with the fused passes (docs/performance.md)."""

    kernel = "int8-maddubs"

    def __init__(self, weight, bias, dtype, smooth=None):
        lib = int8_kernels.load()
        if not int8_kernels.has_maddubs(lib):
            raise TaskError("the int8-maddubs kernel cannot run here: it needs AVX2 and a C compiler "
                            f"({int8_kernels.unavailable() or 'built without AVX2'}); use int8-fused")
        super().__init__(weight, bias, dtype, smooth)

    def _pack(self, q):
        self.weight = int8_kernels.MaddubsWeight(self.lib, q, paired=True)
        columns = self.weight.columns
        self.col_scale, self.colsum, self.bias = columns(self.col_scale), columns(self.colsum), columns(self.bias)
        self.outlier_weight = columns(self.outlier_weight)  # None stays None

    def _product(self, out, x, eps, mode):
        q, rows, values = self._quantise(x, eps, width=self.weight.kp)
        return int8_kernels.maddubs_(self.weight, out, q, rows, self.col_scale, self.colsum, self.bias, values,
                                     self.outlier_weight, mode)

    def normed(self, h, eps):
        return self._product(torch.empty(h.shape[0], self.out_features), h, eps, "set")

    def normed_swiglu(self, h, eps):
        return self._product(torch.empty(h.shape[0], self.out_features // 2), h, eps, "swiglu")

    def add_(self, h, x):
        return self._product(h, x, None, "add")


class Int8X86Linear(Int8Linear):
    engine = "x86"


class Int8FbgemmLinear(Int8Linear):
    engine = "fbgemm"


class CastLinear(LinearOp):
    """bf16/fp16 (or float32 on CUDA): the weight cast once, the input cast per call."""

    def __init__(self, weight, bias, dtype):
        self.dtype = dtype
        self.weight = weight.to(dtype).contiguous()
        self.bias = None if bias is None else bias.to(dtype)
        self.out_features = weight.shape[1]

    def __call__(self, x):
        x = x.to(self.dtype)
        return torch.mm(x, self.weight) if self.bias is None else torch.addmm(self.bias, x, self.weight)


COMPILED_INT8 = ("int8-fused", "int8-maddubs")
"""The int8 kernels whose passes are the compiled C library (`int8_kernels`): unavailable without a compiler."""

KERNELS: dict[str, Callable[..., LinearOp]] = {
    "ordered": OrderedLinear, "mm": MmLinear, "onednn": OneDnnLinear, "int8-onednn": Int8Linear, "int8-x86": Int8X86Linear,
    "int8-fbgemm": Int8FbgemmLinear, "int8-fused": Int8FusedLinear, "int8-maddubs": Int8MaddubsLinear,
    "bf16": CastLinear, "fp16": CastLinear,
}


def fp32_kernels(device: torch.device) -> list[str]:
    """The float32 kernels worth timing on this device: the ordered GEMM where it builds (the default:
    batch-invariant), and the vendor kernels (faster on some CPUs; used where asked for)."""
    if device.type != "cpu":
        return ["mm"]
    own = ["ordered"] if ordered_unavailable() is None else []
    return own + ["mm"] + (["onednn"] if torch.backends.mkldnn.is_available() else [])


def ordered_unavailable() -> str | None:
    """Why the ordered GEMM cannot run here (its library or the float32 passes it uses do not build),
    or None where it can: the one answer every caller asks."""
    return ordered_gemm.unavailable() or fp32_passes.unavailable()


def int8_engine() -> str | None:
    """The int8 kernel for this CPU: oneDNN's if PyTorch has it, else x86/fbgemm, else None."""
    engines = torch.backends.quantized.supported_engines
    for name in ("onednn", "x86", "fbgemm"):
        if name in engines:
            return f"int8-{name}"
    return None


STEADY_ROUND_S = 0.005
"""Rounds shorter than this (a tiny model's shapes) are too short to tell a busy machine from jitter."""


def time_kernels(kernels: Sequence[str], weights: Sequence[torch.Tensor], dtype_of: Callable[[str], torch.dtype],
                 rows: int = 1024, budget_s: float = 2.0, smoothed: Sequence[bool] = ()) -> tuple[dict[str, float], float]:
    """({kernel: GFLOP/s} on `weights` ([in, out] each, the model's own shapes) at `rows` tokens, the
    spread): the largest `Timings.spread` of the kernels (rounds under `STEADY_ROUND_S` count as steady).

    `smoothed[i]`: int8 ops of weight i divide their input by smoothing scales, as the engine's
    qkv and gate_up ops do (`smoothing.py`), so that int8 is timed with that multiply.

    The kernels run interleaved round after round (`timing.interleave`: the order rotates), so that
    a machine shared with other work slows them alike; each kernel's best round counts. Stops after
    `budget_s` seconds (building the ops included), having run at least two rounds (at most 50).
    """
    start = time.perf_counter()
    device = weights[0].device
    ops = {name: [_timed_op(name, w, dtype_of(name), i < len(smoothed) and smoothed[i]) for i, w in enumerate(weights)]
           for name in kernels}
    xs = [torch.randn(rows, w.shape[0], device=device) for w in weights]
    flops = sum(2 * rows * w.shape[0] * w.shape[1] for w in weights)

    def every_shape(name: str) -> Callable[[object], None]:
        def run(_) -> None:  # returns nothing: no output is kept across rounds
            for op, x in zip(ops[name], xs):
                op(x)

        return run

    # One untimed call each first (first calls allocate and pick algorithms).
    timings = interleave([Side(name, every_shape(name)) for name in kernels], rounds=2, sync=sync_of(device),
                         deadline=start + budget_s, max_rounds=50)
    spread = max(timings.spread(name, STEADY_ROUND_S) for name in kernels)
    return {name: flops / timings.best_round(name) / 1e9 for name in kernels}, spread


def _timed_op(name: str, weight: torch.Tensor, dtype: torch.dtype, smoothed: bool) -> LinearOp:
    if not (name.startswith("int8") and smoothed):
        return KERNELS[name](weight, None, dtype)
    ones = torch.ones(weight.shape[0])
    return KERNELS[name](weight, None, dtype, Smoothing(rows=ones, inv_in=ones))
