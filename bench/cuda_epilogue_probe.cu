// Probe of the bar block's erf-GELU epilogue (kernel k5 of bench/cuda_bert_block.py's model at bf16:
// y = gelu_erf(y + bias) in place over [2048, 3072] bf16) in several code forms, timed with CUDA events,
// to decide the pointwise launch form and the arithmetic the code generator emits
// (docs/BENCHMARKS.md, "Thirteenth session"). Build and run on the GPU box:
//   nvcc -O3 -arch=sm_90 -o /tmp/probe bench/cuda_epilogue_probe.cu && /tmp/probe
#include <cstdio>
#include <cstdlib>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

// bf16 through CUDA's own type and conversions (round to nearest even, as tessel's prelude does)
typedef __nv_bfloat16 tsl_bf16;
__device__ __forceinline__ float tsl_bf2f(tsl_bf16 h) { return __bfloat162float(h); }
__device__ __forceinline__ tsl_bf16 tsl_f2bf(float f) { return __float2bfloat16(f); }
__device__ __forceinline__ float lo_f(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_f(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ unsigned pack(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&h);
}

constexpr int N = 3072, TOTAL = 2048 * 3072;

__device__ __forceinline__ float gelu_div(float x) { return (x * (erff(x / 1.4142135f) + 1.0f)) * 0.5f; }
__device__ __forceinline__ float gelu_mul(float x) { return (x * (erff(x * 0.70710678f) + 1.0f)) * 0.5f; }
__device__ __forceinline__ float cheap(float x) { return (x * (x * 0.70710678f + 1.0f)) * 0.5f; }

// the form before this session: one element per thread and grid-stride step
__global__ void gen1(const tsl_bf16* __restrict__ a2, tsl_bf16* __restrict__ a3) {
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < TOTAL; e += gridDim.x * blockDim.x) {
    const int o0 = e / N, i0 = e % N;
    a3[o0 * N + i0] = tsl_f2bf(gelu_div(tsl_bf2f(a2[i0]) + tsl_bf2f(a3[o0 * N + i0])));
  }
}

// U elements a block's width apart, loads first (the generator's form since this session)
template <int U, int MODE>
__global__ void genU(const tsl_bf16* __restrict__ a2, tsl_bf16* __restrict__ a3) {
  for (int e0 = blockIdx.x * blockDim.x * U + threadIdx.x; e0 < TOTAL; e0 += gridDim.x * blockDim.x * U) {
    tsl_bf16 sv[U];
    int sx[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = e0 + u * (int)blockDim.x < TOTAL ? e0 + u * (int)blockDim.x : TOTAL - 1;
      const int o0 = e / N, i0 = e % N;
      const float x = tsl_bf2f(a2[i0]) + tsl_bf2f(a3[o0 * N + i0]);
      sv[u] = tsl_f2bf(MODE == 0 ? gelu_div(x) : MODE == 1 ? gelu_mul(x) : cheap(x));
      sx[u] = o0 * N + i0;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (e0 + u * (int)blockDim.x >= TOTAL) break;
      a3[sx[u]] = sv[u];
    }
  }
}

// 8 adjacent elements per thread through one 16-byte load and store
template <int MODE>
__global__ void vec8(const tsl_bf16* __restrict__ a2, tsl_bf16* __restrict__ a3) {
  for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < TOTAL / 8; v += gridDim.x * blockDim.x) {
    const int e = v * 8, i0 = e % N;
    const uint4 y = reinterpret_cast<const uint4*>(a3)[v];
    const uint4 b = *reinterpret_cast<const uint4*>(a2 + i0);
    const unsigned yw[4] = {y.x, y.y, y.z, y.w}, bw[4] = {b.x, b.y, b.z, b.w};
    unsigned r[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float x0 = lo_f(yw[j]) + lo_f(bw[j]), x1 = hi_f(yw[j]) + hi_f(bw[j]);
      r[j] = MODE == 0 ? pack(gelu_div(x0), gelu_div(x1)) : MODE == 1 ? pack(gelu_mul(x0), gelu_mul(x1)) : pack(cheap(x0), cheap(x1));
    }
    reinterpret_cast<uint4*>(a3)[v] = make_uint4(r[0], r[1], r[2], r[3]);
  }
}

__global__ void copy8(const uint4* __restrict__ x, uint4* __restrict__ y) {
  for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < TOTAL / 8; v += gridDim.x * blockDim.x) y[v] = x[v];
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

template <class F>
void timeit(const char* name, F launch, double bytes) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 20; ++i) launch();
  CK(cudaEventRecord(a));
  const int iters = 200;
  for (int i = 0; i < iters; ++i) launch();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  const double us = ms * 1e3 / iters;
  printf("%-28s %8.2f us  %6.2f TB/s\n", name, us, bytes / (us * 1e-6) / 1e12);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  tsl_bf16 *a2, *a3, *c;
  CK(cudaMalloc(&a2, N * 2));
  CK(cudaMalloc(&a3, (size_t)TOTAL * 2));
  CK(cudaMalloc(&c, (size_t)TOTAL * 2));
  CK(cudaMemset(a2, 0x3c, N * 2));  // 0x3c3c: bf16 0.0115
  CK(cudaMemset(a3, 0x3c, (size_t)TOTAL * 2));
  const double bytes = 2.0 * TOTAL * 2;
  const int waves = sms * 8;
  auto blocks = [&](long per) { long b = (TOTAL + per - 1) / per; return (int)(b < waves ? b : waves); };
  printf("%d SMs, %d elements bf16 in place (%.1f MB moved)\n", sms, TOTAL, bytes / 1e6);
  timeit("copy 16-byte", [&] { copy8<<<blocks(256 * 8), 256>>>((const uint4*)a3, (uint4*)c); }, bytes);
  timeit("gen1 div (before)", [&] { gen1<<<blocks(256), 256>>>(a2, a3); }, bytes);
  timeit("gen8 div (now)", [&] { genU<8, 0><<<blocks(256 * 8), 256>>>(a2, a3); }, bytes);
  timeit("gen8 mul", [&] { genU<8, 1><<<blocks(256 * 8), 256>>>(a2, a3); }, bytes);
  timeit("gen8 no erf", [&] { genU<8, 2><<<blocks(256 * 8), 256>>>(a2, a3); }, bytes);
  timeit("gen4 mul", [&] { genU<4, 1><<<blocks(256 * 4), 256>>>(a2, a3); }, bytes);
  timeit("gen8 mul, 2x grid", [&] { genU<8, 1><<<2 * blocks(256 * 8), 256>>>(a2, a3); }, bytes);
  timeit("vec8 div", [&] { vec8<0><<<blocks(256 * 8), 256>>>(a2, a3); }, bytes);
  timeit("vec8 mul", [&] { vec8<1><<<blocks(256 * 8), 256>>>(a2, a3); }, bytes);
  timeit("vec8 no erf", [&] { vec8<2><<<blocks(256 * 8), 256>>>(a2, a3); }, bytes);
  CK(cudaDeviceSynchronize());
  return 0;
}
