// MUFU throughput: each thread applies the op ITER times to 8 independent values (f32 ops) or
// 4 packed pairs (x2 ops): the same element count. Session 11 microbenchmark (throw-away).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define ITER 2048
__device__ __forceinline__ float ex2f(float x) { float y; asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float tanhf_(float x) { float y; asm volatile("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ unsigned ex2h2(unsigned x) { unsigned y; asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x)); return y; }
__device__ __forceinline__ unsigned ex2b2(unsigned x) { unsigned y; asm volatile("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(y) : "r"(x)); return y; }
__device__ __forceinline__ unsigned tanhh2(unsigned x) { unsigned y; asm volatile("tanh.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x)); return y; }
__device__ __forceinline__ unsigned tanhb2(unsigned x) { unsigned y; asm volatile("tanh.approx.bf16x2 %0, %1;" : "=r"(y) : "r"(x)); return y; }

extern "C" __global__ void f32_ex2(float* out, float seed) {
  float v[8];
  for (int i = 0; i < 8; ++i) v[i] = seed * (threadIdx.x + i) * 1e-6f;
  for (int it = 0; it < ITER; ++it)
    for (int i = 0; i < 8; ++i) v[i] = ex2f(v[i]) - 1.0f;
  float s = 0; for (int i = 0; i < 8; ++i) s += v[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
extern "C" __global__ void f32_tanh(float* out, float seed) {
  float v[8];
  for (int i = 0; i < 8; ++i) v[i] = seed * (threadIdx.x + i) * 1e-6f;
  for (int it = 0; it < ITER; ++it)
    for (int i = 0; i < 8; ++i) v[i] = tanhf_(v[i]) + 0.5f;
  float s = 0; for (int i = 0; i < 8; ++i) s += v[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
#define X2(NAME, OP, ADD)                                                              \
extern "C" __global__ void NAME(float* out, float seed) {                              \
  unsigned v[4];                                                                       \
  for (int i = 0; i < 4; ++i) { __half2 h = __floats2half2_rn(seed * (threadIdx.x + i) * 1e-6f, 0.25f); v[i] = *(unsigned*)&h; } \
  for (int it = 0; it < ITER; ++it)                                                    \
    for (int i = 0; i < 4; ++i) v[i] = OP(v[i]) ^ ADD;                                 \
  unsigned s = 0; for (int i = 0; i < 4; ++i) s += v[i];                               \
  out[blockIdx.x * blockDim.x + threadIdx.x] = (float)s;                               \
}
X2(h2_ex2, ex2h2, 0x80008000u)
X2(b2_ex2, ex2b2, 0x80008000u)
X2(h2_tanh, tanhh2, 0x00010001u)
X2(b2_tanh, tanhb2, 0x00010001u)

// accuracy: apply once to n inputs (f32 in, f32 out through the packed op)
extern "C" __global__ void acc(const float* x, float* y, int n, int op) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (2 * i + 1 >= n) return;
  float a = x[2 * i], b = x[2 * i + 1];
  if (op == 0) { y[2*i] = ex2f(a); y[2*i+1] = ex2f(b); }
  else if (op == 1) { y[2*i] = tanhf_(a); y[2*i+1] = tanhf_(b); }
  else if (op == 2 || op == 4) { __half2 h = __floats2half2_rn(a, b); unsigned r = op == 2 ? ex2h2(*(unsigned*)&h) : tanhh2(*(unsigned*)&h); __half2 o = *(__half2*)&r; y[2*i] = __low2float(o); y[2*i+1] = __high2float(o); }
  else { __nv_bfloat162 h = __floats2bfloat162_rn(a, b); unsigned r = op == 3 ? ex2b2(*(unsigned*)&h) : tanhb2(*(unsigned*)&h); __nv_bfloat162 o = *(__nv_bfloat162*)&r; y[2*i] = __low2float(o); y[2*i+1] = __high2float(o); }
}
