/* The float32 attention of the engine's packed rows and its fused RMSNorm and SwiGLU passes (fp32_kernels.py binds them). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "vexp.h"

/* GCC vectors of the machine's width: 16 floats (one zmm) with AVX-512, else 8 (one ymm: 64-byte
   vectors split in two are several times slower under -march=x86-64-v3). */
#ifdef __AVX512F__
#define VW 16
#define NV 2           /* value vectors per output chunk: 2 x 16 */
#define QB 8           /* queries per block: each transposed key load feeds QB FMAs (16 accumulators) */
#else
#define VW 8
#define NV 2
#define QB 4           /* AVX2: 16 registers in all */
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
int vector_width(void) { return VW; }
#ifdef __AVX2__
int built_with_avx2(void) { return 1; }
#else
int built_with_avx2(void) { return 0; }
#endif

#define KB (2 * VW)    /* keys per score block: QB x 2 accumulators hide the FMA latency */
#define DMAX 256

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
                        int64_t j0 = 0;
                        for (; j0 + VW < kend; j0 += KB) {
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
                        if (j0 < kend) {  /* the last VW keys or fewer: one vector of them */
                            vf acc[QB];
                            for (int qi = 0; qi < QB; qi++) acc[qi] = (vf){0};
                            for (int64_t d = 0; d < D; d++) {
                                const vf k0 = *(const vf *)(kt + d * kpad + j0);
                                for (int qi = 0; qi < QB; qi++) acc[qi] += qv[qi][d] * k0;
                            }
                            for (int qi = 0; qi < QB; qi++) *(vf *)(s + qi * kpad + j0) = acc[qi];
                        }
                        float inv[QB];
                        for (int qi = 0; qi < nb; qi++) {
                            const int64_t i = i0 + qi, last = P + i + 1;  /* keys after the query: never seen */
                            float *sr = s + qi * kpad;
                            if (i >= L)  /* a trie node: of the nodes before it, only its ancestors */
                                for (int64_t u = L; u < i; u++)
                                    if (!anc[(i - L) * T + (u - L)]) sr[P + u] = -INFINITY;
                            float mx = -INFINITY;
                            #pragma omp simd reduction(max:mx)
                            for (int64_t j = 0; j < last; j++) mx = sr[j] > mx ? sr[j] : mx;
                            float sum = exp_shifted(sr, last, mx);  /* s rows hold kpad, a multiple of VW */
                            if (i >= L)
                                for (int64_t u = L; u < i; u++)
                                    if (!anc[(i - L) * T + (u - L)]) { sum -= sr[P + u]; sr[P + u] = 0.0f; }
                            inv[qi] = 1.0f / sum;  /* applied to the output, not to every weight */
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
                            for (int64_t d = 0; d < D; d++) orow[d] = o[qi][d] * inv[qi];
                        }
                    }
                }
            }
        }
        free(kt);
        free(s);
    }
}

/* out [n, d] = x / sqrt(mean(x^2) + eps) per row (RMSNorm without its weight), x's rows ldx apart.
   The sum of squares in one fixed order whatever the row's address or the call (batch invariance):
   lane l of one vector adds the elements j = l mod VW of the whole vectors in order, the lanes are
   added in order, then the elements past the last whole vector; no loop the compiler may peel for
   alignment (a peel would move the lanes with the row's address). */
void rms_rows(const float *x, int64_t n, int64_t d, int64_t ldx, float eps, float *out, int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + i * ldx;
        vf acc = {0};
        int64_t j = 0;
        for (; j + VW <= d; j += VW) {
            vf v;
            memcpy(&v, xr + j, sizeof v);
            acc += v * v;
        }
        float ss = 0.0f;
        for (int l = 0; l < VW; l++) ss += acc[l];
        for (; j < d; j++) ss += xr[j] * xr[j];
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
