"""A float32 attention kernel for the engine's packed rows, a small C function compiled at first use.

PyTorch's CPU flash-attention kernel is slow on the engine's shapes (64-wide heads, rows of
20-450 keys: 55-106 GFLOP/s against ~150-350 for the matmuls), and around it the engine copies
q/k/v into a padded layout, runs the prefix and the row as two calls and merges them by their
log-sum-exps. `attend_rows` does all of it in one pass per (row, KV head), straight from the
packed q/k/v that the projection wrote, with the cached prefix as the first keys of every row:

    keys of row b:   [ p p p p | s s s s n1 n2 ]     p = prefix (cached), s = item, n = trie node
    query s_i sees   the prefix and s_0 .. s_i (causal)
    query n_t sees   the prefix, every s of the row, and the nodes u with ancestors[t, u] (itself too)

Per (row, KV head) the keys are transposed once into [D, K] so that scores for 4 queries x 16
keys accumulate in registers (plain C loops that -O3 vectorises for AVX-512 and AVX2 alike);
softmax in float32 with a Cephes exp (relative error ~1e-7); the G query heads of a GQA group
reuse the transposed keys. Results equal the torch path within float32 rounding (~1e-6).

Compiled at first use like int8's passes (`native.py`: same compiler, cache folder, CPU-named
library, and `SLMCLASSIFY_CC=` disables it); where it cannot be built, `load()` is None and the
engine keeps the torch kernels. Heads wider than `MAX_HEAD_DIM` are refused (the torch path runs them).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from . import native
from .native import C, I, F, P, ptr, threads

MAX_HEAD_DIM = 256

ENABLED = True
"""Whether CPU float32 engines use the kernel (where it builds); False: the torch kernels (A/B, tests)."""

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* GCC vectors of the machine's width: 16 floats (one zmm) with AVX-512, else 8 (one ymm; 64-byte
   vectors split in two ran ~10x slower under -march=x86-64-v3). */
#ifdef __AVX512F__
#define VW 16
#define NV 4           /* value vectors per output chunk: 4 x 16 = a 64-wide head */
#else
#define VW 8
#define NV 2
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
int vector_width(void) { return VW; }
#ifdef __AVX2__
int built_with_avx2(void) { return 1; }
#else
int built_with_avx2(void) { return 0; }
#endif

#define KB (2 * VW)    /* keys per score block: QB x 2 accumulators hide the FMA latency */
#define QB 4           /* queries per block: each transposed key load feeds QB FMAs */
#define DMAX 256

/* VEXP */

/* o[q][c .. c + VW n) = sum_j p[q][j] v_j[c ..] for the QB queries of a block, j < kend: key j < P is
   the prefix's (pv), else packed row base + j - P's value head (column vh of qkv). Each value load
   feeds QB FMAs; the QB x n accumulators stay in registers. */
static inline __attribute__((always_inline)) void weigh(float o[][DMAX], const float *p, int64_t kpad,
    int64_t kend, int64_t c, const int n, const float *pv, int64_t g, int64_t P, int64_t D,
    const float *qkv, int64_t base, int64_t ld, int64_t vh)
{
    vf acc[QB][NV];
    for (int qi = 0; qi < QB; qi++)
        for (int t = 0; t < n; t++) acc[qi][t] = (vf){0};
    for (int64_t j = 0; j < kend; j++) {
        const float *vr = (j < P ? pv + (g * P + j) * D : qkv + (base + j - P) * ld + vh * D) + c;
        vf v[NV];
        for (int t = 0; t < n; t++) memcpy(&v[t], vr + VW * t, sizeof(vf));
        for (int qi = 0; qi < QB; qi++) {
            const float w = p[qi * kpad + j];
            for (int t = 0; t < n; t++) acc[qi][t] += w * v[t];
        }
    }
    for (int qi = 0; qi < QB; qi++)
        for (int t = 0; t < n; t++) memcpy(&o[qi][c + VW * t], &acc[qi][t], sizeof(vf));
}

/* The same for any D (heads not a multiple of 16 wide). */
static void weigh_plain(float o[][DMAX], const float *p, int64_t kpad, int64_t kend, const float *pv,
    int64_t g, int64_t P, int64_t D, const float *qkv, int64_t base, int64_t ld, int64_t vh)
{
    for (int qi = 0; qi < QB; qi++)
        for (int64_t d = 0; d < D; d++) o[qi][d] = 0.0f;
    for (int64_t j = 0; j < kend; j++) {
        const float *vr = j < P ? pv + (g * P + j) * D : qkv + (base + j - P) * ld + vh * D;
        for (int qi = 0; qi < QB; qi++) {
            const float w = p[qi * kpad + j];
            for (int64_t d = 0; d < D; d++) o[qi][d] += w * vr[d];
        }
    }
}

/* qkv [N, H + 2 Hkv, D] packed rows (row b: tokens start[b] .. start[b] + len[b] + T - 1, its items
   then its T trie nodes), pk/pv [Hkv, P, D] the prefix (P may be 0), anc [T, T] uint8.
   out [Nq, H, D]: every token's attention output (read_only 0: out row = packed row), or only each
   row's last item token and its nodes (read_only 1: out rows b (1 + T) .. b (1 + T) + T).
   Query head h reads KV head h / (H / Hkv); scores scaled by `scale`. */
void attend_rows(const float *qkv, int64_t H, int64_t Hkv, int64_t D, const int64_t *start,
                 const int64_t *len, int64_t B, int64_t T, const uint8_t *anc, const float *pk,
                 const float *pv, int64_t P, int read_only, float *out, float scale, int nthreads)
{
    const int64_t ld = (H + 2 * Hkv) * D, G = H / Hkv;
    int64_t maxk = 0;
    for (int64_t b = 0; b < B; b++) maxk = P + len[b] + T > maxk ? P + len[b] + T : maxk;
    const int64_t kpad = (maxk + KB - 1) / KB * KB;
    #pragma omp parallel num_threads(nthreads)
    {
        float *kt = aligned_alloc(64, (size_t)(D * kpad * sizeof(float) + 63) / 64 * 64);
        float *s = aligned_alloc(64, (size_t)(QB * kpad * sizeof(float) + 63) / 64 * 64);
        float qv[QB][DMAX], o[QB][DMAX] __attribute__((aligned(64)));
        #pragma omp for schedule(dynamic, 1) collapse(2)
        for (int64_t b = 0; b < B; b++) {
            for (int64_t g = 0; g < Hkv; g++) {
                const int64_t L = len[b], R = L + T, K = P + R, base = start[b];
                const int64_t kend_all = (K + KB - 1) / KB * KB;
                for (int64_t j = 0; j < P; j++) {
                    const float *kr = pk + (g * P + j) * D;
                    for (int64_t d = 0; d < D; d++) kt[d * kpad + j] = kr[d];
                }
                for (int64_t j = 0; j < R; j++) {
                    const float *kr = qkv + (base + j) * ld + (H + g) * D;
                    for (int64_t d = 0; d < D; d++) kt[d * kpad + P + j] = kr[d];
                }
                for (int64_t d = 0; d < D; d++)
                    for (int64_t j = K; j < kend_all; j++) kt[d * kpad + j] = 0.0f;
                const int64_t q0 = read_only ? L - 1 : 0;
                const int64_t orow0 = read_only ? b * (1 + T) : base;
                for (int64_t h = g * G; h < (g + 1) * G; h++) {
                    for (int64_t i0 = q0; i0 < R; i0 += QB) {
                        const int64_t nb = R - i0 < QB ? R - i0 : QB;
                        const int64_t kend = P + i0 + nb;  /* keys 0 .. kend-1 cover every query of the block */
                        for (int qi = 0; qi < QB; qi++) {
                            const float *qr = qkv + (base + i0 + (qi < nb ? qi : 0)) * ld + h * D;
                            for (int64_t d = 0; d < D; d++) qv[qi][d] = qr[d] * scale;
                        }
                        for (int64_t j0 = 0; j0 < kend; j0 += KB) {
                            vf acc[QB][2];
                            for (int qi = 0; qi < QB; qi++) acc[qi][0] = acc[qi][1] = (vf){0};
                            for (int64_t d = 0; d < D; d++) {
                                const vf k0 = *(const vf *)(kt + d * kpad + j0);
                                const vf k1 = *(const vf *)(kt + d * kpad + j0 + VW);
                                for (int qi = 0; qi < QB; qi++) {
                                    acc[qi][0] += qv[qi][d] * k0;
                                    acc[qi][1] += qv[qi][d] * k1;
                                }
                            }
                            for (int qi = 0; qi < QB; qi++) {
                                *(vf *)(s + qi * kpad + j0) = acc[qi][0];
                                *(vf *)(s + qi * kpad + j0 + VW) = acc[qi][1];
                            }
                        }
                        for (int qi = 0; qi < nb; qi++) {
                            const int64_t i = i0 + qi, last = P + i + 1;  /* keys after the query: never seen */
                            float *sr = s + qi * kpad;
                            if (i >= L)  /* a trie node: of the nodes before it, only its ancestors */
                                for (int64_t u = L; u < i; u++)
                                    if (!anc[(i - L) * T + (u - L)]) sr[P + u] = -INFINITY;
                            float mx = -INFINITY;
                            #pragma omp simd reduction(max:mx)
                            for (int64_t j = 0; j < last; j++) mx = sr[j] > mx ? sr[j] : mx;
                            float sum = exp_shifted(sr, last, mx);
                            if (i >= L)
                                for (int64_t u = L; u < i; u++)
                                    if (!anc[(i - L) * T + (u - L)]) { sum -= sr[P + u]; sr[P + u] = 0.0f; }
                            const float inv = 1.0f / sum;
                            for (int64_t j = 0; j < last; j++) sr[j] *= inv;
                            for (int64_t j = last; j < kend; j++) sr[j] = 0.0f;
                        }
                        for (int qi = nb; qi < QB; qi++)
                            for (int64_t j = 0; j < kend; j++) s[qi * kpad + j] = 0.0f;
                        if (D % (VW * NV) == 0)
                            for (int64_t c = 0; c < D; c += VW * NV) weigh(o, s, kpad, kend, c, NV, pv, g, P, D, qkv, base, ld, H + Hkv + g);
                        else if (D % VW == 0)
                            for (int64_t c = 0; c < D; c += VW) weigh(o, s, kpad, kend, c, 1, pv, g, P, D, qkv, base, ld, H + Hkv + g);
                        else
                            weigh_plain(o, s, kpad, kend, pv, g, P, D, qkv, base, ld, H + Hkv + g);
                        for (int qi = 0; qi < nb; qi++) {
                            float *orow = out + (orow0 + i0 + qi - q0) * H * D + h * D;
                            for (int64_t d = 0; d < D; d++) orow[d] = o[qi][d];
                        }
                    }
                }
            }
        }
        free(kt);
        free(s);
    }
}

/* out [n, d] = x / sqrt(mean(x^2) + eps) per row (RMSNorm without its weight), x's rows ldx apart. */
void rms_rows(const float *x, int64_t n, int64_t d, int64_t ldx, float eps, float *out, int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + i * ldx;
        float ss = 0.0f;
        #pragma omp simd reduction(+:ss)
        for (int64_t j = 0; j < d; j++) ss += xr[j] * xr[j];
        const float r = 1.0f / sqrtf(ss / (float)d + eps);
        float *orow = out + i * d;
        #pragma omp simd
        for (int64_t j = 0; j < d; j++) orow[j] = xr[j] * r;
    }
}

/* gu [n, 2 m] = [gate | up]: the gate half becomes silu(gate) * up, in one pass over the row. */
void swiglu_rows(float *gu, int64_t n, int64_t m, int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float *g = gu + i * 2 * m;
        silu_mul(g, g, g + m, m);
    }
}
""".replace("/* VEXP */", native.VEXP)

def load(cache_dir: Path | None = None, flags: tuple[str, ...] | None = None):
    """The compiled library (ctypes), or None where it cannot be built (see `unavailable`).
    `flags` (tests): compile with these instead of `native.compile_flags()` (e.g. AVX2 only)."""
    return LIBRARY.load(cache_dir, flags)


def attention_pays(lib) -> bool:
    """Whether `attend_rows` beats the torch path here: where it was compiled for AVX-512 (isolated, 1
    thread, article shapes: 1.5-2.3x) or AVX2 (x86-64-v3, the Xeon under the AVX2 caps, 150 article
    tickets, 2 threads, quiet: the fp32 engine 1.08x; 1.00x before its softmax's exp was vectorised
    there, `native.VEXP`, when the int8 engine read 1.04x). Below AVX2 (unmeasured) the torch kernels run."""
    return bool(lib.built_with_avx2())


def attention_off() -> str | None:
    """Why float32 attention on this CPU does not run through `attend_rows` (None: it does)."""
    if not ENABLED:
        return "switched off"
    lib = load()
    if lib is None:
        return unavailable()
    return None if attention_pays(lib) else "the C kernel needs AVX2"


def unavailable(cache_dir: Path | None = None) -> str | None:
    """Why the kernel cannot run here (None when it can)."""
    return LIBRARY.unavailable(cache_dir)


def _bind(lib) -> None:
    lib.attend_rows.argtypes = [P, I, I, I, P, P, I, I, P, P, P, I, C, P, F, C]
    lib.attend_rows.restype = None
    lib.vector_width.argtypes = []
    lib.vector_width.restype = C
    lib.built_with_avx2.argtypes = []
    lib.built_with_avx2.restype = C
    lib.rms_rows.argtypes = [P, I, I, I, F, P, C]
    lib.rms_rows.restype = None
    lib.swiglu_rows.argtypes = [P, I, I, C]
    lib.swiglu_rows.restype = None


LIBRARY = native.Library(SOURCE, "fp32-attention", _bind)


def attend_rows(lib, qkv: torch.Tensor, n_heads: int, starts: torch.Tensor, lengths: torch.Tensor,
                ancestors: torch.Tensor | None, prefix: tuple[torch.Tensor, torch.Tensor] | None,
                read_only: bool) -> torch.Tensor:
    """Attention of packed rows, [Nq, H, D] float32 (see the module docstring).

    qkv [N, H + 2 H_kv, D] float32 contiguous, rotary applied; starts, lengths [B] int64 (each row's
    first packed token and its number of item tokens; its T trie nodes follow them); ancestors
    [T, T] uint8 or None (T = 0); prefix: keys and values [H_kv, P, D] contiguous, or None.
    read_only: queries only at each row's last item token and its nodes (Nq = B (1 + T)), else at
    every token (Nq = N)."""
    N, heads, D = qkv.shape
    assert qkv.dtype == torch.float32 and qkv.is_contiguous() and D <= MAX_HEAD_DIM
    n_kv = (heads - n_heads) // 2
    B = starts.shape[0]
    T = 0 if ancestors is None else ancestors.shape[0]
    P = 0 if prefix is None else prefix[0].shape[1]
    out = torch.empty(B * (1 + T) if read_only else N, n_heads, D)
    lib.attend_rows(ptr(qkv), n_heads, n_kv, D, ptr(starts), ptr(lengths), B, T,
                    ptr(ancestors) if T else None, ptr(prefix[0]) if P else None,
                    ptr(prefix[1]) if P else None, P, int(read_only), ptr(out), 1.0 / math.sqrt(D),
                    threads())
    return out


def elementwise():
    """The library where CPU float32 ops may use its fused passes (`rms_norm`, `swiglu_`), else None."""
    return load() if ENABLED else None


def rms_norm(lib, x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) per row, a new [N, d] tensor, for x [N, d] float32 on the CPU with unit
    stride along rows (`gemm.rms_norm` in one pass)."""
    assert x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1 and x.device.type == "cpu"
    out = torch.empty(x.shape)
    lib.rms_rows(ptr(x), x.shape[0], x.shape[1], x.stride(0), eps, ptr(out), threads())
    return out


def swiglu_(lib, gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up [N, I] for gate_up [N, 2I] = [gate | up] float32 contiguous on the CPU, written
    over the gate half (returned as a view with row stride 2I)."""
    assert gate_up.dtype == torch.float32 and gate_up.is_contiguous() and gate_up.device.type == "cpu"
    m = gate_up.shape[1] // 2
    lib.swiglu_rows(ptr(gate_up), gate_up.shape[0], m, threads())
    return gate_up[:, :m]
