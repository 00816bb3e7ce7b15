// The MoE router after the gate GEMM (DeepSeek vocabulary, model/router.h): scores from the
// logits, the choice of each token's experts, the sequence-wise balance loss, the sort of the
// (token, slot) pairs by expert, and the backward steps. The per-row math is kernels/hd/router.h,
// shared with the CUDA kernels. Every sum has a fixed order, so results do not depend on threads.
#pragma once
#include <cstdint>

namespace trex::kern {

enum class RouterScore : uint8_t { Softmax, Sigmoid, SqrtSoftplus };
enum class RouterTopk : uint8_t { Greedy, GroupLimitedGreedy, NoauxTc };

struct RouterShape {
  int64_t N = 0;  // tokens
  int64_t E = 0;  // routed experts
  int64_t K = 0;  // experts per token
  int64_t groups = 1, topk_group = 1;  // group-limited methods: E / groups experts per group
  RouterScore score = RouterScore::Softmax;
  RouterTopk topk = RouterTopk::Greedy;
  bool norm_topk_prob = false;
  float scale = 1.f;  // routed_scaling_factor
};

// logits [N, E] -> scores [N, E] (may alias logits), idx [N, K], probs [N, K]. bias [E] (noaux_tc's
// e_score_correction_bias; ignored by other methods) or null; fixed_idx [N, K] (hash routing) or
// null.
void router_select(const RouterShape& s, const float* logits, const float* bias, const int32_t* fixed_idx,
                   float* scores, int32_t* idx, float* probs);
// dscores [N, E] += the probs' adjoint of dprobs [N, K].
void router_probs_bwd(const RouterShape& s, const float* scores, const int32_t* idx, const float* dprobs,
                      float* dscores);
// dlogits [N, E] = the scores' adjoint of dscores [N, E] (dlogits may alias dscores).
void router_scores_bwd(const RouterShape& s, const float* scores, const float* dscores, float* dlogits);

// The sequence-wise balance loss (DeepSeek-V3 eqs. 17-20) over B sequences of T tokens, of which
// these N rows are the tokens [n0, n0 + N) of the flattened batch:
// cnt [B, E] += how often each sequence's tokens chose each expert (these rows' part);
void router_aux_counts(const RouterShape& s, const int32_t* idx, int64_t T, int64_t n0, double* cnt);
// with cnt the whole sequences' counts: returns these rows' part of alpha mean_b sum_i f_bi P_bi
// and, when dscores is set, adds grad_scale x its gradient. Tn > 0: the sequences are Tn tokens
// long, of which each of the B rows here holds T (context parallel: f and P are normalized by Tn).
double router_aux_loss(const RouterShape& s, const float* scores, const double* cnt, int64_t B, int64_t T, int64_t n0,
                       double alpha, float grad_scale, float* dscores, int64_t Tn = 0);

// Counting sort of the N K (token, slot) pairs by expert idx [N K], stable in token order:
// offsets [E + 1] (expert e's rows are [offsets[e], offsets[e + 1])), row_token [N K] (the token
// of each sorted row), slot_row [N K] (the sorted row of each pair).
void moe_sort(const int32_t* idx, int64_t N, int64_t K, int64_t E, int64_t* offsets, int32_t* row_token,
              int32_t* slot_row);

}  // namespace trex::kern
