// A host model of the CUDA indexer top-k kernel (kernels/cuda/indexer.cu) for the CPU op harness
// ("indexer[hd]" in tests/ops/compress_pool_ops.cpp): the same walk (a query's scores as 8 warp
// partials over the heads h = w, w + 8, ... added in warp order, the scoring skipped when every
// valid entry is selected, the 8-pass radix selection of the cnt-th largest rank key, the
// selection in index order) on the same functions, kernels/hd/indexer.h. It proves the kernel's
// arithmetic and its rules for ties, NaN, -0, topk > nw and topk = 0 against the reference on any
// machine; rank_keys_test proves the key order equal to the reference's comparison.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>
#include "kernels/hd/dot.h"
#include "kernels/hd/indexer.h"
#include "kernels/indexer.h"
#include "kernels/ref/indexer.h"
#include "tests/ops/harness.h"

namespace trex::ops::hd_model {

constexpr int kWarps = 8;

inline void indexer_topk(const kern::IndexerShape& sh, const float* q, const float* k, const float* wts,
                         const int32_t* pos, int32_t* cnt, int32_t* sel, float* scores_out, float* workspace) {
  (void)workspace;
  const int64_t BT = sh.B * sh.T, kk = sh.topk < sh.nw ? sh.topk : sh.nw;
  std::vector<float> srow(static_cast<size_t>(sh.nw));
  for (int64_t bt = 0; bt < BT; ++bt) {
    const int64_t bb = bt / sh.T;
    const int64_t nv = kern::hd::indexer_nvalid(pos[bt], sh.m, sh.nw);
    const int64_t cn = kk < nv ? kk : nv;
    if (nv > kk || scores_out)
      for (int64_t s = 0; s < nv; ++s) {
        const float* kr = k + (bb * sh.nw + s) * sh.dI;
        float part[kWarps] = {};
        for (int w = 0; w < kWarps; ++w)
          for (int h = w; h < sh.nh; h += kWarps) {
            const float* qh = q + (bt * sh.nh + h) * sh.dI;
            part[w] = kern::hd::indexer_head_term(part[w], wts[bt * sh.nh + h], kern::hd::dot4(qh, kr, sh.dI),
                                                  sh.softmax_scale);
          }
        float sc = part[0];
        for (int w = 1; w < kWarps; ++w) sc += part[w];
        srow[s] = sc;
      }
    if (scores_out)
      for (int64_t s = 0; s < sh.nw; ++s)
        scores_out[bt * sh.nw + s] = s < nv ? srow[s] : -std::numeric_limits<float>::infinity();
    int32_t* so = sel + bt * sh.topk;
    if (nv <= kk || cn == 0) {
      for (int64_t j = 0; j < sh.topk; ++j) so[j] = j < cn ? static_cast<int32_t>(j) : -1;
    } else {
      uint64_t prefix = 0, mask = 0;
      int64_t want = cn;
      int hist[256];
      for (int shift = 56; shift >= 0; shift -= 8) {
        for (int& h : hist) h = 0;
        for (int64_t s = 0; s < nv; ++s) {
          const uint64_t key = kern::hd::indexer_rank_key(srow[s], s);
          if ((key & mask) == prefix) ++hist[(key >> shift) & 255u];
        }
        const int digit = kern::hd::indexer_radix_pick(hist, &want);
        prefix |= uint64_t(digit) << shift;
        mask |= uint64_t(0xFF) << shift;
      }
      int64_t n = 0;
      for (int64_t s = 0; s < nv; ++s)
        if (kern::hd::indexer_rank_key(srow[s], s) >= prefix) so[n++] = static_cast<int32_t>(s);
      for (int64_t j = n; j < sh.topk; ++j) so[j] = -1;
    }
    cnt[bt] = static_cast<int32_t>(cn);
  }
}

// indexer_rank_key orders every pair of special and ordinary scores (NaN, +-inf, +-0, denormals,
// equal values at different indices) as kern::ref::indexer_better does, and kern::indexer_valid_count
// equals hd::indexer_nvalid.
inline bool rank_keys_test() {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float den = std::numeric_limits<float>::denorm_min();
  const float v[] = {nan, -nan, inf, -inf, 0.f, -0.f, den, -den, 1.f, -1.f, 1.5f, -1.5f, 3e38f, -3e38f, 1e-30f};
  const int nv = sizeof v / sizeof v[0];
  size_t bad = 0;
  for (int a = 0; a < nv; ++a)
    for (int b = 0; b < nv; ++b)
      for (int64_t ia : {int64_t{0}, int64_t{7}, int64_t{2147483646}})
        for (int64_t ib : {int64_t{0}, int64_t{5}, int64_t{2147483647}}) {
          if (ia == ib && a != b) continue;  // one index, two scores: not a pair of entries
          const bool ref = kern::ref::indexer_better<float>(v[a], ia, v[b], ib);
          const bool key = kern::hd::indexer_rank_key(v[a], ia) > kern::hd::indexer_rank_key(v[b], ib);
          bad += ref != key;
        }
  for (int64_t pos = -5; pos < 40; ++pos)
    for (int64_t m : {1, 2, 3, 4, 128})
      for (int64_t nw : {0, 1, 7, 9})
        bad += kern::indexer_valid_count(pos, m, nw) != kern::hd::indexer_nvalid(pos, m, nw);
  return report("indexer[hd] rank keys", "pairs", static_cast<double>(bad), 0);
}

}  // namespace trex::ops::hd_model
