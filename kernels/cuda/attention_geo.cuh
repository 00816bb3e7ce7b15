// Shared by the CUDA attention paths (kernels/cuda/attention.cu: flash and f32 GEMM;
// kernels/cuda/attention_bf16.cu: bf16 GEMM): the problem's geometry, the visibility rule of
// kernels/attention.h, a block maximum, and the bf16 path's entry points.
#pragma once
#include <cuda_runtime.h>
#include <cstdint>
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace trex::kern::cuda {

struct Geo {
  int B, T, H, Dqk, Dv;
  float scale;
  int window;
  const int32_t* seg;
};

__device__ __forceinline__ bool visible(const Geo& g, int b, int t, int s) {
  if (s > t) return false;
  if (g.window > 0 && s <= t - g.window) return false;
  if (g.seg && g.seg[int64_t(b) * g.T + s] != g.seg[int64_t(b) * g.T + t]) return false;
  return true;
}

template <class T>
__device__ T block_max(T v) {
  __shared__ T part[32];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) part[wid] = v;
  __syncthreads();
  T m = lane < nw ? part[lane] : T(-INFINITY);
  return warp_max(m);
}

// The bf16 GEMM path (kernels/cuda/attention_bf16.cu), for AttnShape::prec == BF16. Dt: [B, H, T]
// rowsum(dO * O), computed by the caller.
void attention_fwd_bf16(const Ctx& c, const Geo& g, const float* q, const float* k, const float* v, float* o,
                        float* lse);
void attention_bwd_bf16(const Ctx& c, const Geo& g, const float* q, const float* k, const float* v,
                        const float* lse, const float* Dt, const float* dO, float* dq, float* dk, float* dv);

}  // namespace trex::kern::cuda
