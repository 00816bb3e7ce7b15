// model::router_select's choice of experts against the rule it implements, written the plain way:
// K times the first index of the largest remaining selection score (scores plus the noaux bias,
// groups outside the topk_group best masked to -inf), over random configs (every scoring function
// and group method, odd expert and group counts) and rows with ties, -inf and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>
#include "model/router.h"

namespace {

using namespace trex;

// The experts of one token by repeated argmax over its selection scores `sel` (modified).
std::vector<int32_t> argmax_rule(std::vector<float> sel, int64_t K) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<int32_t> id(K);
  for (int64_t k = 0; k < K; ++k) {
    int64_t best = -1;
    for (int64_t i = 0; i < (int64_t)sel.size(); ++i)
      if (sel[i] != ninf && (best < 0 || sel[i] > sel[best])) best = i;
    if (best < 0) best = 0;
    sel[best] = ninf;
    id[k] = (int32_t)best;
  }
  return id;
}

TEST(RouterSelect, ExpertsAreTheRepeatedArgmaxOfTheSelectionScores) {
  std::mt19937 g(11);
  const float ninf = -std::numeric_limits<float>::infinity();
  int rows = 0;
  for (int it = 0; it < 400; ++it) {
    model::ModelConfig c;
    const int64_t G = 1 + g() % 4, EG = 1 + g() % 9, E = G * EG;
    c.n_routed_experts = E, c.n_group = G, c.topk_group = 1 + g() % G;
    c.num_experts_per_tok = 1 + g() % std::min<int64_t>(c.topk_group * EG, 7);
    c.topk_method = (model::TopkMethod)(g() % 3);
    c.scoring_func = (model::ScoringFunc)(g() % 3);
    c.norm_topk_prob = g() % 2, c.routed_scaling_factor = 1.5;
    const int64_t N = 1 + g() % 20, K = c.num_experts_per_tok;
    const int kind = g() % 3;  // 0: continuous; 1: coarse values (ties); 2: coarse with NaN and -inf
    std::normal_distribution<float> nd(0, 1);
    std::vector<float> lg(N * E), bias(E);
    for (float& x : lg) x = kind ? std::round(nd(g) * 2) / 2 : nd(g);
    for (float& b : bias) b = kind ? std::round(nd(g)) / 10 : nd(g) / 10;
    if (kind == 2) lg[g() % lg.size()] = std::nanf(""), lg[g() % lg.size()] = ninf;
    std::vector<float> sc(lg), pr(N * K);
    std::vector<int32_t> idx(N * K);
    model::RouterOut o{sc.data(), idx.data(), pr.data()};
    model::router_select(c, sc.data(), bias.data(), N, o);
    const bool use_bias = c.topk_method == model::TopkMethod::NoauxTc;
    for (int64_t n = 0; n < N; ++n, ++rows) {
      // The selection scores from the router's own scores, then the group mask as documented.
      std::vector<float> sel(E);
      for (int64_t i = 0; i < E; ++i) sel[i] = sc[n * E + i] + (use_bias ? bias[i] : 0.f);
      if (c.topk_method != model::TopkMethod::Greedy && G > 1) {
        std::vector<float> gs(G);
        for (int64_t q = 0; q < G; ++q) {
          float a = ninf, b = ninf;
          for (int64_t j = 0; j < EG; ++j) {
            const float s = sel[q * EG + j];
            if (s > a) b = a, a = s;
            else if (s > b) b = s;
          }
          gs[q] = c.topk_method == model::TopkMethod::NoauxTc ? a + b : a;
        }
        std::vector<char> keep(G, 0);
        for (int64_t t = 0; t < c.topk_group; ++t) {
          int64_t best = -1;
          for (int64_t q = 0; q < G; ++q)
            if (!keep[q] && (best < 0 || gs[q] > gs[best])) best = q;
          keep[best] = 1;
        }
        for (int64_t q = 0; q < G; ++q)
          if (!keep[q])
            for (int64_t j = 0; j < EG; ++j) sel[q * EG + j] = ninf;
      }
      const std::vector<int32_t> want = argmax_rule(sel, K);
      double sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        ASSERT_EQ(idx[n * K + k], want[k]) << "config " << it << " row " << n << " slot " << k;
        sum += sc[n * E + want[k]];
      }
      // The weights: the chosen scores in slot order, normalized when asked, then scaled.
      for (int64_t k = 0; k < K; ++k) {
        float w = sc[n * E + want[k]];
        if (c.norm_topk_prob) w /= (float)sum + 1e-20f;
        w *= (float)c.routed_scaling_factor;
        if (std::isnan(w)) EXPECT_TRUE(std::isnan(pr[n * K + k]));
        else EXPECT_EQ(pr[n * K + k], w) << "config " << it << " row " << n << " slot " << k;
      }
    }
  }
  EXPECT_GT(rows, 1000);
}

}  // namespace
