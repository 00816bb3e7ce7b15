// The MoE router's per-row math (kernels/router.h), shared by the CPU functions and the CUDA
// kernels: the scores of one token's logits, the choice of its experts, and the two backward steps.
// Each function reads and writes one row; the callers walk the rows.
#pragma once
#include <cstdint>
#include "kernels/hd/hd.h"
#include "kernels/router.h"

namespace trex::kern::hd {

// sc [E] = score(lg [E]): sigmoid, softmax (sum in double) or sqrt(softplus) (torch's softplus:
// beta 1, threshold 20). sc may alias lg.
TREX_HD void router_scores_row(const RouterShape& s, const float* lg, float* sc) {
  const int64_t E = s.E;
  if (s.score == RouterScore::Sigmoid) {
    for (int64_t i = 0; i < E; ++i) sc[i] = 1.f / (1.f + std::exp(-lg[i]));
  } else if (s.score == RouterScore::SqrtSoftplus) {
    for (int64_t i = 0; i < E; ++i) sc[i] = std::sqrt(lg[i] > 20.f ? lg[i] : std::log1p(std::exp(lg[i])));
  } else {
    float mx = lg[0];
    for (int64_t i = 1; i < E; ++i) mx = mx < lg[i] ? lg[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < E; ++i) sum += (sc[i] = std::exp(lg[i] - mx));
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < E; ++i) sc[i] *= inv;
  }
}

// The experts of one token and their combine weights: id [K], pr [K] from its scores sc [E].
// Selection value of expert i: sc[i] (+ bias[i] for noaux_tc when bias is set); group-limited
// methods keep the topk_group best groups (noaux_tc: by the sum of a group's two best values,
// group_limited_greedy: by its best) and mask the others to -inf; then the K best values, first
// index among equal values, -inf never chosen, a NaN chosen when it is the first candidate.
// fixed: [K] given experts (hash routing) or null. probs = the chosen scores (divided by their sum
// + 1e-20 if norm_topk_prob) x scale. gscore [G] and gkeep [G] are scratch.
TREX_HD void router_select_row(const RouterShape& s, const float* sc, const float* bias, const int32_t* fixed,
                               float* gscore, unsigned char* gkeep, int32_t* id, float* pr) {
  const int64_t E = s.E, K = s.K, G = s.groups, EG = E / G;
  const bool use_bias = s.topk == RouterTopk::NoauxTc && bias;
  const bool grouped = s.topk != RouterTopk::Greedy && G > 1;
  const float ninf = -INFINITY;
  auto sel = [&](int64_t i) { return sc[i] + (use_bias ? bias[i] : 0.f); };
  if (grouped) {
    for (int64_t g = 0; g < G; ++g) {
      if (s.topk == RouterTopk::NoauxTc) {  // sum of the group's top-2
        float a = ninf, b = ninf;
        for (int64_t j = 0; j < EG; ++j) {
          const float v = sel(g * EG + j);
          if (v > a) b = a, a = v;
          else if (v > b) b = v;
        }
        gscore[g] = a + b;
      } else {  // group_limited_greedy: the group's max
        float a = ninf;
        for (int64_t j = 0; j < EG; ++j) {
          const float v = sel(g * EG + j);
          a = a < v ? v : a;
        }
        gscore[g] = a;
      }
      gkeep[g] = 0;
    }
    for (int64_t t = 0; t < s.topk_group; ++t) {
      int64_t best = -1;
      for (int64_t g = 0; g < G; ++g)
        if (!gkeep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
      if (best >= 0) gkeep[best] = 1;
    }
  }
  auto masked = [&](int64_t i) { return grouped && !gkeep[i / EG] ? ninf : sel(i); };
  double sum = 0;
  if (fixed) {  // hash routing: the experts are given, the scores still weight them
    for (int64_t k = 0; k < K; ++k) {
      id[k] = fixed[k];
      pr[k] = sc[id[k]];
      sum += sc[id[k]];
    }
  } else {
    bool has_nan = false;
    for (int64_t i = 0; i < E; ++i) {
      const float v = masked(i);
      has_nan |= v != v;
    }
    if (!has_nan) {
      // One pass keeps the K best in a sorted list (values in pr, indices in id), which picks the
      // same experts in the same order as K scans for the maximum.
      int64_t cnt = 0;
      for (int64_t i = 0; i < E; ++i) {
        const float v = masked(i);
        if (!(v > ninf) || (cnt == K && !(v > pr[K - 1]))) continue;
        int64_t p = cnt < K ? cnt++ : K - 1;
        for (; p > 0 && v > pr[p - 1]; --p) pr[p] = pr[p - 1], id[p] = id[p - 1];
        pr[p] = v, id[p] = (int32_t)i;
      }
      for (int64_t k = 0; k < K; ++k) {
        const int32_t best = k < cnt ? id[k] : 0;  // (fewer than K selectable: unreachable, see config checks)
        id[k] = best;
        pr[k] = sc[best];
        sum += sc[best];
      }
    } else {
      for (int64_t k = 0; k < K; ++k) {
        int64_t best = -1;
        float vb = 0.f;
        for (int64_t i = 0; i < E; ++i) {
          bool taken = false;
          for (int64_t j = 0; j < k; ++j) taken |= id[j] == i;
          const float v = taken ? ninf : masked(i);
          if (v != ninf && (best < 0 || v > vb)) best = i, vb = v;
        }
        if (best < 0) best = 0;
        id[k] = (int32_t)best;
        pr[k] = sc[best];
        sum += sc[best];
      }
    }
  }
  if (s.norm_topk_prob) {
    const float den = (float)sum + 1e-20f;
    for (int64_t k = 0; k < K; ++k) pr[k] /= den;
  }
  for (int64_t k = 0; k < K; ++k) pr[k] *= s.scale;
}

// ds [E] += d(probs)/d(scores)^T dp [K] for one token (id, sc: its forward's selection and scores).
TREX_HD void router_probs_bwd_row(const RouterShape& s, const float* sc, const int32_t* id, const float* dp,
                                  float* ds) {
  const int64_t K = s.K;
  const float rs = s.scale;
  if (!s.norm_topk_prob) {
    for (int64_t k = 0; k < K; ++k) ds[id[k]] += rs * dp[k];
    return;
  }
  // p_k = rs s_k / (S + eps), S = sum_j s_j  =>  ds_k = rs (dp_k - sum_j dp_j p_j / rs) / (S + eps)
  double S = 0;
  for (int64_t k = 0; k < K; ++k) S += sc[id[k]];
  const double den = S + 1e-20;
  double dot = 0;
  for (int64_t k = 0; k < K; ++k) dot += (double)dp[k] * sc[id[k]];
  for (int64_t k = 0; k < K; ++k) ds[id[k]] += (float)(rs * (dp[k] / den - dot / (den * den)));
}

// dl [E] = dscore/dlogit^T ds [E] for one token (sc: its scores; dl may alias ds).
TREX_HD void router_scores_bwd_row(const RouterShape& s, const float* sc, const float* ds, float* dl) {
  const int64_t E = s.E;
  if (s.score == RouterScore::Sigmoid) {
    for (int64_t i = 0; i < E; ++i) dl[i] = ds[i] * sc[i] * (1.f - sc[i]);
  } else if (s.score == RouterScore::SqrtSoftplus) {
    // s = sqrt(sp(x)): ds/dx = sigmoid(x) / (2 s), and sigmoid(x) = 1 - exp(-sp) = -expm1(-s^2)
    for (int64_t i = 0; i < E; ++i)
      dl[i] = sc[i] > 0.f ? ds[i] * (float)(-std::expm1(-(double)sc[i] * sc[i]) / (2.0 * sc[i])) : 0.f;
  } else {
    double dot = 0;
    for (int64_t i = 0; i < E; ++i) dot += (double)ds[i] * sc[i];
    for (int64_t i = 0; i < E; ++i) dl[i] = (float)(sc[i] * (ds[i] - dot));
  }
}

}  // namespace trex::kern::hd
