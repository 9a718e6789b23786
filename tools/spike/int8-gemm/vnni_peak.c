// The register-only peaks of one core for the instructions ruri-native's x86 GEMMs are made
// of: `vpdpbusd` (AVX-512 VNNI, zmm and its 256-bit EVEX form) and, where present, AVX-VNNI's
// VEX form; and `vfmadd231ps` (zmm and ymm) for the fp32 GEMM. Sixteen independent
// accumulators each (more than latency × throughput on the CPUs measured), no memory traffic,
// after a check of the integer result against plain C. Report only: the ceilings that
// BENCHMARKS.md divides the engine's and the kernels' figures by; nothing in ruri uses it.
//
//   gcc -O3 -mavx512f -mavx512vl -mavx512vnni -mfma tools/spike/int8-gemm/vnni_peak.c \
//       -o /tmp/vnni_peak && /tmp/vnni_peak
//
// Multiply-adds per second: an int8 `vpdpbusd` does 4 per 32-bit lane, an fp32 FMA 1 per lane.
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define ACC 16
#define ITERS 100000000L

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Each body keeps ACC accumulators in registers (the compiler unrolls the constant loop) and
// folds them into one lane so that nothing is dead code.
__attribute__((noinline)) static int32_t dpbusd_zmm(long iters, __m512i w, __m512i x) {
  __m512i a[ACC];
  for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_epi32(i);
  for (long n = 0; n < iters; n++)
    for (int i = 0; i < ACC; i++) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
  __m512i s = a[0];
  for (int i = 1; i < ACC; i++) s = _mm512_add_epi32(s, a[i]);
  return _mm512_reduce_add_epi32(s);
}

__attribute__((noinline)) static int32_t dpbusd_ymm(long iters, __m256i w, __m256i x) {
  __m256i a[ACC];
  for (int i = 0; i < ACC; i++) a[i] = _mm256_set1_epi32(i);
  for (long n = 0; n < iters; n++)
    for (int i = 0; i < ACC; i++) a[i] = _mm256_dpbusd_epi32(a[i], w, x);
  __m256i s = a[0];
  for (int i = 1; i < ACC; i++) s = _mm256_add_epi32(s, a[i]);
  return _mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 7);
}

__attribute__((noinline)) static float fma_zmm(long iters, __m512 w, __m512 x) {
  __m512 a[ACC];
  for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_ps((float)i);
  for (long n = 0; n < iters; n++)
    for (int i = 0; i < ACC; i++) a[i] = _mm512_fmadd_ps(w, x, a[i]);
  __m512 s = a[0];
  for (int i = 1; i < ACC; i++) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((noinline)) static float fma_ymm(long iters, __m256 w, __m256 x) {
  __m256 a[ACC];
  for (int i = 0; i < ACC; i++) a[i] = _mm256_set1_ps((float)i);
  for (long n = 0; n < iters; n++)
    for (int i = 0; i < ACC; i++) a[i] = _mm256_fmadd_ps(w, x, a[i]);
  __m256 s = a[0];
  for (int i = 1; i < ACC; i++) s = _mm256_add_ps(s, a[i]);
  return _mm256_cvtss_f32(s);
}

int main(void) {
  // Check: one accumulator lane after `n` steps of Σ 4 · (u8 3 · s8 −2) from 0 is −24 n.
  {
    __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(-2);
    int32_t got = _mm512_cvtsi512_si32(_mm512_dpbusd_epi32(
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x), w, x));
    if (got != 2 * 4 * 3 * -2) {
      printf("vpdpbusd check failed: %d\n", got);
      return 1;
    }
  }
  const long iters = ITERS;
  double t0, t;
  volatile int32_t sink_i;
  volatile float sink_f;
  // Macs per call: iters · ACC · lanes · (4 for int8, 1 for fp32).
  t0 = now();
  sink_i = dpbusd_zmm(iters, _mm512_set1_epi8(1), _mm512_set1_epi8(2));
  t = now() - t0;
  printf("vpdpbusd zmm (AVX-512 VNNI)      %7.1f G MAC/s\n", iters * ACC * 64.0 / t / 1e9);
  t0 = now();
  sink_i = dpbusd_ymm(iters, _mm256_set1_epi8(1), _mm256_set1_epi8(2));
  t = now() - t0;
  printf("vpdpbusd ymm (AVX-512 VNNI, VL)  %7.1f G MAC/s\n", iters * ACC * 32.0 / t / 1e9);
  t0 = now();
  sink_f = fma_zmm(iters, _mm512_set1_ps(1.0f), _mm512_set1_ps(1e-9f));
  t = now() - t0;
  printf("vfmadd231ps zmm (fp32)           %7.1f G MAC/s\n", iters * ACC * 16.0 / t / 1e9);
  t0 = now();
  sink_f = fma_ymm(iters, _mm256_set1_ps(1.0f), _mm256_set1_ps(1e-9f));
  t = now() - t0;
  printf("vfmadd231ps ymm (fp32)           %7.1f G MAC/s\n", iters * ACC * 8.0 / t / 1e9);
  (void)sink_i;
  (void)sink_f;
  return 0;
}
