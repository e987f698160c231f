"""Fused per-token int8 quantise and dequantise passes, small C functions compiled at first use.

Around one int8 GEMM the eager path (`gemm.Int8Linear`) makes ~6 passes over the activations
(smoothing multiply, outlier select and fill, per-row max, divide, the kernel's own quantise,
row rescale, outlier product, bias). Here each side is one pass per row, with the row in cache:

    quantise    x [N, in] (a float32 row; optionally the un-normed residual stream, the RMSNorm's
                1/rms folded into the row scale, since per-token quantisation is invariant to a
                per-row factor) → q [N, in] int8, asymmetric per token over the row's own range of
                x * mult: x * mult ~ r (q + z), q uint8, r = (max - min) / 255; the row scales [N] = r (* 1/rms),
                zeros [N] = z and the outlier channels' float32 values [N, k] (their `mult` is 0)
    dequantise  h [N, out] (+)= (acc [N, out] + z colsum) * row scale (+ bias) (+ outliers [N, k] @ w_out [k, out]),
                acc = q @ w_int8 * column scales and colsum = the same of a row of ones
    swiglu      gate_up's dequantise and then silu(gate) * up in the same pass over the row
    maddubs     for CPUs without VNNI (AVX2, or AVX-512 without VNNI: ymm or zmm registers): q @ w_int8
                itself, 7-bit weights, with dequantise (or swiglu, or the add into h) as its epilogue
                on the int32 sums in registers (`MaddubsWeight`, `maddubs_`; the `int8-maddubs` op in `gemm.py`)

The C source, `csrc/int8.c`, is compiled at first use (`native.py`: the system's C compiler, the
user cache folder, one library per CPU); where no compiler works, `load()` returns None and
`unavailable()` says why: the int8 ops then run the eager path.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import native
from .native import C, I, F, P, ptr, threads


def load(cache_dir: Path | None = None):
    """The compiled library (ctypes), or None where it cannot be built (see `unavailable`).
    Compiled once per CPU into `cache_dir` (default: the user cache folder)."""
    return LIBRARY.load(cache_dir)


def unavailable(cache_dir: Path | None = None) -> str | None:
    """Why the fused kernels cannot run here (None when they can)."""
    return LIBRARY.unavailable(cache_dir)


def _bind(lib) -> None:
    lib.quantise_rows.argtypes = [P, I, I, I, P, F, P, I, P, P, P, I, P, P, C]
    lib.quantise_rows.restype = None
    lib.dequantise_rows.argtypes = [P, I, P, I, I, P, P, P, P, P, I, P, C, C]
    lib.dequantise_rows.restype = None
    lib.swiglu_rows.argtypes = [P, I, P, I, I, P, P, P, P, P, I, P, C]
    lib.swiglu_rows.restype = None
    lib.maddubs_built.argtypes, lib.maddubs_built.restype = [], C
    lib.maddubs_lanes.argtypes, lib.maddubs_lanes.restype = [], C
    if lib.maddubs_built():
        lib.maddubs_rows.argtypes = [P, I, P, I, I, P, I, I, I, P, P, P, P, P, P, I, P, C, C]
        lib.maddubs_rows.restype = None


LIBRARY = native.Library("int8.c", "int8", _bind)


def source_digest() -> str:
    """SHA-256 (hex) of the C sources the library is built from (`csrc/int8.c` and the headers):
    part of every key that must change with the kernels."""
    return LIBRARY.digest()


def quantise(lib, x: torch.Tensor, mult: torch.Tensor, eps: float | None, outliers: torch.Tensor | None,
             outlier_mult: torch.Tensor | None, width: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q [N, in] uint8, row scales and zeros [2, N] float32, outliers' values [N, k] or None) for x [N, in]
    float32 with unit stride along rows; `eps`: x is un-normed and the row scale includes 1/rms(x)
    (None: no norm). x * mult ~ scale * (q + zero) per row. `width` (>= in): q is [N, width], zeros
    after in."""
    native.check(x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1, "an input not float32 [N, in] with unit row stride")
    n, d = x.shape
    width = d if width is None else width
    q = torch.empty(n, d, dtype=torch.uint8) if width == d else torch.zeros(n, width, dtype=torch.uint8)
    rows = torch.empty(2, n)
    k = 0 if outliers is None else len(outliers)
    values = torch.empty(n, k) if k else None
    lib.quantise_rows(ptr(x), n, d, x.stride(0), ptr(mult), -1.0 if eps is None else eps, ptr(q), width,
                      ptr(rows[0]), ptr(rows[1]), ptr(outliers) if k else None, k,
                      ptr(outlier_mult) if k else None, ptr(values), threads())
    return q, rows, values


def dequantise_(lib, out: torch.Tensor, acc: torch.Tensor, rows: torch.Tensor, colsum: torch.Tensor,
                bias: torch.Tensor | None, values: torch.Tensor | None, outlier_weight: torch.Tensor | None,
                add: bool) -> torch.Tensor:
    """out = (or += with `add`) (acc + zero[:, None] * colsum) * scale[:, None] + bias + values @ outlier_weight,
    in place, for `rows` = `quantise`'s [scale; zero]; returns out. `out` may be `acc` itself (add False)."""
    native.check(out.dtype == acc.dtype == torch.float32 and out.stride(1) == 1 and acc.is_contiguous(),
                 "an output or accumulator not float32 with unit row stride")
    n, m = acc.shape
    k = 0 if values is None else values.shape[1]
    lib.dequantise_rows(ptr(out), out.stride(0), ptr(acc), n, m, ptr(rows[0]), ptr(rows[1]), ptr(colsum),
                        ptr(bias), ptr(values), k, ptr(outlier_weight) if k else None, int(add), threads())
    return out


def swiglu_(lib, acc: torch.Tensor, rows: torch.Tensor, colsum: torch.Tensor, bias: torch.Tensor | None,
            values: torch.Tensor | None, outlier_weight: torch.Tensor | None) -> torch.Tensor:
    """silu(gate) * up [N, I] for acc [N, 2I] = [gate | up] without the row scales and zeros (as
    `dequantise_`), written over acc's first half (returned as a view with row stride 2I); acc itself
    ends up dequantised."""
    native.check(acc.dtype == torch.float32 and acc.is_contiguous() and acc.shape[1] % 2 == 0,
                 "an accumulator not contiguous float32 [N, 2I]")
    n, m = acc.shape[0], acc.shape[1] // 2
    k = 0 if values is None else values.shape[1]
    lib.swiglu_rows(ptr(acc), 2 * m, ptr(acc), n, m, ptr(rows[0]), ptr(rows[1]), ptr(colsum), ptr(bias),
                    ptr(values), k, ptr(outlier_weight) if k else None, threads())
    return acc[:, :m]


def has_maddubs(lib) -> bool:
    """Whether `lib` has the vpmaddubsw GEMM (built for AVX2 or above)."""
    return lib is not None and bool(lib.maddubs_built())


class MaddubsWeight:
    """An int8 weight [out, in] (|w| <= 63) packed for `maddubs_rows` (see `csrc/int8.c`), with its
    per-output-column float32 vectors in the packed column order (`columns`).

    `paired` (an even `out`): gate_up's [gate | up] halves side by side, so that the product can end in
    silu(gate) * up (`swiglu`); plain and added products use the same layout."""

    def __init__(self, lib, q: torch.Tensor, paired: bool):
        m, k = q.shape
        self.lib, self.m, self.k, self.kp = lib, m, k, (k + 3) // 4 * 4
        g = lib.maddubs_lanes()  # columns per group: 8 (AVX2) or 16 (AVX-512 BW); a block holds two groups
        self.half = m // 2 if paired and m % 2 == 0 else 0
        self.blocks = -(-self.half // g) if self.half else -(-m // (2 * g))
        lanes = torch.arange(2 * g)
        starts = torch.arange(self.blocks)[:, None] * (g if self.half else 2 * g)
        col = starts + lanes % g + torch.where(lanes < g, 0, self.half if self.half else g)  # [blocks, 2 g]
        end = torch.where(lanes < g, self.half if self.half else m, m)
        self.source = torch.where(col < end, col, -1).reshape(-1)  # packed column → weight column (-1: none)
        rows = self.columns(torch.nn.functional.pad(q, (0, self.kp - k)).t()).t()  # [blocks * 2 g, kp]
        layout = rows.reshape(self.blocks, 2 * g, self.kp // 4, 4).transpose(1, 2)  # [blocks][kp / 4][2 g][4]
        raw = torch.empty(layout.numel() + 64, dtype=torch.int8)
        self._raw = raw  # the 64-byte aligned view below reads it
        self.packed = raw[(-raw.data_ptr()) % 64:][:layout.numel()]
        self.packed.copy_(layout.reshape(-1))

    def columns(self, v: torch.Tensor | None) -> torch.Tensor | None:
        """v [..., out] in the packed column order [..., blocks * 2 lanes] (zeros for padding columns)."""
        if v is None:
            return None
        out = v.new_zeros(*v.shape[:-1], len(self.source))
        keep = self.source >= 0
        out[..., keep] = v[..., self.source[keep]]
        return out.contiguous()


def maddubs_(w: MaddubsWeight, out: torch.Tensor, q: torch.Tensor, rows: torch.Tensor, col_scale: torch.Tensor,
             colsum: torch.Tensor, bias: torch.Tensor | None, values: torch.Tensor | None,
             outlier_weight: torch.Tensor | None, mode: str) -> torch.Tensor:
    """The product of `quantise`'s q [N, w.kp] (and rows, values) with w, dequantised into `out` (row stride
    free, unit column stride): mode "set" out [N, out] = f, "add" out += f, "swiglu" out [N, out / 2] =
    silu(gate) * up. col_scale, colsum, bias, outlier_weight in `w.columns` order. Returns out."""
    native.check(out.dtype == torch.float32 and out.stride(1) == 1 and q.is_contiguous() and q.shape[1] == w.kp,
                 "an output or quantised input of the wrong layout")
    native.check(mode != "swiglu" or w.half, "swiglu on a weight not packed in gate/up halves")
    k = 0 if values is None else values.shape[1]
    w.lib.maddubs_rows(ptr(out), out.stride(0), ptr(q), q.shape[0], w.kp, ptr(w.packed), w.blocks, w.m, w.half,
                       ptr(col_scale), ptr(rows[0]), ptr(rows[1]), ptr(colsum), ptr(bias), ptr(values), k,
                       ptr(outlier_weight) if k else None, {"set": 0, "add": 1, "swiglu": 2}[mode], threads())
    return out
