// DeepSeek-V4's row operations on the GPU (kernels/v4_rows.h): the scale, and the key lists of
// the sparse attention: one thread per query counts its rows (kernels/hd/v4_rows.h), a CUB
// inclusive scan makes the offsets, and one thread per query writes its rows.
#include <cub/device/device_scan.cuh>
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/hd/v4_rows.h"

namespace trex::kern::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void scale_k(float* __restrict__ x, int64_t n, float a) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
    x[e] *= a;
}

__global__ void key_count_k(V4KeyShape s, const int32_t* __restrict__ seg, const int32_t* __restrict__ cnt,
                            const int32_t* __restrict__ sel, int64_t* __restrict__ n) {
  const int64_t N = s.B * s.T;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    n[i] = hd::v4_query_keys(s, seg, cnt, sel, i, nullptr);
}

__global__ void key_fill_k(V4KeyShape s, const int32_t* __restrict__ seg, const int32_t* __restrict__ cnt,
                           const int32_t* __restrict__ sel, const int64_t* __restrict__ off,
                           int32_t* __restrict__ idx) {
  const int64_t N = s.B * s.T;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    hd::v4_query_keys(s, seg, cnt, sel, i, idx + off[i]);
}

}  // namespace

void scale(const Ctx& c, float* x, int64_t n, float a) {
  if (n <= 0) return;
  scale_k<<<grid_for(n), kThreads, 0, c.stream>>>(x, n, a);
  TREX_CUDA_LAUNCHED("scale_k");
}

void v4_key_offsets(const Ctx& c, const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel,
                    int64_t* off) {
  const int64_t N = s.B * s.T;
  TREX_CUDA_CHECK(cudaMemsetAsync(off, 0, sizeof(int64_t), c.stream));
  if (N == 0) return;
  Scratch counts(c, N * sizeof(int64_t));
  key_count_k<<<grid_for(N), kThreads, 0, c.stream>>>(s, seg, cnt, sel, counts.as<int64_t>());
  TREX_CUDA_LAUNCHED("key_count_k");
  size_t bytes = 0;
  TREX_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, bytes, counts.as<int64_t>(), off + 1, (int)N, c.stream));
  Scratch tmp(c, bytes);
  TREX_CUDA_CHECK(
      cub::DeviceScan::InclusiveSum(tmp.as<void>(), bytes, counts.as<int64_t>(), off + 1, (int)N, c.stream));
}

void v4_key_fill(const Ctx& c, const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel,
                 const int64_t* off, int32_t* idx) {
  const int64_t N = s.B * s.T;
  if (N == 0) return;
  key_fill_k<<<grid_for(N), kThreads, 0, c.stream>>>(s, seg, cnt, sel, off, idx);
  TREX_CUDA_LAUNCHED("key_fill_k");
}

}  // namespace trex::kern::cuda
