// The fp32 GEMM's tile shape outside ruri (BENCHMARKS.md, nineteenth step): an MR x (NV*16)
// tile of FMA accumulators in zmm registers, x broadcast a row at a time from an [k][MR]
// block, W read from k-major panels of NV*16 columns, as ruri-native's `simd_f32::fp32_gemm`
// does on AVX-512. Loops: blocks of `rb` rows, then K in chunks of `kc`, then panels, then
// the block's tiles. Counts the tiles' padded rows as work (M rounded up to MR).
//
//   gcc -O3 -march=native -DMR=6 -DNV=4 fp32_tile.c -o fp32_tile
//   ./fp32_tile K N M REPEATS [ROW_BLOCK [K_CHUNK]]      # N a multiple of NV*16
//   ./fp32_tile 64 64 192 20000      # everything in L1: the tile's own ceiling
//   ./fp32_tile 256 2048 64 40 66    # Wi of the 30m shape, one 64-row MLP call
//
// Best of REPEATS, in G multiply-adds a second, one thread.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#ifndef MR
#define MR 6
#endif
#ifndef NV
#define NV 4
#endif
#define NC (NV*16)
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
// xt: [k][MR], w: panel rows of NC floats (stride PS floats)
__attribute__((noinline)) void tile(const float* restrict xt, const float* restrict w, int k, int ps, float* restrict out, int ldo){
  __m512 acc[MR][NV];
  #pragma GCC unroll 16
  for(int i=0;i<MR;i++)
    #pragma GCC unroll 16
    for(int j=0;j<NV;j++) acc[i][j]=_mm512_setzero_ps();
  for(int kk=0;kk<k;kk++){
    __m512 wv[NV];
    #pragma GCC unroll 16
    for(int j=0;j<NV;j++) wv[j]=_mm512_load_ps(w+(size_t)kk*ps+j*16);
    #pragma GCC unroll 16
    for(int i=0;i<MR;i++){ __m512 b=_mm512_set1_ps(xt[kk*MR+i]);
      #pragma GCC unroll 16
      for(int j=0;j<NV;j++) acc[i][j]=_mm512_fmadd_ps(wv[j],b,acc[i][j]); }
  }
  #pragma GCC unroll 16
  for(int i=0;i<MR;i++)
    #pragma GCC unroll 16
    for(int j=0;j<NV;j++) _mm512_storeu_ps(out+i*ldo+j*16, _mm512_add_ps(_mm512_loadu_ps(out+i*ldo+j*16),acc[i][j]));
}
int main(int argc,char**argv){
  int K=atoi(argv[1]); int N=atoi(argv[2]); int M=atoi(argv[3]); int reps=atoi(argv[4]);
  int rb = (48/MR)*MR; if(argc>5) rb=atoi(argv[5])/MR*MR; int kc=K; if(argc>6) kc=atoi(argv[6]);
  int panels=N/NC;
  float* W=aligned_alloc(64,(size_t)panels*K*NC*4); for(size_t i=0;i<(size_t)panels*K*NC;i++) W[i]=(i%7)*0.01f;
  int tiles=(M+MR-1)/MR;
  float* XT=aligned_alloc(64,(size_t)tiles*K*MR*4+64); for(size_t i=0;i<(size_t)tiles*K*MR;i++) XT[i]=(i%5)*0.1f;
  float* O=aligned_alloc(64,(size_t)tiles*MR*N*4+64); memset(O,0,(size_t)tiles*MR*N*4);
  double best=1e9;
  for(int r=0;r<reps;r++){
    double t0=now();
    for(int t0r=0;t0r<tiles;t0r+=rb/MR){
      int tend=t0r+rb/MR; if(tend>tiles)tend=tiles;
      for(int k0=0;k0<K;k0+=kc)
      for(int p=0;p<panels;p++)
        for(int t=t0r;t<tend;t++)
          tile(XT+(size_t)t*K*MR+k0*MR, W+(size_t)p*K*NC+(size_t)k0*NC, kc, NC, O+(size_t)t*MR*N+p*NC, N);
    }
    double dt=now()-t0; if(dt<best)best=dt;
  }
  printf("MR=%d NV=%d K=%d N=%d M=%d rb=%d kc=%d: %.1f GMAC/s (%.3f) \n",MR,NV,K,N,M,rb,kc,(double)tiles*MR*N*K/best*1e-9, O[5]);
}
