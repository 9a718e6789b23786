// The AMX-INT8 peak of one core: `tdpbusd` on tiles already in registers (no memory traffic),
// four independent accumulators, after a check of one product against plain C. Report only,
// the ceiling that BENCHMARKS.md divides the engine's figures by; nothing in ruri uses it.
//
//   gcc -O2 -mamx-tile -mamx-int8 tools/spike/int8-gemm/amx_peak.c -o /tmp/amx_peak && /tmp/amx_peak
//
// Linux grants the tile state on request (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA),
// as ruri-native's kernel does.
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

int main(void) {
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
    puts("no AMX tile state for this process (CPU or kernel without AMX)");
    return 1;
  }
  tile_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int i = 0; i < 8; i++) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = 16;
  }
  _tile_loadconfig(&cfg);
  static uint8_t a[16 * 64];
  static int8_t b[16 * 64];
  static int32_t c[16 * 16];
  for (int i = 0; i < 16 * 64; i++) {
    a[i] = (uint8_t)(i % 251);
    b[i] = (int8_t)((i * 7) % 255 - 127);
  }
  _tile_zero(0);
  _tile_loadd(1, a, 64);
  _tile_loadd(2, b, 64);
  _tile_dpbusd(0, 1, 2);
  _tile_stored(0, c, 64);
  int ok = 1;
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) {
      int32_t s = 0;
      for (int k = 0; k < 64; k++) s += a[m * 64 + k] * b[(k / 4) * 64 + n * 4 + k % 4];
      ok &= s == c[m * 16 + n];
    }
  printf("one tile product equals plain C: %s\n", ok ? "yes" : "NO");
  _tile_zero(0);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  const long iters = 20000000;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < iters; i++) {
    _tile_dpbusd(0, 1, 2);
    _tile_dpbusd(3, 1, 2);
    _tile_dpbusd(4, 1, 2);
    _tile_dpbusd(5, 1, 2);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  printf("AMX tdpbusd, registers only, one core: %.0f G MAC/s\n", iters * 4.0 * 16 * 16 * 64 / s / 1e9);
  _tile_release();
  return !ok;
}
