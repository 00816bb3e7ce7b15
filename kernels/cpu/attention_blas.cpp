// GEMM-based causal attention (see attention_blas.h). Work items: forward, (b, h, query block)
// with dynamic scheduling (later blocks see more keys); backward, (b, h) (dk and dv accumulate
// over the query blocks of one head, so one thread owns a head). GEMMs inside a parallel region
// run on the calling thread.
#include "kernels/cpu/attention_blas.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "kernels/gemm.h"

namespace trex::kern::cpu {

namespace {

constexpr int kBlock = 64;  // queries per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Keys query t may see start at first_key(t); the block [q0, q1) sees keys [first_key(q0), q1).
int first_key(const AttnShape& sh, int t) { return sh.window > 0 ? std::max(0, t - sh.window + 1) : 0; }

// S[nq, nk] (row stride nk) holds scale * q.k for queries q0.. and keys k0..; positions a query may
// not see become -inf. Returns nothing; rows with no visible key are all -inf.
void mask_scores(const AttnShape& sh, const int32_t* seg_row, int q0, int nq, int k0, int nk, float* S) {
  for (int i = 0; i < nq; ++i) {
    const int t = q0 + i, lo = first_key(sh, t);
    float* s = S + (int64_t)i * nk;
    for (int j = 0; j < nk; ++j) {
      const int key = k0 + j;
      if (key > t || key < lo || (seg_row && seg_row[key] != seg_row[t])) s[j] = kNegInf;
    }
  }
}

// Per (b, h, block) scratch of the calling thread.
struct Scratch {
  std::vector<float> S, dP;
};
thread_local Scratch t_scratch;

}  // namespace

void attention_fwd_blas(const AttnShape& sh, const float* q, const float* k, const float* v, float* o,
                        float* lse, const int32_t* seg) {
  const int B = sh.B, T = sh.T, H = sh.H, Dq = sh.Dqk, Dv = sh.Dv;
  const int nblk = (T + kBlock - 1) / kBlock;
  const int64_t ldq = (int64_t)H * Dq, ldv = (int64_t)H * Dv;
  parallel_dynamic((int64_t)B * H * nblk, [&](int64_t item) {
    // Largest blocks (most keys) first: item 0 is the last block of (b, h) = (0, 0).
    const int blk = nblk - 1 - (int)(item % nblk);
    const int64_t bh = item / nblk;
    const int b = (int)(bh / H), h = (int)(bh % H);
    const int q0 = blk * kBlock, q1 = std::min(T, q0 + kBlock), nq = q1 - q0;
    const int k0 = first_key(sh, q0), nk = q1 - k0;
    const int32_t* seg_row = seg ? seg + (int64_t)b * T : nullptr;
    std::vector<float>& S = t_scratch.S;
    S.resize((size_t)nq * nk);
    const float* Q = q + ((int64_t)b * T + q0) * ldq + (int64_t)h * Dq;
    const float* K = k + ((int64_t)b * T + k0) * ldq + (int64_t)h * Dq;
    const float* V = v + ((int64_t)b * T + k0) * ldv + (int64_t)h * Dv;
    float* O = o + ((int64_t)b * T + q0) * ldv + (int64_t)h * Dv;
    float* L = lse + ((int64_t)b * H + h) * T + q0;
    // S = scale * Q K^T
    gemm_f32(false, true, nq, nk, Dq, sh.scale, Q, ldq, K, ldq, 0.f, S.data(), nk);
    mask_scores(sh, seg_row, q0, nq, k0, nk, S.data());
    for (int i = 0; i < nq; ++i) {
      float* s = S.data() + (int64_t)i * nk;
      float m = kNegInf;
      for (int j = 0; j < nk; ++j) m = std::max(m, s[j]);
      if (m == kNegInf) {  // no visible key: o = 0, lse = -inf
        std::fill(s, s + nk, 0.f);
        L[i] = kNegInf;
        continue;
      }
      double sum = 0;
      for (int j = 0; j < nk; ++j) {
        s[j] = std::exp(s[j] - m);
        sum += s[j];
      }
      const float inv = (float)(1.0 / sum);
      for (int j = 0; j < nk; ++j) s[j] *= inv;
      L[i] = m + (float)std::log(sum);
    }
    // O = P V
    gemm_f32(false, false, nq, Dv, nk, 1.f, S.data(), nk, V, ldv, 0.f, O, ldv);
  });
}

void attention_bwd_blas(const AttnShape& sh, const float* q, const float* k, const float* v, const float* o,
                        const float* lse, const float* dO, float* dq, float* dk, float* dv, const int32_t* seg) {
  const int B = sh.B, T = sh.T, H = sh.H, Dq = sh.Dqk, Dv = sh.Dv;
  const int64_t ldq = (int64_t)H * Dq, ldv = (int64_t)H * Dv;
  parallel_dynamic((int64_t)B * H, [&](int64_t bh) {
    const int b = (int)(bh / H), h = (int)(bh % H);
    const int32_t* seg_row = seg ? seg + (int64_t)b * T : nullptr;
    const int64_t row0q = (int64_t)b * T * ldq + (int64_t)h * Dq, row0v = (int64_t)b * T * ldv + (int64_t)h * Dv;
    for (int t = 0; t < T; ++t) {  // dk, dv accumulate below: clear this head's rows
      std::fill(dk + row0q + t * ldq, dk + row0q + t * ldq + Dq, 0.f);
      std::fill(dv + row0v + t * ldv, dv + row0v + t * ldv + Dv, 0.f);
    }
    std::vector<float>& S = t_scratch.S;
    std::vector<float>& dP = t_scratch.dP;
    std::vector<float> Di(kBlock);
    for (int q0 = 0; q0 < T; q0 += kBlock) {
      const int q1 = std::min(T, q0 + kBlock), nq = q1 - q0;
      const int k0 = first_key(sh, q0), nk = q1 - k0;
      S.resize((size_t)nq * nk);
      dP.resize((size_t)nq * nk);
      const float* Q = q + row0q + (int64_t)q0 * ldq;
      const float* K = k + row0q + (int64_t)k0 * ldq;
      const float* V = v + row0v + (int64_t)k0 * ldv;
      const float* O = o + row0v + (int64_t)q0 * ldv;
      const float* G = dO + row0v + (int64_t)q0 * ldv;
      const float* L = lse + ((int64_t)b * H + h) * T + q0;
      // P = exp(scale * Q K^T - lse), masked (rows without keys: lse = -inf, P = 0).
      gemm_f32(false, true, nq, nk, Dq, sh.scale, Q, ldq, K, ldq, 0.f, S.data(), nk);
      mask_scores(sh, seg_row, q0, nq, k0, nk, S.data());
      for (int i = 0; i < nq; ++i) {
        float* s = S.data() + (int64_t)i * nk;
        if (L[i] == kNegInf) {
          std::fill(s, s + nk, 0.f);
          continue;
        }
        for (int j = 0; j < nk; ++j) s[j] = std::exp(s[j] - L[i]);
      }
      // dV[k0:q1] += P^T dO
      gemm_f32(true, false, nk, Dv, nq, 1.f, S.data(), nk, G, ldv, 1.f, dv + row0v + (int64_t)k0 * ldv, ldv);
      // dP = dO V^T; D_i = dO_i . o_i; dS = P * (dP - D) * scale (in dP)
      gemm_f32(false, true, nq, nk, Dv, 1.f, G, ldv, V, ldv, 0.f, dP.data(), nk);
      for (int i = 0; i < nq; ++i) {
        double d = 0;
        for (int c = 0; c < Dv; ++c) d += (double)G[(int64_t)i * ldv + c] * O[(int64_t)i * ldv + c];
        Di[i] = (float)d;
      }
      for (int i = 0; i < nq; ++i) {
        const float* p = S.data() + (int64_t)i * nk;
        float* g = dP.data() + (int64_t)i * nk;
        for (int j = 0; j < nk; ++j) g[j] = p[j] * (g[j] - Di[i]) * sh.scale;
      }
      // dQ[q0:q1] = dS K (each query block once: overwrite); dK[k0:q1] += dS^T Q
      gemm_f32(false, false, nq, Dq, nk, 1.f, dP.data(), nk, K, ldq, 0.f, dq + row0q + (int64_t)q0 * ldq, ldq);
      gemm_f32(true, false, nk, Dq, nq, 1.f, dP.data(), nk, Q, ldq, 1.f, dk + row0q + (int64_t)k0 * ldq, ldq);
    }
  });
}

}  // namespace trex::kern::cpu
