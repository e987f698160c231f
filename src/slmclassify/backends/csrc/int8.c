/* Fused per-token int8 quantise and dequantise passes and the vpmaddubsw GEMM (int8_kernels.py binds them). */
#include <stdint.h>
#include <math.h>
#include <string.h>

#include "vexp.h"

/* rintf rounds half to even (the default rounding mode) and, unlike roundevenf, vectorises.
   Per row, asymmetric over the row's own range [lo, hi] of v = x * mult (0 for outlier channels):
   scale = (hi - lo) / 255, zero z = rint(lo / scale) (<= 0), q [n, d] uint8 (row stride ldq) = clamp(rint(v / scale) - z, 0, 255),
   so v ~ scale * (q + z); rscale [n] = scale (* 1/rms(x) when eps >= 0), zrow [n] = z;
   outv [n, k] = x[outl] * outl_mult (* 1/rms).
   With AVX2, 32 columns at a time in registers (`range32`, `quantise32`), the tail as the plain loops:
   GCC's own vectorisation of the plain loops is slow (one dependency chain for the reductions; the
   clamp and the narrowing to bytes as masks and permutes). */
#if defined(__AVX2__)
#include <immintrin.h>

/* The sums of squares, minima and maxima of x[0 .. 32 c) and x * mult, in four independent chains. */
static inline int64_t range32(const float *x, const float *mult, int64_t d, float *ss, float *lo, float *hi)
{
    __m256 s[4], l[4], h[4];
    for (int u = 0; u < 4; u++) s[u] = l[u] = h[u] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= d; j += 32)
        for (int u = 0; u < 4; u++) {
            const __m256 xv = _mm256_loadu_ps(x + j + 8 * u), v = _mm256_mul_ps(xv, _mm256_loadu_ps(mult + j + 8 * u));
            s[u] = _mm256_fmadd_ps(xv, xv, s[u]);
            l[u] = _mm256_min_ps(l[u], v);
            h[u] = _mm256_max_ps(h[u], v);
        }
    __m256 st = _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3]));
    __m256 lt = _mm256_min_ps(_mm256_min_ps(l[0], l[1]), _mm256_min_ps(l[2], l[3]));
    __m256 ht = _mm256_max_ps(_mm256_max_ps(h[0], h[1]), _mm256_max_ps(h[2], h[3]));
    float sf[8], lf[8], hf[8];
    _mm256_storeu_ps(sf, st);
    _mm256_storeu_ps(lf, lt);
    _mm256_storeu_ps(hf, ht);
    for (int u = 0; u < 8; u++) {
        *ss += sf[u];
        *lo = lf[u] < *lo ? lf[u] : *lo;
        *hi = hf[u] > *hi ? hf[u] : *hi;
    }
    return j;
}

/* q[0 .. 32 c) = clamp(rint(x * mult * s) - z, 0, 255): the clamp is the saturation of the two packs. */
static inline int64_t quantise32(const float *x, const float *mult, int64_t d, float s, float z, uint8_t *q)
{
    const __m256 sv = _mm256_set1_ps(s);
    const __m256i zv = _mm256_set1_epi32((int32_t)z), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int64_t j = 0;
    for (; j + 32 <= d; j += 32) {
        __m256i i[4];
        for (int u = 0; u < 4; u++) {
            const __m256 xm = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * u), _mm256_loadu_ps(mult + j + 8 * u));
            const __m256 v = _mm256_mul_ps(xm, sv);
            i[u] = _mm256_sub_epi32(_mm256_cvtps_epi32(v), zv);  /* cvtps rounds half to even, as rintf */
        }
        const __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        _mm256_storeu_si256((__m256i *)(q + j), _mm256_permutevar8x32_epi32(b, order));
    }
    return j;
}
#endif

void quantise_rows(const float *x, int64_t n, int64_t d, int64_t ldx, const float *mult, float eps,
                   uint8_t *q, int64_t ldq, float *rscale, float *zrow, const int64_t *outl, int64_t k, const float *outl_mult,
                   float *outv, int nthreads)
{
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + i * ldx;
        float ss = 0.0f, lo = 0.0f, hi = 0.0f;  /* one pass for the norm and the range */
        int64_t j0 = 0;
#if defined(__AVX2__)
        j0 = range32(xr, mult, d, &ss, &lo, &hi);
#endif
        #pragma omp simd reduction(+:ss) reduction(min:lo) reduction(max:hi)
        for (int64_t j = j0; j < d; j++) {
            float v = xr[j] * mult[j];
            ss += xr[j] * xr[j];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        const float rfac = eps >= 0.0f ? 1.0f / sqrtf(ss / (float)d + eps) : 1.0f;
        float scale = (hi - lo) / 255.0f;
        if (scale < 1e-30f) scale = 1e-30f;
        float s = 1.0f / scale;
        float z = __builtin_rintf(lo * s);
        uint8_t *qr = q + i * ldq;
        j0 = 0;
#if defined(__AVX2__)
        j0 = quantise32(xr, mult, d, s, z, qr);
#endif
        #pragma omp simd
        for (int64_t j = j0; j < d; j++) {
            float v = __builtin_rintf(xr[j] * mult[j] * s) - z;
            v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
            qr[j] = (uint8_t)(int32_t)v;
        }
        rscale[i] = scale * rfac;
        zrow[i] = z;
        for (int64_t t = 0; t < k; t++) outv[i * k + t] = xr[outl[t]] * outl_mult[t] * rfac;
    }
}

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
        silu_mul(act + i * lda, ar, ar + m, m);
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

#if defined(__AVX2__)

/* CPUs without VNNI (AVX2 only, AVX-512 without VNNI) multiply u8 x s8 with vpmaddubsw, which adds each pair of
   products in 16 bits with saturation: exact for 7-bit weights (2 * 255 * 63 = 32130 <= 32767). The kernel below
   is that product with the dequantise pass as its epilogue, so the int32 sums never leave the registers; on
   ymm registers (LANES 8) with AVX2, on zmm (LANES 16) where AVX-512 BW is there.

   The packed weight: w [m, k] int8 as [blocks][ceil(k / 4)][2 LANES columns][4 k-steps]. Block b holds two groups
   of LANES output columns: with half = 0, columns 2 LANES b .. 2 LANES b + 2 LANES - 1; with half > 0 (m = 2 half,
   gate_up's [gate | up]), gate columns LANES b .. LANES b + LANES - 1 and the same of the up half, so that
   silu(gate) * up is one epilogue. Columns past the end are zeros. The per-column vectors (cs, colsum, bias,
   ow's rows) come in the packed order (`MaddubsWeight` packs both). */
#if defined(__AVX512BW__)
#define LANES 16
#define TILE_ROWS 6          /* rows per tile: 6 x 2 int32 accumulators (other counts measured no faster) */
typedef __m512i vi;
typedef __m512 vfl;
#define LOAD_I(p) _mm512_load_si512((const void *)(p))
#define SET1_I32 _mm512_set1_epi32
#define SET1_I16 _mm512_set1_epi16
#define ZERO_I _mm512_setzero_si512
#define MADDUBS _mm512_maddubs_epi16
#define MADD _mm512_madd_epi16
#define ADD_I32 _mm512_add_epi32
#define CVT _mm512_cvtepi32_ps
#define LOADU _mm512_loadu_ps
#define STOREU _mm512_storeu_ps
#define SET1 _mm512_set1_ps
#define ZERO _mm512_setzero_ps
#define MUL _mm512_mul_ps
#define ADD _mm512_add_ps
#define DIV _mm512_div_ps
#define FMADD _mm512_fmadd_ps
#define EXP(x) ((vfl)vexpv((vexp_f)(x)))
#else
#define LANES 8
#define TILE_ROWS 4          /* 4 x 2 int32 accumulators: the fastest count measured */
typedef __m256i vi;
typedef __m256 vfl;
#define LOAD_I(p) _mm256_load_si256((const __m256i *)(p))
#define SET1_I32 _mm256_set1_epi32
#define SET1_I16 _mm256_set1_epi16
#define ZERO_I _mm256_setzero_si256
#define MADDUBS _mm256_maddubs_epi16
#define MADD _mm256_madd_epi16
#define ADD_I32 _mm256_add_epi32
#define CVT _mm256_cvtepi32_ps
#define LOADU _mm256_loadu_ps
#define STOREU _mm256_storeu_ps
#define SET1 _mm256_set1_ps
#define ZERO _mm256_setzero_ps
#define MUL _mm256_mul_ps
#define ADD _mm256_add_ps
#define DIV _mm256_div_ps
#define FMADD _mm256_fmadd_ps
#define EXP(x) ((vfl)vexp8((v8f)(x)))
#endif
#define STEP (8 * LANES)     /* bytes of one 4-step of a block: 2 LANES columns x 4 */
#define MADDUBS_CHUNK 512    /* rows whose activations stay in L2 while every block passes over them */

int maddubs_built(void) { return 1; }
int maddubs_lanes(void) { return LANES; }

static inline int64_t group_start(int64_t b, int g, int64_t half)
{
    return half ? g * half + LANES * b : 2 * LANES * b + LANES * g;
}

static inline void store_part(float *dst, vfl v, int64_t count, int add)
{
    if (count >= LANES) {
        STOREU(dst, add ? ADD(v, LOADU(dst)) : v);
        return;
    }
    float f[LANES];
    STOREU(f, v);
    for (int64_t j = 0; j < count; j++) dst[j] = add ? dst[j] + f[j] : f[j];
}

/* The dequantised product of q [n, kp] uint8 (kp: k rounded up to 4, zero-padded) and the packed weight, per
   packed column p: f = (acc * cs[p] + zrow[i] * colsum[p]) * rscale[i] + bias[p] + outv[i, :] @ ow[:, p]
   (as dequantise_rows after oneDNN's acc * cs). mode 0: h = f; 1: h += f; 2 (half > 0): h [n, half] =
   silu(gate) * up. */
/* GCC's partial redundancy elimination (-ftree-pre) turns each accumulator of the inner loop into two registers
   and a copy per step: without it the loop issues fewer instructions and runs faster. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-pre")))
#endif
void maddubs_rows(float *h, int64_t ldh, const uint8_t *q, int64_t n, int64_t kp, const int8_t *bp, int64_t blocks,
                  int64_t m, int64_t half, const float *cs, const float *rscale, const float *zrow,
                  const float *colsum, const float *bias, const float *outv, int64_t k, const float *ow, int mode,
                  int nthreads)
{
    const int64_t k4 = kp / 4, mp = 2 * LANES * blocks;
    const vi ones = SET1_I16(1);
    #pragma omp parallel num_threads(nthreads)
    for (int64_t n0 = 0; n0 < n; n0 += MADDUBS_CHUNK) {
        const int64_t n1 = n0 + MADDUBS_CHUNK < n ? n0 + MADDUBS_CHUNK : n;
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            const int8_t *wb = bp + b * k4 * STEP;
            const int64_t p0 = 2 * LANES * b, c0 = group_start(b, 0, half), c1 = group_start(b, 1, half);
            const int64_t e0 = (half ? half : m) - c0, e1 = m - c1;  /* valid columns of each group (may be <= 0) */
            const vfl s0 = LOADU(cs + p0), s1 = LOADU(cs + p0 + LANES);
            const vfl u0 = LOADU(colsum + p0), u1 = LOADU(colsum + p0 + LANES);
            const vfl b0 = bias ? LOADU(bias + p0) : ZERO(), b1 = bias ? LOADU(bias + p0 + LANES) : ZERO();
            for (int64_t i = n0; i < n1; i += TILE_ROWS) {
                const int rows = n1 - i < TILE_ROWS ? (int)(n1 - i) : TILE_ROWS;
                vi acc[TILE_ROWS][2];
                int64_t row[TILE_ROWS];  /* a short tile repeats its first row (computed, not stored) */
                const uint8_t *qr[TILE_ROWS];
                for (int r = 0; r < TILE_ROWS; r++) {
                    acc[r][0] = acc[r][1] = ZERO_I();
                    row[r] = i + (r < rows ? r : 0);
                    qr[r] = q + row[r] * kp;
                }
                for (int64_t t = 0; t < k4; t++) {
                    const vi w0 = LOAD_I(wb + t * STEP), w1 = LOAD_I(wb + t * STEP + STEP / 2);
                    for (int r = 0; r < TILE_ROWS; r++) {
                        int32_t four;
                        memcpy(&four, qr[r] + 4 * t, 4);
                        const vi a = SET1_I32(four);
                        acc[r][0] = ADD_I32(acc[r][0], MADD(MADDUBS(a, w0), ones));
                        acc[r][1] = ADD_I32(acc[r][1], MADD(MADDUBS(a, w1), ones));
                    }
                }
                vfl f[TILE_ROWS][2];
                for (int r = 0; r < TILE_ROWS; r++) {
                    const vfl z = SET1(zrow[row[r]]), sc = SET1(rscale[row[r]]);
                    f[r][0] = ADD(MUL(FMADD(z, u0, MUL(CVT(acc[r][0]), s0)), sc), b0);
                    f[r][1] = ADD(MUL(FMADD(z, u1, MUL(CVT(acc[r][1]), s1)), sc), b1);
                }
                for (int64_t t = 0; t < k; t++) {  /* the outlier rows of ow read once a tile */
                    const vfl w0 = LOADU(ow + t * mp + p0), w1 = LOADU(ow + t * mp + p0 + LANES);
                    for (int r = 0; r < TILE_ROWS; r++) {
                        const vfl v = SET1(outv[row[r] * k + t]);
                        f[r][0] = FMADD(v, w0, f[r][0]);
                        f[r][1] = FMADD(v, w1, f[r][1]);
                    }
                }
                for (int r = 0; r < rows; r++) {
                    const vfl f0 = f[r][0], f1 = f[r][1];
                    float *hr = h + row[r] * ldh;
                    if (mode == 2) {
                        const vfl silu = DIV(f0, ADD(SET1(1.0f), EXP(MUL(f0, SET1(-1.0f)))));
                        store_part(hr + c0, MUL(silu, f1), e0, 0);
                    } else {
                        store_part(hr + c0, f0, e0, mode);
                        store_part(hr + c1, f1, e1, mode);
                    }
                }
            }
        }
    }
}
#else
int maddubs_built(void) { return 0; }
int maddubs_lanes(void) { return 0; }
#endif
