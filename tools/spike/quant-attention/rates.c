// One core's rates of attention's candidate instructions (BENCHMARKS.md, twenty-first step):
// 12 independent accumulators on registers, 50 M iterations, for `vpdpbusd`, `vpdpwssd`,
// `vfmadd231ps`, `vpmaddwd` and `vdpbf16ps` on zmm, and `vpdpwssd` (AVX-VNNI),
// `vfmadd231ps`, `vpmaddwd` and `vpaddd` on ymm (the AVX2 int8 kernel's and int13 tiles'
// pair): instructions a second, from which multiply-adds a second follow
// (zmm: vpdpwssd 32 a instruction, vfmadd231ps 16, vpdpbusd 64, vdpbf16ps 32). A check, not
// part of any build:
//
//     gcc -O2 -march=native tools/spike/quant-attention/rates.c -o /tmp/rates && /tmp/rates
//
// (on a CPU without one of the instructions, remove its lines.)
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define STEP(INS, REG, ACC) INS " %%" REG "1, %%" REG "2, %%" REG ACC "\n"
#define BODY(INS, REG)                                                                  \
  __asm__ volatile("mov %0, %%rcx\n1:\n" STEP(INS, REG, "4") STEP(INS, REG, "5")        \
                       STEP(INS, REG, "6") STEP(INS, REG, "7") STEP(INS, REG, "8")      \
                           STEP(INS, REG, "9") STEP(INS, REG, "10") STEP(INS, REG, "11") \
                               STEP(INS, REG, "12") STEP(INS, REG, "13")                 \
                                   STEP(INS, REG, "14") STEP(INS, REG, "15")             \
                   "dec %%rcx\njnz 1b\n"                                                \
                   :                                                                    \
                   : "r"(n)                                                             \
                   : "rcx", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",    \
                     "xmm11", "xmm12", "xmm13", "xmm14", "xmm15")

int main(void) {
  const long n = 50000000;
  for (int rep = 0; rep < 2; rep++) {
    double t;
#define RATE(INS, REG, NAME)                                           \
  t = now();                                                           \
  BODY(INS, REG);                                                      \
  printf("%-22s %.2f G instructions/s\n", NAME, n * 12 / (now() - t) / 1e9);
    RATE("vpdpbusd", "zmm", "vpdpbusd zmm");
    RATE("vpdpwssd", "zmm", "vpdpwssd zmm");
    RATE("vfmadd231ps", "zmm", "vfmadd231ps zmm");
    RATE("vpmaddwd", "zmm", "vpmaddwd zmm");
    RATE("vdpbf16ps", "zmm", "vdpbf16ps zmm");
    RATE("vpdpwssd", "ymm", "vpdpwssd ymm");
    RATE("vfmadd231ps", "ymm", "vfmadd231ps ymm");
    RATE("vpmaddwd", "ymm", "vpmaddwd ymm");
    RATE("vpaddd", "ymm", "vpaddd ymm");
  }
  return 0;
}
