#!/usr/bin/env bash
# The float32 FMA peak of this CPU: every core runs independent fused multiply-adds on registers
# (no memory traffic), once at 256 bits (AVX2) and once at 512 bits (AVX-512, if the CPU has it).
# No GEMM can beat it; docs/performance.md uses it to bound what float32 can reach under the AVX2 caps.
# Needs a C compiler with OpenMP (gcc). usage: scripts/fma_peak.sh   (OMP_NUM_THREADS=... to pick cores)
set -euo pipefail
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cat > "$work/peak.c" <<'C'
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#ifdef WIDE
typedef __m512 vec;
#define FMA _mm512_fmadd_ps
#define SET _mm512_set1_ps
#define LANES 16
#else
typedef __m256 vec;
#define FMA _mm256_fmadd_ps
#define SET _mm256_set1_ps
#define LANES 8
#endif
int main(void) {
    const long iters = 1000000000L;
    float sum = 0;
    double t0 = omp_get_wtime();
#pragma omp parallel reduction(+ : sum)
    {
        vec a[12], b = SET(1.0000001f), c = SET(1e-7f);  /* 12 chains: more than latency x pipes */
        for (int i = 0; i < 12; i++) a[i] = SET((float)i);
        for (long n = 0; n < iters; n++)
            for (int i = 0; i < 12; i++) a[i] = FMA(a[i], b, c);
        for (int i = 0; i < 12; i++) sum += ((float *)&a[i])[0];
    }
    double t = omp_get_wtime() - t0;
    volatile float keep = sum;  /* the chains' results are used, so the compiler keeps every FMA */
    (void)keep;
    int threads = omp_get_max_threads();
    printf("%-8s %d threads: %6.1f GFLOP/s float32 FMA peak (%.2f s)\n", LANES == 16 ? "AVX-512" : "AVX2",
           threads, threads * (double)iters * 12 * LANES * 2 / t / 1e9, t);
    return 0;
}
C
gcc -O3 -mavx2 -mfma -fopenmp "$work/peak.c" -o "$work/avx2"
"$work/avx2"
if grep -qw avx512f /proc/cpuinfo; then
    gcc -O3 -mavx512f -DWIDE -fopenmp "$work/peak.c" -o "$work/avx512"
    "$work/avx512"
fi
