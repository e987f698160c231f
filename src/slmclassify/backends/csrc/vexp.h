/* exp(x) for the C kernels (int8.c, fp32_attention.c): `vexp` (scalar), `vexp8` (8 lanes), `vexpv`
   (VEXP_W lanes: the machine's width), and the two loops built on them, `exp_shifted` and `silu_mul`. */
#ifndef SLMCLASSIFY_VEXP_H
#define SLMCLASSIFY_VEXP_H

#include <stdint.h>
#include <string.h>

/* exp(x), Cephes' polynomial (relative error ~1e-7) in a form the compiler vectorises. */
static inline float vexp(float x)
{
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float f;
    memcpy(&f, &e, 4);
    return p * f;
}

/* The same on GCC vectors of 8 floats (any x86-64 level; 16 where AVX-512 is there: vexpv, VEXP_W lanes).
   Loops calling the scalar vexp vectorise under AVX-512 but not under AVX2, where GCC does not
   if-convert the float clamp ("control flow in loop"): a scalar exp per element there. Here the clamp
   is a bitwise select and rint is the 1.5 * 2^23 trick (round to nearest even, as rintf). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
#define VEXP_VECTOR(name, VF, VI)                                                                    \
static inline VF name(VF x)                                                                          \
{                                                                                                    \
    const VF zero = {0}, lo = zero - 87.0f, hi = zero + 88.0f, big = zero + 12582912.0f;             \
    const VI below = x < lo, above = x > hi;                                                         \
    x = (VF)(((VI)lo & below) | ((VI)hi & above) | ((VI)x & ~(below | above)));                     \
    const VF n = (x * 1.44269504088896341f + big) - big;                                             \
    VF r = x - n * 0.693359375f;                                                                     \
    r = r + n * 2.12194440e-4f;                                                                      \
    VF p = zero + 1.9875691500e-4f;                                                                  \
    p = p * r + 1.3981999507e-3f;                                                                    \
    p = p * r + 8.3334519073e-3f;                                                                    \
    p = p * r + 4.1665795894e-2f;                                                                    \
    p = p * r + 1.6666665459e-1f;                                                                    \
    p = p * r + 5.0000001201e-1f;                                                                    \
    p = p * r * r + r + 1.0f;                                                                        \
    return p * (VF)((__builtin_convertvector(n, VI) + 127) << 23);                                   \
}
VEXP_VECTOR(vexp8, v8f, v8i)
#ifdef __AVX512F__
#define VEXP_W 16
typedef float vexp_f __attribute__((vector_size(64)));
typedef int32_t vexp_i __attribute__((vector_size(64)));
VEXP_VECTOR(vexpv, vexp_f, vexp_i)
#else
#define VEXP_W 8
typedef v8f vexp_f;
#define vexpv vexp8
#endif

/* s[j] = exp(s[j] - shift) for j < n; returns their sum (a softmax's numerators and denominator).
   s has room up to n rounded up to VEXP_W floats: the last, partial vector is computed whole and
   its lanes from n on written as 0 (no scalar tail; whatever those lanes held is discarded). */
static inline float exp_shifted(float *s, int64_t n, float shift)
{
    vexp_f sums = {0};
    for (int64_t j = 0; j < n; j += VEXP_W) {
        vexp_f v;
        memcpy(&v, s + j, sizeof v);
        v = vexpv(v - shift);
        if (j + VEXP_W > n)
            for (int64_t i = n - j; i < VEXP_W; i++) v[i] = 0.0f;
        memcpy(s + j, &v, sizeof v);
        sums += v;
    }
    float sum = 0.0f;
    for (int i = 0; i < VEXP_W; i++) sum += sums[i];
    return sum;
}

/* out[j] = silu(g[j]) * u[j] = g[j] / (1 + exp(-g[j])) * u[j] for j < n (out may be g). */
static inline void silu_mul(float *out, const float *g, const float *u, int64_t n)
{
    int64_t j = 0;
    for (; j + VEXP_W <= n; j += VEXP_W) {
        vexp_f a, b;
        memcpy(&a, g + j, sizeof a);
        memcpy(&b, u + j, sizeof b);
        a = a / (1.0f + vexpv(-a)) * b;
        memcpy(out + j, &a, sizeof a);
    }
    for (; j < n; j++) out[j] = g[j] / (1.0f + vexp(-g[j])) * u[j];
}

#endif /* SLMCLASSIFY_VEXP_H */
