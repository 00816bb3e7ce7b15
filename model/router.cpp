#include "model/router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
#include "core/error.h"
#include "core/parallel.h"

namespace trex::model {

void router_select(const ModelConfig& c, const float* logits, const float* bias, int64_t N, RouterOut& o,
                   const int32_t* fixed_idx) {
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok, G = c.n_group, EG = E / G;
  const bool use_bias = c.topk_method == TopkMethod::NoauxTc && bias;
  const float ninf = -std::numeric_limits<float>::infinity();
  parallel_for(N, 16, [&](int64_t b, int64_t e) {
    std::vector<float> sel(E), gscore(G), top_v(K);
    std::vector<int64_t> top_i(K);
    std::vector<char> gkeep(G);
    for (int64_t n = b; n < e; ++n) {
      const float* lg = logits + n * E;
      float* sc = o.scores + n * E;
      if (c.scoring_func == ScoringFunc::Sigmoid) {
        for (int64_t i = 0; i < E; ++i) sc[i] = 1.f / (1.f + std::exp(-lg[i]));
      } else if (c.scoring_func == ScoringFunc::SqrtSoftplus) {
        // torch softplus (beta 1, threshold 20), then sqrt
        for (int64_t i = 0; i < E; ++i) sc[i] = std::sqrt(lg[i] > 20.f ? lg[i] : std::log1p(std::exp(lg[i])));
      } else {
        float mx = lg[0];
        for (int64_t i = 1; i < E; ++i) mx = std::max(mx, lg[i]);
        double sum = 0;
        for (int64_t i = 0; i < E; ++i) sum += (sc[i] = std::exp(lg[i] - mx));
        float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < E; ++i) sc[i] *= inv;
      }
      for (int64_t i = 0; i < E; ++i) sel[i] = sc[i] + (use_bias ? bias[i] : 0.f);
      // Group-limited: keep the topk_group best groups, mask the rest to -inf.
      if (c.topk_method != TopkMethod::Greedy && G > 1) {
        for (int64_t g = 0; g < G; ++g) {
          const float* s = sel.data() + g * EG;
          if (c.topk_method == TopkMethod::NoauxTc) {  // sum of the group's top-2
            float a = ninf, bb = ninf;
            for (int64_t j = 0; j < EG; ++j) {
              if (s[j] > a) bb = a, a = s[j];
              else if (s[j] > bb) bb = s[j];
            }
            gscore[g] = a + bb;
          } else {  // group_limited_greedy: the group's max
            float a = ninf;
            for (int64_t j = 0; j < EG; ++j) a = std::max(a, s[j]);
            gscore[g] = a;
          }
          gkeep[g] = 0;
        }
        for (int64_t t = 0; t < c.topk_group; ++t) {
          int64_t best = -1;
          for (int64_t g = 0; g < G; ++g)
            if (!gkeep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
          gkeep[best] = 1;
        }
        for (int64_t g = 0; g < G; ++g)
          if (!gkeep[g])
            for (int64_t j = 0; j < EG; ++j) sel[g * EG + j] = ninf;
      }
      int32_t* id = o.idx + n * K;
      float* pr = o.probs + n * K;
      double sum = 0;
      if (fixed_idx) {  // hash routing: the experts are given, the scores still weight them
        for (int64_t k = 0; k < K; ++k) {
          id[k] = fixed_idx[n * K + k];
          pr[k] = sc[id[k]];
          sum += sc[id[k]];
        }
      }
      // K experts by repeated argmax over sel (first index among equal values; -inf never chosen;
      // a NaN chosen when it is the first candidate). Without NaN, one pass keeps the K best in a
      // sorted list, which picks the same experts in the same order (the repeated scans were most
      // of the router's time).
      bool has_nan = false;
      for (int64_t i = 0; i < E; ++i) has_nan |= sel[i] != sel[i];
      int64_t cnt = 0;
      if (!fixed_idx && !has_nan) {
        for (int64_t i = 0; i < E; ++i) {
          const float v = sel[i];
          if (!(v > ninf) || (cnt == K && !(v > top_v[K - 1]))) continue;
          int64_t p = cnt < K ? cnt++ : K - 1;
          for (; p > 0 && v > top_v[p - 1]; --p) top_v[p] = top_v[p - 1], top_i[p] = top_i[p - 1];
          top_v[p] = v, top_i[p] = i;
        }
      }
      for (int64_t k = 0; k < K && !fixed_idx; ++k) {
        int64_t best = -1;
        if (!has_nan) {
          best = k < cnt ? top_i[k] : -1;
        } else {
          for (int64_t i = 0; i < E; ++i)
            if (sel[i] != ninf && (best < 0 || sel[i] > sel[best])) best = i;
        }
        if (best < 0) best = 0;  // unreachable: config validation guarantees K selectable experts
        sel[best] = ninf;
        id[k] = (int32_t)best;
        pr[k] = sc[best];
        sum += sc[best];
      }
      if (c.norm_topk_prob) {
        float den = (float)sum + 1e-20f;
        for (int64_t k = 0; k < K; ++k) pr[k] /= den;
      }
      for (int64_t k = 0; k < K; ++k) pr[k] *= (float)c.routed_scaling_factor;
    }
  });
}

void router_probs_backward(const ModelConfig& c, const RouterOut& o, const float* dprobs, int64_t N, float* dscores) {
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok;
  const float rs = (float)c.routed_scaling_factor;
  parallel_for(N, 64, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const int32_t* id = o.idx + n * K;
      const float* dp = dprobs + n * K;
      const float* sc = o.scores + n * E;
      float* ds = dscores + n * E;
      if (!c.norm_topk_prob) {
        for (int64_t k = 0; k < K; ++k) ds[id[k]] += rs * dp[k];
        continue;
      }
      // p_k = rs * s_k / (S + eps), S = sum_j s_j  =>  ds_k = rs * (dp_k - sum_j dp_j p_j / rs) / (S + eps)
      double S = 0;
      for (int64_t k = 0; k < K; ++k) S += sc[id[k]];
      double den = S + 1e-20;
      double dot = 0;
      for (int64_t k = 0; k < K; ++k) dot += (double)dp[k] * sc[id[k]];
      for (int64_t k = 0; k < K; ++k) ds[id[k]] += (float)(rs * (dp[k] / den - dot / (den * den)));
    }
  });
}

void router_scores_backward(const ModelConfig& c, const float* scores, const float* dscores, int64_t N,
                            float* dlogits) {
  const int64_t E = c.n_routed_experts;
  parallel_for(N, 64, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* s = scores + n * E;
      const float* ds = dscores + n * E;
      float* dl = dlogits + n * E;
      if (c.scoring_func == ScoringFunc::Sigmoid) {
        for (int64_t i = 0; i < E; ++i) dl[i] = ds[i] * s[i] * (1.f - s[i]);
      } else if (c.scoring_func == ScoringFunc::SqrtSoftplus) {
        // s = sqrt(sp(x)): ds/dx = sigmoid(x) / (2 s), and sigmoid(x) = 1 - exp(-sp) = -expm1(-s^2)
        for (int64_t i = 0; i < E; ++i) dl[i] = s[i] > 0.f ? ds[i] * (float)(-std::expm1(-(double)s[i] * s[i]) / (2.0 * s[i])) : 0.f;
      } else {
        double dot = 0;
        for (int64_t i = 0; i < E; ++i) dot += (double)ds[i] * s[i];
        for (int64_t i = 0; i < E; ++i) dl[i] = (float)(s[i] * (ds[i] - dot));
      }
    }
  });
}

double seq_aux_loss(const ModelConfig& c, const RouterOut& o, int64_t B, int64_t T, double alpha, float grad_scale,
                    float* dscores, int64_t n0, int64_t N, const std::function<void(double*, size_t)>& sum_counts) {
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok;
  if (N < 0) N = B * T;
  TREX_CHECK(n0 >= 0 && n0 + N <= B * T, "seq_aux_loss: rows [", n0, ", ", n0 + N, ") outside the ", B, " x ", T,
             " batch");
  // Selection counts per sequence and expert (o's row i is token n0 + i).
  std::vector<double> cnt(B * E, 0.0);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t b = (n0 + i) / T;
    for (int64_t k = 0; k < K; ++k) cnt[b * E + o.idx[i * K + k]] += 1.0;
  }
  if (sum_counts) sum_counts(cnt.data(), cnt.size());
  double total = 0;
  std::vector<double> f(E), P(E);
  const int64_t b0 = N > 0 ? n0 / T : 0, b1 = N > 0 ? (n0 + N - 1) / T + 1 : 0;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t i0 = std::max(b * T, n0) - n0, i1 = std::min((b + 1) * T, n0 + N) - n0;  // its rows here
    std::fill(P.begin(), P.end(), 0.0);
    for (int64_t i = i0; i < i1; ++i) {
      const float* s = o.scores + i * E;
      double Z = 0;
      for (int64_t e = 0; e < E; ++e) Z += s[e];
      for (int64_t e = 0; e < E; ++e) P[e] += s[e] / Z;
    }
    double L = 0;
    for (int64_t e = 0; e < E; ++e) {
      f[e] = cnt[b * E + e] * ((double)E / (double)(K * T));
      P[e] /= (double)T;
      L += f[e] * P[e];
    }
    total += alpha * L / B;
    if (!dscores) continue;
    // dL/ds'_{t,i} = alpha f_i / (T B);  s'_i = s_i / Z  =>  ds_i = (g_i - sum_j g_j s'_j) / Z
    for (int64_t i = i0; i < i1; ++i) {
      const float* s = o.scores + i * E;
      double Z = 0, dot = 0;
      for (int64_t e = 0; e < E; ++e) Z += s[e];
      for (int64_t e = 0; e < E; ++e) dot += alpha * f[e] / (T * B) * (s[e] / Z);
      for (int64_t e = 0; e < E; ++e)
        dscores[i * E + e] += grad_scale * (float)((alpha * f[e] / (T * B) - dot) / Z);
    }
  }
  return total;
}

}  // namespace trex::model
