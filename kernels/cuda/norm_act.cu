// RMSNorm, SwiGLU and RoPE on CUDA. The arithmetic is kernels/hd/ (shared with the CPU
// reference); these kernels only walk the data.
//   rmsnorm_fwd: one block per row, block sum of x^2.
//   rmsnorm_bwd: one block per row for dx; dw in two deterministic passes: per chunk of 128
//                rows a partial column sum, then the partials added in chunk order.
//   swiglu:      one thread per (row, column) pair of gate and up.
//   rope:        one thread per (token, head, pair).
#include <cuda_bf16.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/hd/rmsnorm.h"
#include "kernels/hd/rope.h"
#include "kernels/hd/swiglu.h"

namespace trex::kern::cuda {

namespace {

constexpr int kRmsThreads = 256;
constexpr int64_t kDwChunk = 128;

__global__ void rmsnorm_fwd_k(const float* __restrict__ x, int64_t d, const float* __restrict__ w, float eps,
                              float* __restrict__ y, float* __restrict__ rstd) {
  const int64_t n = blockIdx.x;
  const float* xr = x + n * d;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xr[j] * xr[j];
  ss = block_sum(ss);
  const float r = hd::rms_rstd(ss, d, eps);
  if (rstd && threadIdx.x == 0) rstd[n] = r;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) y[n * d + j] = hd::rms_y(xr[j], w[j], r);
}

__global__ void rmsnorm_dx_k(const float* __restrict__ dy, const float* __restrict__ x, int64_t d,
                             const float* __restrict__ w, const float* __restrict__ rstd, float* __restrict__ dx) {
  const int64_t n = blockIdx.x;
  const float* xr = x + n * d;
  const float* dyr = dy + n * d;
  const float r = rstd[n];
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += dyr[j] * w[j] * (xr[j] * r);
  s = block_sum(s);
  const float m = s / static_cast<float>(d);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dx[n * d + j] = hd::rms_dx(dyr[j], xr[j], w[j], r, m);
}

// part: [chunks, d] = sum over the chunk's rows of dy * xhat.
__global__ void rmsnorm_dw_part_k(const float* __restrict__ dy, const float* __restrict__ x, int64_t N, int64_t d,
                                  const float* __restrict__ rstd, float* __restrict__ part) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, ch = blockIdx.y;
  if (j >= d) return;
  const int64_t n0 = ch * kDwChunk, n1 = min(N, n0 + kDwChunk);
  float s = 0.f;
  for (int64_t n = n0; n < n1; ++n) s += dy[n * d + j] * (x[n * d + j] * rstd[n]);
  part[ch * d + j] = s;
}

__global__ void rmsnorm_dw_sum_k(const float* __restrict__ part, int64_t chunks, int64_t d, float* __restrict__ dw) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= d) return;
  float s = 0.f;
  for (int64_t c = 0; c < chunks; ++c) s += part[c * d + j];
  dw[j] += s;
}

__global__ void swiglu_fwd_k(const float* __restrict__ gu, int64_t N, int64_t F, float limit, float* __restrict__ h) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * F; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / F, j = i % F;
    h[i] = hd::swiglu_fwd(gu[n * 2 * F + j], gu[n * 2 * F + F + j], limit);
  }
}

// T: float, or __nv_bfloat16 rounded as to_bf16_k rounds (kernels/cuda/rows.cu): its bits.
__device__ inline void put(float* p, float v) { *p = v; }
__device__ inline void put(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <class T>
__global__ void swiglu_bwd_k(const float* __restrict__ dh, const float* __restrict__ gu, int64_t N, int64_t F,
                             float limit, T* __restrict__ dgu) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * F; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / F, j = i % F;
    float dg, du;
    hd::swiglu_bwd(dh[i], gu[n * 2 * F + j], gu[n * 2 * F + F + j], limit, dg, du);
    put(dgu + n * 2 * F + j, dg);
    put(dgu + n * 2 * F + F + j, du);
  }
}

__global__ void rope_k(float* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D,
                       const int32_t* __restrict__ pos, const float* __restrict__ cos, const float* __restrict__ sin,
                       bool interleaved, bool inverse) {
  const int half = D / 2;
  const int64_t total = N * H * half;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(t % half);
    const int h = static_cast<int>((t / half) % H);
    const int64_t n = t / (int64_t(half) * H);
    const int64_t row = static_cast<int64_t>(pos[n]) * half;
    float* xp = x + n * stride_tok + h * stride_head;
    int ia, ib;
    hd::rope_pair(interleaved, i, D, ia, ib);
    hd::rope_rotate(xp[ia], xp[ib], cos[row + i], sin[row + i], inverse);
  }
}

}  // namespace

void rmsnorm_fwd(const Ctx& c, const float* x, int64_t N, int64_t d, const float* w, float eps, float* y,
                 float* rstd) {
  if (N <= 0) return;
  rmsnorm_fwd_k<<<static_cast<unsigned>(N), kRmsThreads, 0, c.stream>>>(x, d, w, eps, y, rstd);
  TREX_CUDA_LAUNCHED("rmsnorm_fwd");
}

void rmsnorm_bwd(const Ctx& c, const float* dy, const float* x, int64_t N, int64_t d, const float* w,
                 const float* rstd, float* dx, float* dw) {
  if (N <= 0) return;
  rmsnorm_dx_k<<<static_cast<unsigned>(N), kRmsThreads, 0, c.stream>>>(dy, x, d, w, rstd, dx);
  TREX_CUDA_LAUNCHED("rmsnorm_dx");
  const int64_t chunks = (N + kDwChunk - 1) / kDwChunk;
  Scratch part(c, chunks * d * sizeof(float));
  const dim3 g(static_cast<unsigned>((d + 255) / 256), static_cast<unsigned>(chunks));
  rmsnorm_dw_part_k<<<g, 256, 0, c.stream>>>(dy, x, N, d, rstd, part.as<float>());
  TREX_CUDA_LAUNCHED("rmsnorm_dw_part");
  rmsnorm_dw_sum_k<<<static_cast<unsigned>((d + 255) / 256), 256, 0, c.stream>>>(part.as<float>(), chunks, d, dw);
  TREX_CUDA_LAUNCHED("rmsnorm_dw_sum");
}

void swiglu_fwd(const Ctx& c, const float* gu, int64_t N, int64_t F, float limit, float* h) {
  if (N * F <= 0) return;
  swiglu_fwd_k<<<grid_for(N * F), 256, 0, c.stream>>>(gu, N, F, limit, h);
  TREX_CUDA_LAUNCHED("swiglu_fwd");
}

void swiglu_bwd(const Ctx& c, const float* dh, const float* gu, int64_t N, int64_t F, float limit, float* dgu) {
  if (N * F <= 0) return;
  swiglu_bwd_k<float><<<grid_for(N * F), 256, 0, c.stream>>>(dh, gu, N, F, limit, dgu);
  TREX_CUDA_LAUNCHED("swiglu_bwd");
}

void swiglu_bwd_bf16(const Ctx& c, const float* dh, const float* gu, int64_t N, int64_t F, float limit, bf16* dgu) {
  if (N * F <= 0) return;
  swiglu_bwd_k<__nv_bfloat16>
      <<<grid_for(N * F), 256, 0, c.stream>>>(dh, gu, N, F, limit, reinterpret_cast<__nv_bfloat16*>(dgu));
  TREX_CUDA_LAUNCHED("swiglu_bwd_bf16");
}

void rope_apply(const Ctx& c, float* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D,
                const int32_t* pos, const float* cos, const float* sin, RopeLayout layout, bool inverse) {
  const int64_t total = N * H * (D / 2);
  if (total <= 0) return;
  rope_k<<<grid_for(total), 256, 0, c.stream>>>(x, N, H, stride_tok, stride_head, D, pos, cos, sin,
                                               layout == RopeLayout::Interleaved, inverse);
  TREX_CUDA_LAUNCHED("rope_apply");
}

}  // namespace trex::kern::cuda
