// Fused LM head + cross-entropy: vocabulary chunks, online log-sum-exp, logits recomputed in
// the backward pass (see lm_head_ce.h). GEMMs go through kernels/gemm.h; the row operations
// use AVX-512 (kernels/cpu/gemm_ce_avx512.cpp) or the scalar code below.
#include "kernels/lm_head_ce.h"
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
#include "core/cpu.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm_avx512.h"
#include "kernels/gemm_bf16_dnnl.h"
#include "kernels/rows.h"

namespace trex::kern {
namespace {

constexpr int64_t kDefaultChunk = 4096;
constexpr int64_t kMaxBlockFloats = int64_t{1} << 24;  // logits block: at most 64 MiB
constexpr int64_t kMinRowsWholeVocab = 256;            // rows per block when one chunk is the vocabulary
constexpr int64_t kIgnore = -100;
// Rows of the logits (f32) and of p (bf16) are one cache line longer than the chunk. Unpadded, at
// V = 16384 they lie 64 / 32 KiB apart, a multiple of the L2's way size, and the GEMMs' walks down
// a column of rows meet in a few L2 sets (bench-v4's head: 0.94x its time a step with the pad).
constexpr int64_t kPadFloats = 16, kPadBf16 = 32;

int64_t chunk_of(const CeArgs& a) {
  if (a.chunk > 0) return std::max<int64_t>(1, std::min(a.V, a.chunk));
  if (a.V * kMinRowsWholeVocab <= kMaxBlockFloats) return a.V;  // pass 2 reuses the logits
  return std::min(a.V, kDefaultChunk);
}
// One chunk covering the vocabulary takes blocks of up to twice the floats (128 MiB): at V = 16384,
// d = 1024 blocks of 2048 rows take 0.97x the time of 1024 (bf16, Zen 5: half as many passes over
// W and over dW's accumulator).
int64_t row_block_of(const CeArgs& a, int64_t vc) {
  const int64_t cap = vc >= a.V ? 2 * kMaxBlockFloats : kMaxBlockFloats;
  return std::max<int64_t>(1, std::min(a.N, std::max<int64_t>(1, cap / vc)));
}
// BF16 on the bf16 dot-product GEMMs: p is rounded to bf16 for the two backward GEMMs (see the
// header), into [rb, vc] bf16 after the f32 workspace.
bool rounds_p(const CeArgs& a) { return a.prec == Prec::BF16 && bf16_dot_gemm(); }
// BF16 where the bf16 GEMMs widen their operands to f32 (kernels/gemm.h): W_b is widened once a
// call and each row block of h_b once, into the workspace after the rest, so the GEMMs run on f32
// operands; else W_b would be widened again by each row block's logits and dh GEMMs. Only while
// the widened W takes at most kMaxWideFloats (256 MiB): larger heads keep the per-GEMM panels.
constexpr int64_t kMaxWideFloats = int64_t{1} << 26;
bool widens_once(const CeArgs& a) {
  return a.prec == Prec::BF16 && a.V * a.d <= kMaxWideFloats && !bf16_dot_gemm() && !isa_ref_forced();
}

// Scalar versions of the row operations in kernels/cpu/gemm_avx512.h (same semantics).
void stats_scalar(const float* L, int64_t ld, int64_t rows, int64_t cols, float* m, float* s) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = L + r * ld;
    float cm = ninf;
    for (int64_t j = 0; j < cols; ++j) cm = l[j] > cm ? l[j] : cm;
    const float mo = m[r], mn = cm > mo ? cm : mo;
    float cs = 0;
    for (int64_t j = 0; j < cols; ++j) cs += std::exp(l[j] - mn);
    s[r] = (mo == ninf ? 0.f : s[r] * std::exp(mo - mn)) + cs;
    m[r] = mn;
  }
}

void softmax_scalar(float* L, int64_t ld, int64_t rows, int64_t cols, const float* lse, const float* g) {
  for (int64_t r = 0; r < rows; ++r) {
    float* l = L + r * ld;
    for (int64_t j = 0; j < cols; ++j) l[j] = g[r] == 0.f ? 0.f : std::exp(l[j] - lse[r]) * g[r];
  }
}

// C[rows, cols] (row stride cols) = op(A) @ op(B) with f32 or bf16 operands.
void mm(Prec pa, Prec pb, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
        const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (pa == Prec::F32 && pb == Prec::F32)
    return gemm_f32(ta, tb, M, N, K, 1.f, static_cast<const float*>(A), lda, static_cast<const float*>(B), ldb, beta,
                    C, ldc);
  gemm_mixed(pa, pb, ta, tb, M, N, K, 1.f, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

double lm_head_ce_flops(const CeArgs& a, bool grads) {
  const double nvd = (double)a.N * (double)a.V * (double)a.d;
  if (!grads) return 2 * nvd;
  return (chunk_of(a) >= a.V ? 6 : 8) * nvd;
}

size_t lm_head_ce_workspace_floats(const CeArgs& a) {
  if (a.N <= 0 || a.V <= 0) return 0;
  const int64_t vc = chunk_of(a), rb = row_block_of(a, vc), ldl = vc + kPadFloats, ldp = vc + kPadBf16;
  return static_cast<size_t>(rb * ldl + 3 * rb + (rounds_p(a) ? (rb * ldp + 1) / 2 : 0) +
                             (widens_once(a) ? (a.V + rb) * a.d : 0));
}

double lm_head_ce(const CeArgs& a, int64_t* n_valid) {
  TREX_CHECK(a.N >= 0 && a.d > 0 && a.V > 0, "lm_head_ce: N=", a.N, " d=", a.d, " V=", a.V);
  if (n_valid) *n_valid = 0;
  if (a.N == 0) return 0.0;
  const bool bf = a.prec == Prec::BF16;
  TREX_CHECK(a.labels, "lm_head_ce: labels is null");
  TREX_CHECK(bf ? (a.h_b && a.W_b) : (a.h && a.W), "lm_head_ce: missing ", bf ? "h_b/W_b" : "h/W", " for prec ",
             bf ? "BF16" : "F32");
  const bool grads = a.dh != nullptr;
  TREX_CHECK(!grads || a.dW, "lm_head_ce: dh given without dW");
  int64_t valid = 0;
  for (int64_t n = 0; n < a.N; ++n) {
    const int64_t y = a.labels[n];
    TREX_CHECK(y == kIgnore || (y >= 0 && y < a.V), "lm_head_ce: label ", y, " at row ", n, " outside [0, ", a.V,
               ") and not -100");
    valid += y != kIgnore;
  }

  const int64_t N = a.N, d = a.d, V = a.V, vc = chunk_of(a), rb = row_block_of(a, vc);
  const int64_t ldl = vc + kPadFloats, ldp = vc + kPadBf16;  // row strides of L and Pb
  std::vector<float> own;
  float* ws = a.workspace;
  if (!ws) {
    own.resize(lm_head_ce_workspace_floats(a));
    ws = own.data();
  }
  float* L = ws;             // [rb, vc] logits / p of one chunk (row stride ldl)
  float* m = L + rb * ldl;   // [rb] running max, then lse
  float* s = m + rb;         // [rb] running sum of exp, then g (per-row gradient scale)
  float* lab = s + rb;       // [rb] logit of the label
  const bool round_p = rounds_p(a);
  bf16* Pb = round_p ? reinterpret_cast<bf16*>(lab + rb) : nullptr;  // [rb, vc] p in bf16 (row stride ldp)
  const bool once = widens_once(a);
  float* Wf = once ? lab + rb : nullptr;  // [V, d] W_b widened (once)
  float* hf = once ? Wf + V * d : nullptr;  // [rb, d] the row block of h_b widened
  if (once) widen_bf16(a.W_b, d, V, d, Wf);
  const bool bops = bf && !once;  // the GEMMs' h and W operands are bf16
  const Prec ph = bops ? Prec::BF16 : Prec::F32;
  const size_t es = bops ? sizeof(bf16) : sizeof(float);
  const char* hbase = bf ? reinterpret_cast<const char*>(a.h_b) : reinterpret_cast<const char*>(a.h);
  const char* Wbase = once ? reinterpret_cast<const char*>(Wf)
                           : bf ? reinterpret_cast<const char*>(a.W_b) : reinterpret_cast<const char*>(a.W);
  const bool avx = cpu_isa() >= Isa::Avx512;
  const int64_t row_grain = std::max<int64_t>(1, 32768 / vc);
  // The backward's rows in one visit each where one chunk holds the vocabulary and p is rounded:
  // their logits read once from memory where three passes (statistics, softmax, rounding) read
  // them and the softmax wrote them back.
  const bool fused = grads && round_p && vc >= V && avx;

  double loss = 0;
  for (int64_t r0 = 0; r0 < N; r0 += rb) {
    const int64_t nb = std::min(rb, N - r0);
    const void* hb = hf;  // the row block of h: widened into hf, or in place
    if (once) widen_bf16(a.h_b + r0 * d, d, nb, d, hf);
    else hb = hbase + r0 * d * es;
    const int32_t* y = a.labels + r0;
    auto logits = [&](int64_t v0, int64_t vb) {  // L[nb, vb] = h_blk @ W_c^T
      mm(ph, ph, false, true, nb, vb, d, hb, d, Wbase + v0 * d * es, d, 0.f, L, ldl);
    };
    if (fused) {  // one chunk, bf16 p: each row's lse (in m), label logit and p in one visit (gemm_avx512.h)
      logits(0, V);
      parallel_for(nb, row_grain, [&](int64_t i0, int64_t i1) {
        cpu::ce_rows_p_bf16_avx512(L + i0 * ldl, ldl, i1 - i0, V, y + i0, a.grad_scale, m + i0, lab + i0,
                                   Pb + i0 * ldp, ldp);
      });
      for (int64_t i = 0; i < nb; ++i)
        if (y[i] != kIgnore) loss += static_cast<double>(m[i]) - static_cast<double>(lab[i]);
    } else {
      // Pass 1: online log-sum-exp and the label logit.
      for (int64_t i = 0; i < nb; ++i) {
        m[i] = -std::numeric_limits<float>::infinity();
        s[i] = 0.f;
        lab[i] = 0.f;
      }
      for (int64_t v0 = 0; v0 < V; v0 += vc) {
        const int64_t vb = std::min(vc, V - v0);
        logits(v0, vb);
        parallel_for(nb, row_grain, [&](int64_t i0, int64_t i1) {
          if (avx) cpu::ce_chunk_stats_avx512(L + i0 * ldl, ldl, i1 - i0, vb, m + i0, s + i0);
          else stats_scalar(L + i0 * ldl, ldl, i1 - i0, vb, m + i0, s + i0);
          for (int64_t i = i0; i < i1; ++i)
            if (y[i] >= v0 && y[i] < v0 + vb) lab[i] = L[i * ldl + (y[i] - v0)];
        });
      }
      for (int64_t i = 0; i < nb; ++i) {
        m[i] = m[i] + std::log(s[i]);  // lse
        if (y[i] != kIgnore) loss += static_cast<double>(m[i]) - static_cast<double>(lab[i]);
        s[i] = y[i] != kIgnore ? a.grad_scale : 0.f;  // g
      }
    }
    if (!grads) continue;
    // Pass 2: p = g * (softmax - onehot); dh_blk = sum_c p_c @ W_c; dW_c += p_c^T @ h_blk.
    // One chunk: L still holds its logits from pass 1 (fused: Pb holds p already).
    float* dh = a.dh + r0 * d;
    for (int64_t v0 = 0; v0 < V; v0 += vc) {
      const int64_t vb = std::min(vc, V - v0);
      if (vc < V) logits(v0, vb);
      if (!fused)
        parallel_for(nb, row_grain, [&](int64_t i0, int64_t i1) {
          if (avx) cpu::ce_chunk_softmax_avx512(L + i0 * ldl, ldl, i1 - i0, vb, m + i0, s + i0);
          else softmax_scalar(L + i0 * ldl, ldl, i1 - i0, vb, m + i0, s + i0);
          for (int64_t i = i0; i < i1; ++i)
            if (y[i] >= v0 && y[i] < v0 + vb) L[i * ldl + (y[i] - v0)] -= s[i];
          if (round_p)  // row by row, into Pb's rows
            for (int64_t i = i0; i < i1; ++i) to_bf16(L + i * ldl, vb, 1, vb, Pb + i * ldp);
        });
      const Prec pp = round_p ? Prec::BF16 : Prec::F32;
      const void* P = round_p ? static_cast<const void*>(Pb) : static_cast<const void*>(L);
      const int64_t ld = round_p ? ldp : ldl;
      mm(pp, ph, false, false, nb, d, vb, P, ld, Wbase + v0 * d * es, d, v0 == 0 ? 0.f : 1.f, dh, d);
      mm(pp, ph, true, false, vb, d, nb, P, ld, hb, d, 1.f, a.dW + v0 * d, d);
    }
  }
  if (n_valid) *n_valid = valid;
  return loss;
}

}  // namespace trex::kern
