// Shared pieces of the CUDA kernels: warp and block sums (warp shuffles, then one value per warp
// through shared memory; the order of additions depends only on blockDim, so results are
// deterministic) and the grid size of a grid-stride loop (grid_for).
#pragma once
#include <cuda_runtime.h>

namespace trex::kern::cuda {

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class T>
__device__ __forceinline__ T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Every thread of the block gets the sum of v over the block (blockDim.x a multiple of 32, <= 1024).
template <class T>
__device__ T block_sum(T v) {
  __shared__ T part[32];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[wid] = v;
  __syncthreads();
  T s = lane < nw ? part[lane] : T(0);
  return warp_sum(s);
}

inline int grid_for(long long n, int threads = 256) {
  long long b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

}  // namespace trex::kern::cuda
