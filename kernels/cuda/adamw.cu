// AdamW and the sum of squares on CUDA. The per-step scalars are formed on the host exactly as
// the CPU reference forms them (kernels/ref/adamw.h); the element update is kernels/hd/adamw.h.
// sum_squares is deterministic: fixed 4096-element chunks summed in double, then the chunk
// partials added in order by one block.
#include <cuda_bf16.h>
#include <algorithm>
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/hd/adamw.h"
#include "kernels/ref/adamw.h"

namespace trex::kern::cuda {

namespace {

constexpr int64_t kSsChunk = 4096;

__global__ void adamw_k(hd::AdamWConsts<float> s, float* __restrict__ p, const float* __restrict__ g,
                        float* __restrict__ m, float* __restrict__ v, int64_t n, __nv_bfloat16* __restrict__ pb) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    hd::adamw_update(s, pi, g[i], mi, vi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (pb) pb[i] = __float2bfloat16_rn(pi);
  }
}

__global__ void ss_part_k(const float* __restrict__ x, int64_t n, double* __restrict__ part) {
  const int64_t c0 = blockIdx.x * kSsChunk, c1 = min(n, c0 + kSsChunk);
  double s = 0;
  for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) s += double(x[i]) * double(x[i]);
  s = block_sum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void ss_total_k(const double* __restrict__ part, int64_t chunks, double* __restrict__ out) {
  double s = 0;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) s += part[c];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

void adamw_step(const Ctx& c, const AdamWParams& hp, float* p, const float* g, float* m, float* v, int64_t n,
                bf16* p_bf16) {
  if (n <= 0) return;
  const hd::AdamWConsts<float> s = ref::AdamWScalars<float>(hp).consts();
  adamw_k<<<grid_for(n), 256, 0, c.stream>>>(s, p, g, m, v, n, reinterpret_cast<__nv_bfloat16*>(p_bf16));
  TREX_CUDA_LAUNCHED("adamw_step");
}

double sum_squares(const Ctx& c, const float* x, int64_t n) {
  if (n <= 0) return 0;
  const int64_t chunks = (n + kSsChunk - 1) / kSsChunk;
  Scratch part(c, (chunks + 1) * sizeof(double));
  double* out = part.as<double>() + chunks;
  ss_part_k<<<static_cast<unsigned>(chunks), 256, 0, c.stream>>>(x, n, part.as<double>());
  TREX_CUDA_LAUNCHED("sum_squares part");
  ss_total_k<<<1, 256, 0, c.stream>>>(part.as<double>(), chunks, out);
  TREX_CUDA_LAUNCHED("sum_squares total");
  double r = 0;
  TREX_CUDA_CHECK(cudaMemcpyAsync(&r, out, sizeof r, cudaMemcpyDeviceToHost, c.stream));
  TREX_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  return r;
}

// Each segment as sum_squares does it (its chunks' partials, then its total), the totals added by
// one block; one copy to the host at the end.
double sum_squares_segments(const Ctx& c, const float* base, const int64_t* offsets, const int64_t* sizes, int n) {
  if (n <= 0) return 0;
  int64_t chunks = 0;
  for (int i = 0; i < n; ++i) chunks += (std::max<int64_t>(sizes[i], 0) + kSsChunk - 1) / kSsChunk;
  Scratch part(c, (chunks + n + 1) * sizeof(double));
  double *seg = part.as<double>() + chunks, *out = seg + n;
  int64_t c0 = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t k = (std::max<int64_t>(sizes[i], 0) + kSsChunk - 1) / kSsChunk;
    if (k > 0) {
      ss_part_k<<<static_cast<unsigned>(k), 256, 0, c.stream>>>(base + offsets[i], sizes[i], part.as<double>() + c0);
      TREX_CUDA_LAUNCHED("sum_squares_segments part");
    }
    ss_total_k<<<1, 256, 0, c.stream>>>(part.as<double>() + c0, k, seg + i);
    TREX_CUDA_LAUNCHED("sum_squares_segments segment");
    c0 += k;
  }
  ss_total_k<<<1, 256, 0, c.stream>>>(seg, n, out);
  TREX_CUDA_LAUNCHED("sum_squares_segments total");
  double r = 0;
  TREX_CUDA_CHECK(cudaMemcpyAsync(&r, out, sizeof r, cudaMemcpyDeviceToHost, c.stream));
  TREX_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  return r;
}

}  // namespace trex::kern::cuda
