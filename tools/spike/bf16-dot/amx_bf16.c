// Whether AMX-BF16's `tdpbf16ps` sums as `vdpbf16ps` does (report only; nothing in ruri uses
// AMX-BF16). Random 16 × 16 tiles of bfloat16 pairs (16 pairs a row, exponents in ±E) are
// multiplied into random f32 accumulators, and every lane is compared, bit for bit, with
// scalar models of the sum: pair by pair in either order, each product exact and each sum
// rounded to f32 (with and without flushing subnormal sums), the pair summed first, the whole
// dot product rounded once, and the products summed apart and then added to the accumulator.
//
//   gcc -O2 -mamx-tile -mamx-bf16 tools/spike/bf16-dot/amx_bf16.c -o /tmp/amx_bf16 -lm
//   /tmp/amx_bf16 [E]        (default 12)
//
// Linux grants the tile state on request (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
// On the Intel Xeon of BENCHMARKS.md's seventeenth step no model matched every lane, so AMX
// cannot run the bf16 definition (`vdpbf16ps`'s order and roundings) bit for bit.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

static uint64_t state = 88172645463325252ull;
static uint64_t next(void) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}
static float widen(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}
static uint32_t bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}
static float flush(float x) { return fabsf(x) < 1.17549435e-38f ? copysignf(0.f, x) : x; }
// A normal bfloat16 of random sign and mantissa, unbiased exponent in [-e, e].
static uint16_t random_bf16(int e) {
  int exponent = -e + (int)(next() % (uint64_t)(2 * e + 1));
  return (uint16_t)((next() & 1) << 15 | (uint16_t)(exponent + 127) << 7 | (next() & 0x7f));
}

int main(int argc, char **argv) {
  int e = argc > 1 ? atoi(argv[1]) : 12;
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
    puts("no AMX tile state for this process (CPU or kernel without AMX)");
    return 1;
  }
  tile_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int i = 0; i < 3; i++) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = 16;
  }
  _tile_loadconfig(&cfg);
  static uint16_t a[16 * 32], b[16 * 32];
  static float c[16 * 16], c0[16 * 16];
  enum { MODELS = 6 };
  const char *names[MODELS] = {
      "even, then odd; each sum rounded and flushed",
      "odd, then even (vdpbf16ps); each sum rounded and flushed",
      "odd, then even; no flushing",
      "the pair summed first, then rounded",
      "the whole dot product rounded once",
      "the products summed apart, then added to the accumulator",
  };
  long lanes = 0, equal[MODELS] = {0};
  for (int round = 0; round < 20000; round++) {
    for (int i = 0; i < 16 * 32; i++) {
      a[i] = random_bf16(e);
      b[i] = random_bf16(e);
    }
    for (int i = 0; i < 256; i++) c0[i] = widen(random_bf16(e + 5));
    _tile_loadd(0, c0, 64);
    _tile_loadd(1, a, 64);
    _tile_loadd(2, b, 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, c, 64);
    for (int m = 0; m < 16; m++)
      for (int n = 0; n < 16; n++) {
        float acc[MODELS];
        for (int v = 0; v < MODELS; v++) acc[v] = c0[m * 16 + n];
        double whole = c0[m * 16 + n], apart = 0;
        for (int k = 0; k < 16; k++) {
          float a0 = widen(a[m * 32 + 2 * k]), a1 = widen(a[m * 32 + 2 * k + 1]);
          float b0 = widen(b[k * 32 + 2 * n]), b1 = widen(b[k * 32 + 2 * n + 1]);
          acc[0] = flush(flush(acc[0] + a0 * b0) + a1 * b1);
          acc[1] = flush(flush(acc[1] + a1 * b1) + a0 * b0);
          acc[2] = (acc[2] + a1 * b1) + a0 * b0;
          acc[3] = flush((float)((double)acc[3] + ((double)a0 * b0 + (double)a1 * b1)));
          whole += (double)a0 * b0 + (double)a1 * b1;
          apart += (double)a0 * b0 + (double)a1 * b1;
        }
        acc[4] = (float)whole;
        acc[5] = c0[m * 16 + n] + (float)apart;
        lanes++;
        for (int v = 0; v < MODELS; v++) equal[v] += bits(acc[v]) == bits(c[m * 16 + n]);
      }
  }
  printf("tdpbf16ps, exponents within ±%d, %ld lanes; equal to the model, bit for bit:\n", e,
         lanes);
  for (int v = 0; v < MODELS; v++)
    printf("  %9ld (%6.2f %%)  %s\n", equal[v], 100.0 * equal[v] / lanes, names[v]);
  return 0;
}
