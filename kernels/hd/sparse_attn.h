// The per-(query, head) math of sparse shared-KV sink attention (kernels/sparse_attn.h), shared by
// the CUDA kernels (kernels/cuda/sparse_attn.cu) and the host model of their tiled walk that the
// CPU op harness runs against the reference (tests/ops/sparse_attn_ops.cpp, "sattn[hd]").
// Forward keeps an online softmax over the listed rows, in tiles, started from the sink:
//   state (m, l) = (sink, 1) or (-inf, 0) without a sink; per tile with max mt over its scores:
//   mn = max(m, mt) (NaN scores do not raise it), l = l corr(m, mn) + sum_j prob(s_j, mn).
// A NaN score makes its prob NaN, so o and lse turn NaN exactly where the reference's do; a
// query whose scores are all NaN or none, without a sink, ends at m = -inf: o = 0, lse = -inf, as
// in the reference (which takes its max over the non-NaN scores).
#pragma once
#include <cstdint>
#include "kernels/hd/hd.h"

namespace trex::kern::hd {

// Running max and sum of one (query, head): start from the sink (it joins the softmax) or empty.
struct SattnRow {
  float m, l;
};
TREX_HD SattnRow sattn_start(const float* sink, int h) {
  if (!sink || sink[h] == -INFINITY) return {-INFINITY, 0.f};
  return {sink[h], 1.f};
}

// Factor that rescales the running sum and output when the max moves from m to mn >= m.
TREX_HD float sattn_corr(float m, float mn) { return m == mn ? 1.f : std::exp(m - mn); }

// Probability weight of score s under the running max mn (before the final 1 / l): 0 for an absent
// (-inf) score; a NaN score stays NaN, also while mn is still -inf.
TREX_HD float sattn_prob(float s, float mn) {
  if (s == -INFINITY) return 0.f;
  if (mn == -INFINITY) return s != s ? s : 0.f;
  return std::exp(s - mn);
}

// One tile: the tile's max mt (over its non-NaN scores, -inf if none) and the sum of its probs
// under the new max (computed by the caller with sattn_prob(s, sattn_newmax(r.m, mt))).
TREX_HD float sattn_newmax(float m, float mt) { return mt > m ? mt : m; }
TREX_HD SattnRow sattn_update(SattnRow r, float mn, float psum) { return {mn, r.l * sattn_corr(r.m, mn) + psum}; }

// Final 1 / l for the output (0 when nothing was attended: o = 0) and lse (-inf then).
TREX_HD float sattn_inv(SattnRow r) { return r.m == -INFINITY ? 0.f : 1.f / r.l; }
TREX_HD float sattn_lse(SattnRow r) { return r.m == -INFINITY ? -INFINITY : r.m + std::log(r.l); }

// Backward, with L = lse[i, h] and delta = dO[i, h] . o[i, h]:
// p = exp(scale q.k - L) (0 for every row when L = -inf: the reference skips such a query);
// ds = scale p (dp - delta), dp = dO . k: the gradient of the score q.k (dq += ds k, dk += ds q).
TREX_HD float sattn_bwd_prob(float dot, float scale, float L) {
  return L == -INFINITY ? 0.f : std::exp(scale * dot - L);
}
TREX_HD float sattn_ds(float p, float dp, float delta, float scale) { return p * (dp - delta) * scale; }
// dsink[h] term of one query: -exp(sink - L) delta (0 when L = -inf).
TREX_HD float sattn_dsink_term(float sink, float L, float delta) {
  return L == -INFINITY ? 0.f : -std::exp(sink - L) * delta;
}

// Query chunks of the CUDA dkv walk (kernels/cuda/sparse_attn.cu): about 16 queries each, at most
// 264 (two blocks per SM of an H100 / H200) and at most 1 + the [M, D] copies that fit 1 GiB. A
// function of the shape only, so the sums' order is too. (Host code: the launch and its model.)
inline int sattn_dkv_chunks(int64_t N, int64_t M, int D) {
  const int64_t copy = M * D * int64_t(sizeof(float));
  const int64_t by_mem = copy > 0 ? (int64_t(1) << 30) / copy + 1 : 264;
  int64_t c = (N + 15) / 16;
  if (c > 264) c = 264;
  if (c > by_mem) c = by_mem;
  return static_cast<int>(c < 1 ? 1 : c);
}

}  // namespace trex::kern::hd
