// The MoE router of kernels/router.h on CUDA, so that a step sends the host only the E + 1 expert
// offsets of each layer (the plan of the expert GEMMs) instead of the scores and the selection.
// The per-row arithmetic is kernels/hd/router.h (shared with the CPU); these kernels walk the rows.
//   router_select, router_probs_bwd, router_scores_bwd: one thread per token row.
//   router_aux: counts by atomic adds of whole numbers (exact in any order); per-row sums in
//               expert order and per-(sequence, expert) sums in row order, as on the CPU.
//   moe_sort:   per chunk of kSortChunk pairs a histogram, the expert offsets and each chunk's
//               first row per expert, then each pair's row = that base + the pairs of the same
//               expert before it in its chunk: stable in pair order, the CPU's rows exactly.
#include <string>
#include <vector>
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/hd/router.h"

namespace trex::kern::cuda {

namespace {

constexpr int kRowThreads = 64;
constexpr int kSortChunk = 256;

__global__ void router_select_k(RouterShape s, const float* __restrict__ logits, const float* __restrict__ bias,
                                const int32_t* __restrict__ fixed, float* scores, int32_t* __restrict__ idx,
                                float* __restrict__ probs, float* __restrict__ gscore, unsigned char* __restrict__ gkeep) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= s.N) return;
  hd::router_scores_row(s, logits + n * s.E, scores + n * s.E);
  hd::router_select_row(s, scores + n * s.E, bias, fixed ? fixed + n * s.K : nullptr, gscore + n * s.groups,
                        gkeep + n * s.groups, idx + n * s.K, probs + n * s.K);
}

__global__ void router_probs_bwd_k(RouterShape s, const float* __restrict__ scores, const int32_t* __restrict__ idx,
                                   const float* __restrict__ dprobs, float* __restrict__ dscores) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= s.N) return;
  hd::router_probs_bwd_row(s, scores + n * s.E, idx + n * s.K, dprobs + n * s.K, dscores + n * s.E);
}

__global__ void router_scores_bwd_k(RouterShape s, const float* __restrict__ scores, const float* dscores,
                                    float* dlogits) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= s.N) return;
  hd::router_scores_bwd_row(s, scores + n * s.E, dscores + n * s.E, dlogits + n * s.E);
}

// cnt [B, E] += 1 per (row, slot); rows are the tokens n0 + i of the B x T batch.
__global__ void aux_counts_k(RouterShape s, const int32_t* __restrict__ idx, int64_t T, int64_t n0,
                             double* __restrict__ cnt) {
  const int64_t R = s.N * s.K;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < R; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = (n0 + j / s.K) / T;
    atomicAdd(cnt + b * s.E + idx[j], 1.0);
  }
}

// Z [N]: each row's sum of scores (in expert order, double).
__global__ void aux_rowsum_k(RouterShape s, const float* __restrict__ scores, double* __restrict__ Z) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= s.N) return;
  double z = 0;
  for (int64_t e = 0; e < s.E; ++e) z += scores[i * s.E + e];
  Z[i] = z;
}

// term [B, E] = f_be P_be for the sequences b these rows touch (P summed in row order).
__global__ void aux_terms_k(RouterShape s, const float* __restrict__ scores, const double* __restrict__ Z,
                            const double* __restrict__ cnt, int64_t B, int64_t T, int64_t n0, double* __restrict__ term) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= B * s.E) return;
  const int64_t b = j / s.E, e = j - b * s.E;
  const int64_t lo = b * T > n0 ? b * T : n0, hi = (b + 1) * T < n0 + s.N ? (b + 1) * T : n0 + s.N;
  const int64_t i0 = lo - n0, i1 = hi - n0;
  double P = 0;
  for (int64_t i = i0; i < i1; ++i) P += scores[i * s.E + e] / Z[i];
  const double f = cnt[j] * ((double)s.E / (double)(s.K * T));
  term[j] = f * (P / (double)T);
}

// L [B] = sum over e in order of term [b, :].
__global__ void aux_seq_k(int64_t B, int64_t E, const double* __restrict__ term, double* __restrict__ L) {
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b >= B) return;
  double l = 0;
  for (int64_t e = 0; e < E; ++e) l += term[b * E + e];
  L[b] = l;
}

// dscores [i, :] += grad_scale x the loss's gradient, one thread per row.
__global__ void aux_grad_k(RouterShape s, const float* __restrict__ scores, const double* __restrict__ cnt, int64_t B,
                           int64_t T, int64_t n0, double alpha, float grad_scale, float* __restrict__ dscores) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= s.N) return;
  const int64_t E = s.E, b = (n0 + i) / T;
  const float* sc = scores + i * E;
  const double fs = (double)E / (double)(s.K * T), TB = (double)(T * B);
  double Z = 0, dot = 0;
  for (int64_t e = 0; e < E; ++e) Z += sc[e];
  for (int64_t e = 0; e < E; ++e) dot += alpha * (cnt[b * E + e] * fs) / TB * (sc[e] / Z);
  for (int64_t e = 0; e < E; ++e)
    dscores[i * E + e] += grad_scale * (float)((alpha * (cnt[b * E + e] * fs) / TB - dot) / Z);
}

__global__ void sort_hist_k(const int32_t* __restrict__ idx, int64_t R, int64_t E, int* __restrict__ hist) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < R; i += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(hist + (i / kSortChunk) * E + idx[i], 1);
}

// One block: offsets [E + 1] and base [chunks, E] (the first row of each chunk's pairs per expert).
__global__ void sort_scan_k(const int* __restrict__ hist, int64_t chunks, int64_t E, int64_t* __restrict__ offsets,
                            int64_t* __restrict__ base) {
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t t = 0;
    for (int64_t ch = 0; ch < chunks; ++ch) t += hist[ch * E + e];
    offsets[e + 1] = t;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    offsets[0] = 0;
    for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t run = offsets[e];
    for (int64_t ch = 0; ch < chunks; ++ch) {
      base[ch * E + e] = run;
      run += hist[ch * E + e];
    }
  }
}

// One block of kSortChunk threads per chunk.
__global__ void sort_place_k(const int32_t* __restrict__ idx, int64_t R, int64_t K, int64_t E,
                             const int64_t* __restrict__ base, int32_t* __restrict__ row_token,
                             int32_t* __restrict__ slot_row) {
  __shared__ int32_t sidx[kSortChunk];
  const int64_t i0 = blockIdx.x * int64_t(kSortChunk), i = i0 + threadIdx.x;
  if (i < R) sidx[threadIdx.x] = idx[i];
  __syncthreads();
  if (i >= R) return;
  const int32_t e = sidx[threadIdx.x];
  int64_t rank = 0;
  for (int j = 0; j < (int)threadIdx.x; ++j) rank += sidx[j] == e;
  const int64_t row = base[blockIdx.x * E + e] + rank;
  row_token[row] = (int32_t)(i / K);
  slot_row[i] = (int32_t)row;
}

int row_grid(int64_t n) { return static_cast<int>((n + kRowThreads - 1) / kRowThreads); }

}  // namespace

void router_select(const Ctx& c, const RouterShape& s, const float* logits, const float* bias, const int32_t* fixed_idx,
                   float* scores, int32_t* idx, float* probs) {
  if (s.N <= 0) return;
  Scratch g(c, size_t(s.N) * s.groups * (sizeof(float) + 1));
  float* gscore = g.as<float>();
  unsigned char* gkeep = reinterpret_cast<unsigned char*>(gscore + s.N * s.groups);
  router_select_k<<<row_grid(s.N), kRowThreads, 0, c.stream>>>(s, logits, bias, fixed_idx, scores, idx, probs, gscore,
                                                                gkeep);
  TREX_CUDA_LAUNCHED("router_select");
}

void router_probs_bwd(const Ctx& c, const RouterShape& s, const float* scores, const int32_t* idx, const float* dprobs,
                      float* dscores) {
  if (s.N <= 0) return;
  router_probs_bwd_k<<<row_grid(s.N), kRowThreads, 0, c.stream>>>(s, scores, idx, dprobs, dscores);
  TREX_CUDA_LAUNCHED("router_probs_bwd");
}

void router_scores_bwd(const Ctx& c, const RouterShape& s, const float* scores, const float* dscores, float* dlogits) {
  if (s.N <= 0) return;
  router_scores_bwd_k<<<row_grid(s.N), kRowThreads, 0, c.stream>>>(s, scores, dscores, dlogits);
  TREX_CUDA_LAUNCHED("router_scores_bwd");
}

double router_aux(const Ctx& c, const RouterShape& s, const float* scores, const int32_t* idx, int64_t B, int64_t T,
                  int64_t n0, double alpha, float grad_scale, float* dscores) {
  if (s.N <= 0) return 0.0;
  if (n0 < 0 || n0 + s.N > B * T)
    throw Error("cuda router_aux: rows [" + std::to_string(n0) + ", " + std::to_string(n0 + s.N) + ") outside the " +
                std::to_string(B) + " x " + std::to_string(T) + " batch");
  const int64_t BE = B * s.E;
  Scratch buf(c, size_t(BE * 2 + s.N + B) * sizeof(double));
  double* cnt = buf.as<double>();
  double* term = cnt + BE;
  double* Z = term + BE;
  double* L = Z + s.N;
  TREX_CUDA_CHECK(cudaMemsetAsync(cnt, 0, size_t(BE) * sizeof(double), c.stream));
  aux_counts_k<<<grid_for(s.N * s.K), 256, 0, c.stream>>>(s, idx, T, n0, cnt);
  TREX_CUDA_LAUNCHED("router_aux counts");
  if (dscores) {
    aux_grad_k<<<row_grid(s.N), kRowThreads, 0, c.stream>>>(s, scores, cnt, B, T, n0, alpha, grad_scale, dscores);
    TREX_CUDA_LAUNCHED("router_aux grad");
    return 0.0;
  }
  aux_rowsum_k<<<row_grid(s.N), kRowThreads, 0, c.stream>>>(s, scores, Z);
  TREX_CUDA_LAUNCHED("router_aux rowsum");
  TREX_CUDA_CHECK(cudaMemsetAsync(term, 0, size_t(BE) * sizeof(double), c.stream));
  aux_terms_k<<<row_grid(BE), kRowThreads, 0, c.stream>>>(s, scores, Z, cnt, B, T, n0, term);
  TREX_CUDA_LAUNCHED("router_aux terms");
  aux_seq_k<<<row_grid(B), kRowThreads, 0, c.stream>>>(B, s.E, term, L);
  TREX_CUDA_LAUNCHED("router_aux seq");
  std::vector<double> Lh(B);
  TREX_CUDA_CHECK(cudaMemcpyAsync(Lh.data(), L, size_t(B) * sizeof(double), cudaMemcpyDeviceToHost, c.stream));
  TREX_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  // The sequences these rows touch, in order, as kernels/router.cpp adds them.
  double total = 0;
  const int64_t b0 = n0 / T, b1 = (n0 + s.N - 1) / T + 1;
  for (int64_t b = b0; b < b1; ++b) total += alpha * Lh[b] / B;
  return total;
}

void moe_sort(const Ctx& c, const int32_t* idx, int64_t N, int64_t K, int64_t E, int64_t* offsets, int32_t* row_token,
              int32_t* slot_row) {
  const int64_t R = N * K;
  if (R <= 0) {
    TREX_CUDA_CHECK(cudaMemsetAsync(offsets, 0, size_t(E + 1) * sizeof(int64_t), c.stream));
    return;
  }
  const int64_t chunks = (R + kSortChunk - 1) / kSortChunk;
  Scratch buf(c, size_t(chunks * E) * (sizeof(int) + sizeof(int64_t)));
  int64_t* base = buf.as<int64_t>();
  int* hist = reinterpret_cast<int*>(base + chunks * E);
  TREX_CUDA_CHECK(cudaMemsetAsync(hist, 0, size_t(chunks * E) * sizeof(int), c.stream));
  sort_hist_k<<<grid_for(R), 256, 0, c.stream>>>(idx, R, E, hist);
  TREX_CUDA_LAUNCHED("moe_sort hist");
  sort_scan_k<<<1, 1024, 0, c.stream>>>(hist, chunks, E, offsets, base);
  TREX_CUDA_LAUNCHED("moe_sort scan");
  sort_place_k<<<static_cast<int>(chunks), kSortChunk, 0, c.stream>>>(idx, R, K, E, base, row_token, slot_row);
  TREX_CUDA_LAUNCHED("moe_sort place");
}

}  // namespace trex::kern::cuda
