// The backward of the lightning indexer's score over a list of (query, key) pairs, shared by the
// indexer losses of DeepSeek-V3.2 (model/v32_indexer_loss.cpp: keys are tokens) and DeepSeek-V4
// (model/v4_indexer.cpp: keys are compressed entries).
//   score I(i, key) = sum_h w[i, h] wsc relu(q[i, h] . k[key])   (the score's own scale in g0)
// Given g(i, k) = g0 dI[first(i) + k] for query i's k-th pair:
//   dw[i, h] = wsc sum_k g relu'(.) (q . k)       dq[i, h] = w[i, h] sum_k g relu'(.) k[key]
//   dk[key]  = sum over its pairs, in query order, of g sum_h relu'(.) w[i, h] q[i, h]
// All three OVERWRITE; sums run in double in a fixed order (independent of the thread count).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>
#include "core/parallel.h"

namespace trex::model {

// a . b in double.
inline double index_dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += (double)a[i] * (double)b[i];
  return s;
}

// Pairs: first(i) (query i's first pair), n(i) (its pairs) and key(i, k) (the key of its k-th).
// q [N, nI, dI], w [N, nI], k [NK, dI], dI_pairs [pairs] -> dq [N, nI, dI], dw [N, nI], dk [NK, dI].
template <class Pairs>
void indexer_score_bwd(const Pairs& L, int64_t N, int64_t NK, int64_t nI, int64_t dI, const float* q, const float* w,
                       const float* k, const float* dI_pairs, double g0, double wsc, float* dq, float* dw, float* dk) {
  // Queries and head weights: per query over its keys.
  parallel_for(N, 4, [&](int64_t i0, int64_t i1) {
    std::vector<double> acc(dI);
    for (int64_t i = i0; i < i1; ++i) {
      const float* dIi = dI_pairs + L.first(i);
      const int64_t n = L.n(i);
      for (int64_t h = 0; h < nI; ++h) {
        const float* qh = q + (i * nI + h) * dI;
        double sw = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const float* kk = k + L.key(i, j) * dI;
          const double a = index_dot(qh, kk, dI), g = g0 * (double)dIi[j];
          if (a <= 0) continue;
          sw += g * a;
          for (int64_t e = 0; e < dI; ++e) acc[e] += g * (double)kk[e];
        }
        dw[i * nI + h] = (float)(sw * wsc);
        const double wh = w[i * nI + h];
        for (int64_t e = 0; e < dI; ++e) dq[(i * nI + h) * dI + e] = (float)(wh * acc[e]);
      }
    }
  });
  // Keys: the (query, pair) lists of each key, in query order (deterministic sums).
  std::vector<int64_t> koff(NK + 1, 0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < L.n(i); ++j) ++koff[L.key(i, j) + 1];
  for (int64_t e = 0; e < NK; ++e) koff[e + 1] += koff[e];
  std::vector<int64_t> kq(koff[NK]), kp(koff[NK]), fill(koff.begin(), koff.end() - 1);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < L.n(i); ++j) {
      const int64_t at = fill[L.key(i, j)]++;
      kq[at] = i, kp[at] = L.first(i) + j;
    }
  parallel_for(NK, 4, [&](int64_t e0, int64_t e1) {
    std::vector<double> acc(dI);
    for (int64_t e = e0; e < e1; ++e) {
      std::fill(acc.begin(), acc.end(), 0.0);
      const float* kk = k + e * dI;
      for (int64_t u = koff[e]; u < koff[e + 1]; ++u) {
        const int64_t i = kq[u];
        const double g = g0 * (double)dI_pairs[kp[u]];
        for (int64_t h = 0; h < nI; ++h) {
          const float* qh = q + (i * nI + h) * dI;
          if (index_dot(qh, kk, dI) <= 0) continue;
          const double gw = g * (double)w[i * nI + h];
          for (int64_t j = 0; j < dI; ++j) acc[j] += gw * (double)qh[j];
        }
      }
      for (int64_t j = 0; j < dI; ++j) dk[e * dI + j] = (float)acc[j];
    }
  });
}

}  // namespace trex::model
