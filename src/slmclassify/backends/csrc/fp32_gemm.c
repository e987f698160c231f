/* A float32 GEMM whose every output element is summed in one fixed order, whatever the call's shape,
   its other rows, the thread count or the row's place in the call (ordered_gemm.py binds it):

       c[i][j] = a[i][0] b[0][j]  +  a[i][1] b[1][j]  +  ...  +  a[i][K-1] b[K-1][j]

   one fused multiply-add per k, from 0, in the order k = 0, 1, ..., K-1. Rows, columns and threads
   only decide which element a register lane holds, never the order of its sum, so a row's result is
   the same bits alone, in a call of 4,096 rows, first or last in it (batch invariance by
   construction; the vendor GEMMs change their blocking, and with it the sums, with the row count).

   Blocking: the threads take blocks of MC rows x NC columns, handed out dynamically; a block's
   columns of b are packed into strips [KC][NR] (zeros past N), chunk by chunk of K (chunks of at most
   KC, their bounds a function of K alone); an MR x NR tile of c accumulates in registers over a
   chunk, broadcasting a's rows straight from a (rows past M repeat the last one, computed and never
   stored), and its running sums wait in a buffer between chunks, so each element's chain goes on
   exactly where it stopped. The epilogue then applies the bias, the scale and the add into c on
   whole vectors (a partial tile goes through a scratch tile with the same vector code, so an edge
   element takes the same operations as any other). Needs AVX2 and FMA (else not built: `built()` 0).
   Tile and chunk sizes: the fastest of those tried on an AMD EPYC Zen 4 (docs/results.md). */
/* No contraction of a multiply and an add into one FMA where the code does not ask for one: the
   compiler may contract one inlined copy of the epilogue and not another (a full tile and an edge
   tile), and the two would round the scaled add differently. The sums' FMAs are explicit. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize ("fp-contract=off")
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "vexp.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
int built(void) { return 1; }

#ifdef __AVX512F__
#define VW 16
#ifndef MR
#define MR 8           /* 8 x 3 = 24 accumulators + 3 strip vectors + 1 broadcast of the 32 zmm registers */
#endif
#ifndef NV
#define NV 3           /* vectors per tile row */
#endif
typedef __m512 vr;
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VSET1 _mm512_set1_ps
#define VFMA _mm512_fmadd_ps
#define VADD _mm512_add_ps
#define VMUL _mm512_mul_ps
#define VZERO _mm512_setzero_ps
#else
#define VW 8
#ifndef MR
#define MR 4           /* 4 x 3 = 12 accumulators + 3 + 1 of the 16 ymm registers */
#endif
#ifndef NV
#define NV 3
#endif
typedef __m256 vr;
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VSET1 _mm256_set1_ps
#define VFMA _mm256_fmadd_ps
#define VADD _mm256_add_ps
#define VMUL _mm256_mul_ps
#define VZERO _mm256_setzero_ps
#endif
#define NR (NV * VW)
#define MC (MR * 8)
int tile_rows(void) { return MR; }
int tile_cols(void) { return NR; }

enum { SET = 0, ADD = 1 };

#ifndef NCB
#define NCB 256        /* KiB of packed strips per chunk of a block */
#endif
#ifndef KC
#define KC 384         /* k per chunk: a tile's rows of a [MR][KC] and a strip [KC][NR] stay in L1/L2 */
#endif

/* The columns of a block: as many NR strips as keep a chunk's packed strips [KC][NC] within ~256 KiB,
   the blocks as even as whole strips allow. */
static int64_t block_cols(int64_t N)
{
    const int64_t strips = (N + NR - 1) / NR, most0 = NCB * 1024 / 4 / KC / NR, most = most0 > 0 ? most0 : 1;
    const int64_t blocks = (strips + most - 1) / most;
    return (strips + blocks - 1) / blocks * NR;
}

/* Pack b's rows k0 .. k0 + kc and columns j0 .. j0 + nc (zeros past N) into strips [nc / NR][kc][NR];
   b[k][j] at b[k bk + j bn]. */
static void pack_b(float *dst, const float *b, int64_t bk, int64_t bn, int64_t k0, int64_t kc, int64_t N,
                   int64_t j0, int64_t nc)
{
    for (int64_t s = 0; s < nc; s += NR) {
        float *strip = dst + s * kc;
        const int64_t j = j0 + s, w = N - j < NR ? (N - j > 0 ? N - j : 0) : NR;
        if (bn == 1) {                 /* b [K, N] row-major (a projection's [in, out] weight) */
            for (int64_t k = 0; k < kc; k++) {
                const float *src = b + (k0 + k) * bk + j;
                float *row = strip + k * NR;
                if (w == NR) memcpy(row, src, NR * sizeof(float));
                else {
                    for (int64_t t = 0; t < w; t++) row[t] = src[t];
                    for (int64_t t = w; t < NR; t++) row[t] = 0.0f;
                }
            }
        } else {                       /* b given by its rows of K (the output layer's [vocab, hidden] weight) */
            for (int64_t t = 0; t < NR; t++) {
                if (t < w) {
                    const float *src = b + (j + t) * bn + k0 * bk;
                    for (int64_t k = 0; k < kc; k++) strip[k * NR + t] = src[k * bk];
                } else
                    for (int64_t k = 0; k < kc; k++) strip[k * NR + t] = 0.0f;
            }
        }
    }
}

/* The epilogue of one tile on whole vectors: y = acc (+ bias); c = y (SET) or c + y (ADD, scale 1) or
   c + scale * y (ADD); ct: the tile's first element, ldc apart. */
static inline __attribute__((always_inline)) void finish(vr acc[MR][NV], float *ct, int64_t ldc,
                                                         const float *bias, int mode, float scale, int scaled)
{
    vr bv[NV];
    for (int t = 0; t < NV; t++) bv[t] = bias ? VLOAD(bias + t * VW) : VZERO();
    const vr s = VSET1(scale);
    for (int r = 0; r < MR; r++) {
        float *cr = ct + r * ldc;
        for (int t = 0; t < NV; t++) {
            vr y = acc[r][t];
            if (bias) y = VADD(y, bv[t]);
            if (mode == ADD) {
                if (scaled) y = VMUL(y, s);
                y = VADD(VLOAD(cr + t * VW), y);
            }
            VSTORE(cr + t * VW, y);
        }
    }
}

/* acc += the MR x NR tile's products over the kc k of a chunk, in order: row r of a from ar[r] (its k0-th
   element on), b from the packed strip [kc][NR]; the chain of each element goes on where the last
   chunk left it. */
static inline __attribute__((always_inline)) void tile_sums(vr acc[MR][NV], const float *const ar[MR],
                                                            const float *bs, int64_t K)
{
    for (int64_t k = 0; k < K; k++) {
        vr bv[NV];
        for (int t = 0; t < NV; t++) bv[t] = VLOAD(bs + k * NR + t * VW);
        for (int r = 0; r < MR; r++) {
            const vr x = VSET1(ar[r][k]);
            for (int t = 0; t < NV; t++) acc[r][t] = VFMA(x, bv[t], acc[r][t]);
        }
    }
}

/* c [M, N] (rows ldc apart) = a @ b (+ bias) (mode SET) or c += scale * (a @ b (+ bias)) (mode ADD; scale
   1 is a plain add). a [M, K] rows lda apart; b[k][j] at b[k bk + j bn]; bias [N] or NULL.
   Tasks are blocks of mc rows x nc columns, handed out dynamically; within one, K runs in chunks of
   at most KC (their bounds depend on K alone), each tile's sums kept in `part` between chunks. */
void ordered_gemm(const float *a, int64_t lda, const float *b, int64_t bk, int64_t bn, const float *bias,
                  float *c, int64_t ldc, int64_t M, int64_t N, int64_t K, int mode, float scale, int nthreads)
{
    if (M <= 0 || N <= 0) return;
    const int64_t nc = block_cols(N), mc = M < MC ? (M + MR - 1) / MR * MR : MC;
    const int64_t nb = (N + nc - 1) / nc, mb = (M + mc - 1) / mc;
    const int64_t chunks = K > 0 ? (K + KC - 1) / KC : 1, kcs = K > 0 ? (K + chunks - 1) / chunks : 1;
    const int scaled = scale != 1.0f;
    int used = nthreads;
    if (used > nb * mb) used = (int)(nb * mb);
    if (used < 1) used = 1;
    #pragma omp parallel num_threads(used)
    {
        float *bp = aligned_alloc(64, (size_t)((nc * kcs * chunks * 4 + 63) / 64 * 64));  /* every chunk of a block's columns */
        int64_t packed = -1;
        float *part = chunks > 1 ? aligned_alloc(64, (size_t)(mc * nc * 4)) : NULL;
        float bias_t[NR] __attribute__((aligned(64)));
        float tmp[MR * NR] __attribute__((aligned(64)));
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < nb * mb; t++) {
            const int64_t jb = t / mb, ib = t % mb, j0 = jb * nc, i0 = ib * mc;
            const int64_t ncols = N - j0 < nc ? N - j0 : nc, nrows = M - i0 < mc ? M - i0 : mc;
            const int64_t ncp = (ncols + NR - 1) / NR * NR, mcp = (nrows + MR - 1) / MR * MR;
            if (packed != jb) {        /* a thread's next block mostly has the same columns */
                for (int64_t ch = 0; ch < chunks; ch++) {
                    const int64_t k0 = ch * kcs, kc = K - k0 < kcs ? K - k0 : kcs;
                    pack_b(bp + ch * nc * kcs, b, bk, bn, k0, kc, N, j0, ncp);
                }
                packed = jb;
            }
            for (int64_t ch = 0; ch < chunks; ch++) {
                const int64_t k0 = ch * kcs, kc = K - k0 < kcs ? K - k0 : kcs;
                const int first = ch == 0, last = ch == chunks - 1;
                const float *bc = bp + ch * nc * kcs;
                for (int64_t s = 0; s < ncp; s += NR) {
                    const int64_t j = j0 + s, w = N - j < NR ? N - j : NR;
                    const float *bs = bias;
                    if (bias && w < NR) {
                        for (int64_t q = 0; q < NR; q++) bias_t[q] = q < w ? bias[j + q] : 0.0f;
                        bs = bias_t;
                    } else if (bias) bs = bias + j;
                    for (int64_t r0 = 0; r0 < mcp; r0 += MR) {
                        const int64_t i = i0 + r0, h = M - i < MR ? M - i : MR;
                        float *pt = part ? part + (r0 * ncp + s * MR) : NULL;  /* this tile's [MR][NR] sums */
                        const float *ar[MR];  /* rows past M repeat the last one (computed, not stored) */
                        for (int r = 0; r < MR; r++) ar[r] = a + (i + r < M ? i + r : M - 1) * lda + k0;
                        vr acc[MR][NV];
                        for (int r = 0; r < MR; r++)
                            for (int t = 0; t < NV; t++) acc[r][t] = first ? VZERO() : VLOAD(pt + r * NR + t * VW);
                        tile_sums(acc, ar, bc + s * kc, kc);
                        if (!last) {
                            for (int r = 0; r < MR; r++)
                                for (int t = 0; t < NV; t++) VSTORE(pt + r * NR + t * VW, acc[r][t]);
                        } else if (h == MR && w == NR)
                            finish(acc, c + i * ldc + j, ldc, bs, mode, scale, scaled);
                        else {         /* an edge tile: through a whole scratch tile, the same vector code */
                            for (int64_t r = 0; r < MR; r++)
                                for (int64_t q = 0; q < NR; q++)
                                    tmp[r * NR + q] = (mode == ADD && r < h && q < w) ? c[(i + r) * ldc + j + q] : 0.0f;
                            finish(acc, tmp, NR, bs, mode, scale, scaled);
                            for (int64_t r = 0; r < h; r++)
                                memcpy(c + (i + r) * ldc + j, tmp + r * NR, (size_t)w * sizeof(float));
                        }
                    }
                }
            }
        }
        free(bp);
        free(part);
    }
}

/* lse[i] = log(sum_j exp(x[i][j])) for x [n, d] rows ldx apart: the row's max, then exp(x - max) summed
   in whole vectors of VEXP_W lanes (lanes past d zero) and the lanes added in a fixed order. */
void lse_rows(const float *x, int64_t n, int64_t d, int64_t ldx, float *lse, int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + i * ldx;
        float mx = -INFINITY;  /* a max is exact in any order */
        for (int64_t j = 0; j < d; j++) mx = xr[j] > mx ? xr[j] : mx;
        vexp_f sums = {0};
        for (int64_t j = 0; j < d; j += VEXP_W) {
            vexp_f v;
            if (j + VEXP_W <= d) memcpy(&v, xr + j, sizeof v);
            else
                for (int l = 0; l < VEXP_W; l++) v[l] = j + l < d ? xr[j + l] : -INFINITY;
            v = vexpv(v - mx);
            if (j + VEXP_W > d)
                for (int l = 0; l < VEXP_W; l++) if (j + l >= d) v[l] = 0.0f;
            sums += v;
        }
        float sum = 0.0f;
        for (int l = 0; l < VEXP_W; l++) sum += sums[l];
        lse[i] = mx + logf(sum);
    }
}
#else
int built(void) { return 0; }
int tile_rows(void) { return 0; }
int tile_cols(void) { return 0; }
#endif
