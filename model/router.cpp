#include "model/router.h"

#include <vector>
#include "core/error.h"

namespace trex::model {

kern::RouterShape router_shape(const ModelConfig& c, int64_t N) {
  kern::RouterShape s;
  s.N = N, s.E = c.n_routed_experts, s.K = c.num_experts_per_tok;
  s.groups = c.n_group, s.topk_group = c.topk_group;
  s.score = c.scoring_func == ScoringFunc::Sigmoid        ? kern::RouterScore::Sigmoid
            : c.scoring_func == ScoringFunc::SqrtSoftplus ? kern::RouterScore::SqrtSoftplus
                                                          : kern::RouterScore::Softmax;
  s.topk = c.topk_method == TopkMethod::NoauxTc              ? kern::RouterTopk::NoauxTc
           : c.topk_method == TopkMethod::GroupLimitedGreedy ? kern::RouterTopk::GroupLimitedGreedy
                                                             : kern::RouterTopk::Greedy;
  s.norm_topk_prob = c.norm_topk_prob;
  s.scale = (float)c.routed_scaling_factor;
  return s;
}

void router_select(const ModelConfig& c, const float* logits, const float* bias, int64_t N, RouterOut& o,
                   const int32_t* fixed_idx) {
  kern::router_select(router_shape(c, N), logits, bias, fixed_idx, o.scores, o.idx, o.probs);
}

void router_probs_backward(const ModelConfig& c, const RouterOut& o, const float* dprobs, int64_t N, float* dscores) {
  kern::router_probs_bwd(router_shape(c, N), o.scores, o.idx, dprobs, dscores);
}

void router_scores_backward(const ModelConfig& c, const float* scores, const float* dscores, int64_t N,
                            float* dlogits) {
  kern::router_scores_bwd(router_shape(c, N), scores, dscores, dlogits);
}

double seq_aux_loss(const ModelConfig& c, const RouterOut& o, int64_t B, int64_t T, double alpha, float grad_scale,
                    float* dscores, int64_t n0, int64_t N, const std::function<void(double*, size_t)>& sum_counts,
                    int64_t Tn) {
  if (N < 0) N = B * T;
  TREX_CHECK(n0 >= 0 && n0 + N <= B * T, "seq_aux_loss: rows [", n0, ", ", n0 + N, ") outside the ", B, " x ", T,
             " batch");
  const kern::RouterShape s = router_shape(c, N);
  // Selection counts per sequence and expert (o's row i is token n0 + i).
  std::vector<double> cnt(B * s.E, 0.0);
  kern::router_aux_counts(s, o.idx, T, n0, cnt.data());
  if (sum_counts) sum_counts(cnt.data(), cnt.size());
  return kern::router_aux_loss(s, o.scores, cnt.data(), B, T, n0, alpha, grad_scale, dscores, Tn);
}

}  // namespace trex::model
