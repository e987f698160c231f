"""The float32 GEMM whose sums have one fixed order: an item's bits do not depend on its batch by construction.

`csrc/fp32_gemm.c` computes every output element as one chain of fused multiply-adds over k = 0 ..
K-1, from zero, whatever the call's row count, the other rows, the thread count or the row's place
in the call; only which register lane holds an element changes. The vendor GEMMs (MKL's `mm`,
oneDNN) pick their blocking, and with it the order of each sum, from the call's shape and the CPU:
an Intel Xeon's MKL rounds a one-row call with a scale otherwise than the same row in 160 (round 6),
where the AMD CPUs the old probe was written on did not. No probe can cover the paths of a CPU it
has not run on; a fixed order needs none (`gemm.OrderedLinear` is the op; the test suite checks the
claim on every entry point at every row count and thread count it meets).

It also computes the output layer (the weight given by its rows, [vocab, hidden], packed per call)
and each row's log-sum-exp over the vocabulary (`lse_rows`: the max, then exp in whole vectors
with a fixed lane order), the two reductions of scoring after the decoder.

Built like the other C kernels (`native.py`: first use, the user cache folder, `SLMCLASSIFY_CC=`
disables it); it needs AVX2 and FMA (`built()`), else `load()` is None and float32 runs on `mm`,
which the engine line then names as not batch-invariant.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import native
from .native import C, I, F, P, ptr, threads

SET, ADD = 0, 1


def _bind(lib) -> None:
    lib.built.argtypes, lib.built.restype = [], C
    lib.tile_rows.argtypes, lib.tile_rows.restype = [], C
    lib.tile_cols.argtypes, lib.tile_cols.restype = [], C
    if lib.built():
        lib.ordered_gemm.argtypes = [P, I, P, I, I, P, P, I, I, I, I, C, F, C]
        lib.ordered_gemm.restype = None
        lib.lse_rows.argtypes = [P, I, I, I, P, C]
        lib.lse_rows.restype = None


LIBRARY = native.Library("fp32_gemm.c", "fp32-gemm", _bind)


def load(cache_dir: Path | None = None):
    """The compiled library where it builds with AVX2 and FMA, else None (`unavailable` says why)."""
    lib = LIBRARY.load(cache_dir)
    return lib if lib is not None and lib.built() else None


def unavailable(cache_dir: Path | None = None) -> str | None:
    """Why the ordered GEMM cannot run here (None when it can)."""
    why = LIBRARY.unavailable(cache_dir)
    if why is None and not LIBRARY.load(cache_dir).built():
        return "the ordered GEMM needs AVX2 and FMA"
    return why


def gemm(lib, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
         mode: int = SET, scale: float = 1.0) -> torch.Tensor:
    """out = x @ weight (+ bias) (SET) or out += scale * (x @ weight (+ bias)) (ADD), in place; returns out.

    x [M, K] float32 with unit stride along rows; weight [K, N] float32 with any strides (the
    projections' [in, out] weights are row-major, the output layer's a transposed [vocab, hidden]
    view); bias [N] contiguous or None; out [M, N] with unit stride along rows."""
    M, K = x.shape
    N = weight.shape[1]
    native.check(x.dtype == weight.dtype == out.dtype == torch.float32 and x.device.type == "cpu"
                 and x.stride(1) == 1 and out.stride(1) == 1 and weight.shape[0] == K and out.shape == (M, N)
                 and (bias is None or (bias.is_contiguous() and bias.shape == (N,) and bias.dtype == torch.float32)),
                 "operands not float32 x [M, K], weight [K, N], out [M, N] with unit row strides")
    lib.ordered_gemm(ptr(x), x.stride(0), ptr(weight), weight.stride(0), weight.stride(1), ptr(bias), ptr(out),
                     out.stride(0), M, N, K, mode, scale, threads())
    return out


def lse(lib, x: torch.Tensor) -> torch.Tensor:
    """[n] log(sum(exp(x))) of each row of x [n, d] float32 (unit stride along rows), each in one fixed order."""
    native.check(x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1 and x.device.type == "cpu",
                 "an input not float32 [n, d] on the CPU with unit row stride")
    out = torch.empty(x.shape[0])
    lib.lse_rows(ptr(x), x.shape[0], x.shape[1], x.stride(0), ptr(out), threads())
    return out
