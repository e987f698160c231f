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

The C source is compiled at first use (`native.py`: the system's C compiler, the user cache
folder, one library per CPU); where no compiler works, `load()` returns None and `unavailable()`
says why: the int8 ops then run the eager path.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import native
from .native import C, I, F, P, ptr, threads

SOURCE = r"""
#include <stdint.h>
#include <math.h>
#include <string.h>

/* rintf rounds half to even (the default rounding mode) and, unlike roundevenf, vectorises.
   Per row, asymmetric over the row's own range [lo, hi] of v = x * mult (0 for outlier channels):
   scale = (hi - lo) / 255, zero z = rint(lo / scale) (<= 0), q [n, d] uint8 = clamp(rint(v / scale) - z, 0, 255),
   so v ~ scale * (q + z); rscale [n] = scale (* 1/rms(x) when eps >= 0), zrow [n] = z;
   outv [n, k] = x[outl] * outl_mult (* 1/rms). */
void quantise_rows(const float *x, int64_t n, int64_t d, int64_t ldx, const float *mult, float eps,
                   uint8_t *q, float *rscale, float *zrow, const int64_t *outl, int64_t k, const float *outl_mult,
                   float *outv, int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + i * ldx;
        float rfac = 1.0f;
        if (eps >= 0.0f) {
            float ss = 0.0f;
            #pragma omp simd reduction(+:ss)
            for (int64_t j = 0; j < d; j++) ss += xr[j] * xr[j];
            rfac = 1.0f / sqrtf(ss / (float)d + eps);
        }
        float lo = 0.0f, hi = 0.0f;
        #pragma omp simd reduction(min:lo) reduction(max:hi)
        for (int64_t j = 0; j < d; j++) { float v = xr[j] * mult[j]; lo = v < lo ? v : lo; hi = v > hi ? v : hi; }
        float scale = (hi - lo) / 255.0f;
        if (scale < 1e-30f) scale = 1e-30f;
        float s = 1.0f / scale;
        float z = __builtin_rintf(lo * s);
        uint8_t *qr = q + i * d;
        #pragma omp simd
        for (int64_t j = 0; j < d; j++) {
            float v = __builtin_rintf(xr[j] * mult[j] * s) - z;
            v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
            qr[j] = (uint8_t)(int32_t)v;
        }
        rscale[i] = scale * rfac;
        zrow[i] = z;
        for (int64_t t = 0; t < k; t++) outv[i * k + t] = xr[outl[t]] * outl_mult[t] * rfac;
    }
}

/* VEXP */
/* acc [n, 2 m] = [gate | up] = q @ w without row scales and zeros: dequantised in place (as dequantise_rows), then
   act [n, m] (row stride lda; may be acc's first half) = silu(gate) * up. */
void swiglu_rows(float *act, int64_t lda, float *acc, int64_t n, int64_t m, const float *rscale,
                 const float *zrow, const float *colsum, const float *bias, const float *outv, int64_t k,
                 const float *ow, int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float *ar = acc + i * 2 * m;
        float r = rscale[i], z = zrow[i];
        #pragma omp simd
        for (int64_t j = 0; j < 2 * m; j++) ar[j] = (ar[j] + z * colsum[j]) * r + (bias ? bias[j] : 0.0f);
        for (int64_t t = 0; t < k; t++) {
            float v = outv[i * k + t];
            const float *w = ow + t * 2 * m;
            #pragma omp simd
            for (int64_t j = 0; j < 2 * m; j++) ar[j] += v * w[j];
        }
        float *out = act + i * lda;
        #pragma omp simd
        for (int64_t j = 0; j < m; j++) { float g = ar[j]; out[j] = g / (1.0f + vexp(-g)) * ar[m + j]; }
    }
}

/* h [n, m] (row stride ldh) = or += (acc [n, m] + zrow[i] * colsum[j]) * rscale[i] (+ bias[j])
   (+ outv [n, k] @ ow [k, m]); colsum [m] = the int8 weight's column sums times its column scales. */
void dequantise_rows(float *h, int64_t ldh, const float *acc, int64_t n, int64_t m, const float *rscale,
                     const float *zrow, const float *colsum, const float *bias, const float *outv, int64_t k,
                     const float *ow, int add, int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float *hr = h + i * ldh;
        const float *ar = acc + i * m;
        float r = rscale[i], z = zrow[i];
        if (add) {
            #pragma omp simd
            for (int64_t j = 0; j < m; j++) hr[j] += (ar[j] + z * colsum[j]) * r;
        } else {
            #pragma omp simd
            for (int64_t j = 0; j < m; j++) hr[j] = (ar[j] + z * colsum[j]) * r;
        }
        if (bias) {
            #pragma omp simd
            for (int64_t j = 0; j < m; j++) hr[j] += bias[j];
        }
        for (int64_t t = 0; t < k; t++) {
            float v = outv[i * k + t];
            const float *w = ow + t * m;
            #pragma omp simd
            for (int64_t j = 0; j < m; j++) hr[j] += v * w[j];
        }
    }
}
""".replace("/* VEXP */", native.VEXP)


def load(cache_dir: Path | None = None):
    """The compiled library (ctypes), or None where it cannot be built (see `unavailable`).
    Compiled once per CPU into `cache_dir` (default: the user cache folder)."""
    return LIBRARY.load(cache_dir)


def unavailable(cache_dir: Path | None = None) -> str | None:
    """Why the fused kernels cannot run here (None when they can)."""
    return LIBRARY.unavailable(cache_dir)


def _bind(lib) -> None:
    lib.quantise_rows.argtypes = [P, I, I, I, P, F, P, P, P, P, I, P, P, C]
    lib.quantise_rows.restype = None
    lib.dequantise_rows.argtypes = [P, I, P, I, I, P, P, P, P, P, I, P, C, C]
    lib.dequantise_rows.restype = None
    lib.swiglu_rows.argtypes = [P, I, P, I, I, P, P, P, P, P, I, P, C]
    lib.swiglu_rows.restype = None


LIBRARY = native.Library(SOURCE, "int8", _bind)


def quantise(lib, x: torch.Tensor, mult: torch.Tensor, eps: float | None, outliers: torch.Tensor | None,
             outlier_mult: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q [N, in] uint8, row scales and zeros [2, N] float32, outliers' values [N, k] or None) for x [N, in]
    float32 with unit stride along rows; `eps`: x is un-normed and the row scale includes 1/rms(x)
    (None: no norm). x * mult ~ scale * (q + zero) per row."""
    assert x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1
    n, d = x.shape
    q = torch.empty(n, d, dtype=torch.uint8)
    rows = torch.empty(2, n)
    k = 0 if outliers is None else len(outliers)
    values = torch.empty(n, k) if k else None
    lib.quantise_rows(ptr(x), n, d, x.stride(0), ptr(mult), -1.0 if eps is None else eps, ptr(q), ptr(rows[0]),
                      ptr(rows[1]), ptr(outliers) if k else None, k, ptr(outlier_mult) if k else None,
                      ptr(values), threads())
    return q, rows, values


def dequantise_(lib, out: torch.Tensor, acc: torch.Tensor, rows: torch.Tensor, colsum: torch.Tensor,
                bias: torch.Tensor | None, values: torch.Tensor | None, outlier_weight: torch.Tensor | None,
                add: bool) -> torch.Tensor:
    """out = (or += with `add`) (acc + zero[:, None] * colsum) * scale[:, None] + bias + values @ outlier_weight,
    in place, for `rows` = `quantise`'s [scale; zero]; returns out. `out` may be `acc` itself (add False)."""
    assert out.dtype == acc.dtype == torch.float32 and out.stride(1) == 1 and acc.is_contiguous()
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
    assert acc.dtype == torch.float32 and acc.is_contiguous() and acc.shape[1] % 2 == 0
    n, m = acc.shape[0], acc.shape[1] // 2
    k = 0 if values is None else values.shape[1]
    lib.swiglu_rows(ptr(acc), 2 * m, ptr(acc), n, m, ptr(rows[0]), ptr(rows[1]), ptr(colsum), ptr(bias),
                    ptr(values), k, ptr(outlier_weight) if k else None, threads())
    return acc[:, :m]
