// Scalar reference for DeepSeek-V4's lightning-indexer top-k (the canonical definition), as in
// Hugging Face DeepseekV4IndexerScorer + the selection in DeepseekV4Indexer.forward (no cache):
//   score[b, t, s] = sum_h wts[b, t, h] * (relu(q[b, t, h, :] . k[b, s, :]) * softmax_scale)
//   entry s is valid for query t iff s < nv(t) = clamp(floor((pos[b, t] + 1) / m), 0, nw)
//   selected = the top min(topk, nw) entries by score with invalid ones at -inf, minus the
//              invalid ones: cnt = min(topk, nw, nv) entries, all valid.
// Output order: sel ascending by index, padded with -1 to topk. Ties: among equal scores the
// lower index wins (torch leaves tie order unspecified); -0 equals +0; a NaN score ranks above
// every number (as in torch.topk). scores_out holds the score for s < nv and -inf for s >= nv
// (the masked index_scores of HF). No gradient: the selection is not differentiable.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/indexer.h"

namespace trex::kern::ref {

// Whether score a at index ia ranks before score b at index ib.
template <class T>
bool indexer_better(T a, int64_t ia, T b, int64_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// scores: [n] (n = nv valid entries), kk = min(topk, nw) -> sel: [topk] ascending, -1 padded;
// returns the count.
template <class T>
int32_t indexer_select(const T* scores, int64_t n, int64_t kk, int topk, int32_t* sel) {
  std::vector<int64_t> id(static_cast<size_t>(n));
  std::iota(id.begin(), id.end(), int64_t{0});
  const int64_t cnt = std::min(kk, n);
  std::sort(id.begin(), id.end(),
            [&](int64_t a, int64_t b) { return indexer_better<T>(scores[a], a, scores[b], b); });
  id.resize(static_cast<size_t>(cnt));
  std::sort(id.begin(), id.end());
  for (int j = 0; j < topk; ++j) sel[j] = j < cnt ? static_cast<int32_t>(id[j]) : -1;
  return static_cast<int32_t>(cnt);
}

// q: [B, T, nh, dI]  k: [B, nw, dI]  wts: [B, T, nh]  pos: [B, T]
//   -> cnt: [B*T]  sel: [B*T, topk] (ascending, -1 padded)  scores_out: [B, T, nw] or null
template <class T>
void indexer_topk(const IndexerShape& sh, const T* q, const T* k, const T* wts, const int32_t* pos, int32_t* cnt,
                  int32_t* sel, T* scores_out) {
  const int64_t nw = sh.nw, kk = std::min<int64_t>(sh.topk, nw);
  std::vector<T> sc(static_cast<size_t>(nw));
  for (int64_t b = 0; b < sh.B; ++b)
    for (int64_t t = 0; t < sh.T; ++t) {
      const int64_t bt = b * sh.T + t;
      const int64_t nv = indexer_valid_count(pos[bt], sh.m, nw);
      for (int64_t s = 0; s < nw; ++s) {
        T acc = 0;
        if (s < nv)
          for (int h = 0; h < sh.nh; ++h) {
            const T* qh = q + (bt * sh.nh + h) * sh.dI;
            const T* ks = k + (b * nw + s) * sh.dI;
            T dot = 0;
            for (int i = 0; i < sh.dI; ++i) dot += qh[i] * ks[i];
            const T r = dot < T(0) ? T(0) : dot;  // relu; NaN stays NaN as in torch
            acc += wts[bt * sh.nh + h] * (r * static_cast<T>(sh.softmax_scale));
          }
        else
          acc = -std::numeric_limits<T>::infinity();
        sc[s] = acc;
        if (scores_out) scores_out[bt * nw + s] = acc;
      }
      cnt[bt] = indexer_select<T>(sc.data(), nv, kk, sh.topk, sel + bt * sh.topk);
    }
}

}  // namespace trex::kern::ref
