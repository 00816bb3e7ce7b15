// DeepSeek-V4's gated window pooling on the GPU (kernels/compress_pool.h): one thread per window
// channel, the per-window math of kernels/hd/compress_pool.h. Every kv / gate element feeds at
// most one slot, so the backward writes dkv and dgate without conflicts; dpb[r, col] is then the
// sum of dgate over the tokens t = w m + r (w < nw) of every row, one thread per element of pb
// summing rows and windows in order (in double): a fixed order, whatever the launch.
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/hd/compress_pool.h"

namespace trex::kern::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void compress_pool_fwd_k(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* __restrict__ kv,
                                    const float* __restrict__ gate, const float* __restrict__ pb,
                                    float* __restrict__ out) {
  const int64_t nw = T / m, total = B * nw * hd;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t b = e / (nw * hd), w = (e / hd) % nw, ch = e % hd;
    float mx, sum, o;
    hd::compress_pool_stats<float>(b, w, ch, T, m, hd, c, kv, gate, pb, mx, sum, o);
    out[e] = o;
  }
}

__global__ void compress_pool_bwd_k(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const float* __restrict__ kv,
                                    const float* __restrict__ gate, const float* __restrict__ pb,
                                    const float* __restrict__ dout, float* __restrict__ dkv,
                                    float* __restrict__ dgate) {
  const int64_t nw = T / m, total = B * nw * hd, S = hd::compress_pool_nslots(m, c);
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t b = e / (nw * hd), w = (e / hd) % nw, ch = e % hd;
    float mx, sum, o;
    hd::compress_pool_stats<float>(b, w, ch, T, m, hd, c, kv, gate, pb, mx, sum, o);
    const float g = dout[e];
    int64_t i, ip;
    for (int64_t s = 0; s < S; ++s)
      if (hd::compress_pool_slot(b, w, ch, T, m, hd, c, s, &i, &ip)) {
        const float p = std::exp(gate[i] + pb[ip] - mx) / sum;
        dkv[i] = p * g;
        dgate[i] = p * g * (kv[i] - o);
      }
  }
}

// dpb[r, col] += sum over rows b and windows w < nw of dgate[b, w m + r, col].
__global__ void compress_pool_dpb_k(int64_t B, int64_t T, int64_t m, int64_t C, const float* __restrict__ dgate,
                                    float* __restrict__ dpb) {
  const int64_t nw = T / m, total = m * C;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = e / C, col = e % C;
    double a = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t w = 0; w < nw; ++w) a += dgate[(b * T + w * m + r) * C + col];
    dpb[e] += static_cast<float>(a);
  }
}

void check(int64_t B, int64_t T, int64_t m, int64_t hd, int c, const char* fn) {
  TREX_CHECK(B >= 0 && T >= 0 && m >= 1 && hd >= 1 && (c == 1 || c == 2), fn, ": B=", B, " T=", T, " m=", m,
             " hd=", hd, " c=", c);
}

}  // namespace

void compress_pool_fwd(const Ctx& c, int64_t B, int64_t T, int64_t m, int64_t hd, int cc, const float* kv,
                       const float* gate, const float* pb, float* out) {
  check(B, T, m, hd, cc, "compress_pool_fwd");
  const int64_t n = B * (T / m) * hd;
  if (n == 0) return;
  compress_pool_fwd_k<<<grid_for(n), kThreads, 0, c.stream>>>(B, T, m, hd, cc, kv, gate, pb, out);
  TREX_CUDA_LAUNCHED("compress_pool_fwd_k");
}

void compress_pool_bwd(const Ctx& c, int64_t B, int64_t T, int64_t m, int64_t hd, int cc, const float* kv,
                       const float* gate, const float* pb, const float* dout, float* dkv, float* dgate, float* dpb,
                       float* workspace) {
  check(B, T, m, hd, cc, "compress_pool_bwd");
  const size_t elems = (size_t)(B * T * cc * hd);
  if (elems) {
    TREX_CUDA_CHECK(cudaMemsetAsync(dkv, 0, elems * sizeof(float), c.stream));
    TREX_CUDA_CHECK(cudaMemsetAsync(dgate, 0, elems * sizeof(float), c.stream));
  }
  const int64_t n = B * (T / m) * hd;
  if (n == 0) return;
  compress_pool_bwd_k<<<grid_for(n), kThreads, 0, c.stream>>>(B, T, m, hd, cc, kv, gate, pb, dout, dkv, dgate);
  TREX_CUDA_LAUNCHED("compress_pool_bwd_k");
  compress_pool_dpb_k<<<grid_for(m * cc * hd), kThreads, 0, c.stream>>>(B, T, m, cc * hd, dgate, dpb);
  TREX_CUDA_LAUNCHED("compress_pool_dpb_k");
}

}  // namespace trex::kern::cuda
