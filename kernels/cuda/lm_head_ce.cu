// LM head + cross-entropy on CUDA (kernels/lm_head_ce.h): the logits of a block of rows and a
// chunk of the vocabulary at a time (cuBLASLt), an online log-sum-exp per row across chunks
// (kernels/hd/softmax.h), then per chunk p = grad_scale (softmax - onehot) and the two GEMMs
// dh (+)= p @ W_c, dW_c += p^T @ h. Precision BF16: logits from h_b, W_b; p rounded to bf16 for
// the two gradient GEMMs (the tensor cores), as the CPU does where bf16 runs on dot units.
// The loss is summed in double in row order by one block: deterministic.
// args.workspace is not used here: scratch comes from the stream-ordered allocator.
#include <cuda_bf16.h>
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/hd/softmax.h"

namespace trex::kern::cuda {

namespace {

constexpr int32_t kIgnore = -100;
constexpr int kThreads = 256;

// What the host reads back at the end: the loss sum, the valid rows, a bad label seen.
struct Totals {
  double loss;
  int64_t valid;
  int bad;
};

// state (m, s) of each row merged with the chunk's logits L [rows, C]; tgt[r] = the label's logit
// when it falls in this chunk; tot->bad = 1 on a label outside [0, V) that is not -100.
__global__ void ce_stats_k(const float* __restrict__ L, int64_t C, int64_t v0, int64_t V, const int32_t* __restrict__ y,
                           float* __restrict__ m, float* __restrict__ s, float* __restrict__ tgt, Totals* tot) {
  const int64_t r = blockIdx.x;
  const float* lr = L + r * C;
  hd::Lse<float> st = hd::lse_empty<float>();
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) st = hd::lse_push(st, lr[j]);
  __shared__ float ms[kThreads], ss[kThreads];
  ms[threadIdx.x] = st.m;
  ss[threadIdx.x] = st.s;
  __syncthreads();
  if (threadIdx.x == 0) {
    hd::Lse<float> acc{m[r], s[r]};
    for (int i = 0; i < blockDim.x; ++i) acc = hd::lse_merge(acc, hd::Lse<float>{ms[i], ss[i]});
    m[r] = acc.m;
    s[r] = acc.s;
    const int32_t lab = y[r];
    if (lab != kIgnore && (lab < 0 || lab >= V)) atomicExch(&tot->bad, 1);
    if (lab >= v0 && lab < v0 + C) tgt[r] = lr[lab - v0];
  }
}

// loss[r] = lse - target for valid rows (0 otherwise); lse[r] kept for pass 2.
__global__ void ce_finish_k(int64_t rows, const int32_t* __restrict__ y, const float* __restrict__ m,
                            const float* __restrict__ s, const float* __restrict__ tgt, float* __restrict__ lse,
                            Totals* tot) {
  double acc = 0;
  long long cnt = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const float l = hd::lse_value(hd::Lse<float>{m[r], s[r]});
    lse[r] = l;
    if (y[r] != kIgnore) {
      acc += double(l) - double(tgt[r]);
      ++cnt;
    }
  }
  acc = block_sum(acc);
  cnt = block_sum(cnt);
  if (threadIdx.x == 0) {
    tot->loss += acc;
    tot->valid += cnt;
  }
}

// P [rows, C] = scale (exp(L - lse) - onehot) on valid rows, 0 on ignored ones; Pb its bf16 copy.
__global__ void ce_grad_k(const float* __restrict__ L, int64_t rows, int64_t C, int64_t v0,
                          const int32_t* __restrict__ y, const float* __restrict__ lse, float scale,
                          float* __restrict__ P, __nv_bfloat16* __restrict__ Pb) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, j = i % C;
    const int32_t lab = y[r];
    float p = 0.f;
    if (lab != kIgnore) p = scale * (expf(L[i] - lse[r]) - (lab == v0 + j ? 1.f : 0.f));
    if (Pb)
      Pb[i] = __float2bfloat16_rn(p);
    else
      P[i] = p;
  }
}

__global__ void fill_k(float* x, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] = v;
}

}  // namespace

double lm_head_ce(const Ctx& c, const CeArgs& a, int64_t* n_valid) {
  const bool bf = a.prec == Prec::BF16;
  if (a.N < 0 || a.d <= 0 || a.V <= 0)
    throw Error("cuda lm_head_ce: N=" + std::to_string(a.N) + " d=" + std::to_string(a.d) + " V=" + std::to_string(a.V));
  if (a.N == 0) {  // no rows: no loss, nothing to read (h and labels may be null)
    if (n_valid) *n_valid = 0;
    return 0;
  }
  if (!a.labels || (bf ? !(a.h_b && a.W_b) : !(a.h && a.W)) || (a.dh && !a.dW))
    throw Error("cuda lm_head_ce: missing labels, inputs for the precision, or dW with dh");
  const int64_t C = a.chunk > 0 ? std::min(a.chunk, a.V) : std::min<int64_t>(a.V, 16384);
  const int64_t RB = std::max<int64_t>(1, std::min<int64_t>(a.N, (int64_t(1) << 26) / C));  // logits <= 256 MiB
  const Prec p = a.prec;
  const void* H = bf ? static_cast<const void*>(a.h_b) : a.h;
  const void* W = bf ? static_cast<const void*>(a.W_b) : a.W;
  const size_t es = bf ? 2 : 4;
  const bool one_chunk = C == a.V;

  Scratch L(c, RB * C * sizeof(float)), P(c, RB * C * (bf ? 2 : 4));
  Scratch st(c, RB * 4 * sizeof(float)), tt(c, sizeof(Totals));
  float* m = st.as<float>();  // per row of a block: running max, sum, target logit, lse
  float* s = m + RB;
  float* tgt = s + RB;
  float* lse = tgt + RB;
  Totals* tot = tt.as<Totals>();
  TREX_CUDA_CHECK(cudaMemsetAsync(tot, 0, sizeof(Totals), c.stream));

  for (int64_t r0 = 0; r0 < a.N; r0 += RB) {
    const int64_t rows = std::min(RB, a.N - r0);
    const void* Hr = static_cast<const char*>(H) + r0 * a.d * es;
    const int32_t* y = a.labels + r0;
    fill_k<<<grid_for(rows), 256, 0, c.stream>>>(m, rows, -INFINITY);
    TREX_CUDA_CHECK(cudaMemsetAsync(s, 0, rows * sizeof(float), c.stream));
    TREX_CUDA_CHECK(cudaMemsetAsync(tgt, 0, rows * sizeof(float), c.stream));
    for (int64_t v0 = 0; v0 < a.V; v0 += C) {
      const int64_t cw = std::min(C, a.V - v0);
      gemm(c, p, p, false, true, rows, cw, a.d, 1.f, Hr, a.d, static_cast<const char*>(W) + v0 * a.d * es, a.d, 0.f,
           L.as<float>(), cw);
      ce_stats_k<<<static_cast<unsigned>(rows), kThreads, 0, c.stream>>>(L.as<float>(), cw, v0, a.V, y, m, s, tgt, tot);
      TREX_CUDA_LAUNCHED("lm_head_ce stats");
    }
    ce_finish_k<<<1, 1024, 0, c.stream>>>(rows, y, m, s, tgt, lse, tot);
    TREX_CUDA_LAUNCHED("lm_head_ce finish");
    if (!a.dh) continue;
    for (int64_t v0 = 0; v0 < a.V; v0 += C) {
      const int64_t cw = std::min(C, a.V - v0);
      const void* Wc = static_cast<const char*>(W) + v0 * a.d * es;
      if (!one_chunk)
        gemm(c, p, p, false, true, rows, cw, a.d, 1.f, Hr, a.d, Wc, a.d, 0.f, L.as<float>(), cw);
      ce_grad_k<<<grid_for(rows * cw), 256, 0, c.stream>>>(L.as<float>(), rows, cw, v0, y, lse, a.grad_scale,
                                                          P.as<float>(), bf ? P.as<__nv_bfloat16>() : nullptr);
      TREX_CUDA_LAUNCHED("lm_head_ce grad");
      gemm(c, p, p, false, false, rows, a.d, cw, 1.f, P.as<void>(), cw, Wc, a.d, v0 == 0 ? 0.f : 1.f,
           a.dh + r0 * a.d, a.d);
      gemm(c, p, p, true, false, cw, a.d, rows, 1.f, P.as<void>(), cw, Hr, a.d, 1.f, a.dW + v0 * a.d, a.d);
    }
  }
  Totals h{};
  TREX_CUDA_CHECK(cudaMemcpyAsync(&h, tot, sizeof h, cudaMemcpyDeviceToHost, c.stream));
  TREX_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  if (h.bad) throw Error("cuda lm_head_ce: a label outside [0, " + std::to_string(a.V) + ") that is not -100");
  if (n_valid) *n_valid = h.valid;
  return h.loss;
}

}  // namespace trex::kern::cuda
