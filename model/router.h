// DeepSeek router vocabulary: logits = x @ Wr^T (always f32, as the reference keeps the gate in
// fp32), scores = sigmoid, softmax or sqrt(softplus) of the logits, selection on scores (+ the
// e_score_correction_bias for noaux_tc, which therefore never receives a gradient), group-limited
// top-k, probs = selected scores (normalized if norm_topk_prob) x routed_scaling_factor.
// The routing map is idx [N, K]. Backward: the selection carries no gradient; probs do.
#pragma once
#include <cstdint>
#include <functional>
#include "kernels/router.h"
#include "model/config.h"

namespace trex::model {

struct RouterOut {
  float* scores = nullptr;  // [N, E]
  int32_t* idx = nullptr;   // [N, K] selected experts
  float* probs = nullptr;   // [N, K] combine weights
};

// The kernel layer's description of this model's router for N tokens (kernels/router.h, where the
// math lives; the functions below are its host entry points in model terms).
kern::RouterShape router_shape(const ModelConfig& c, int64_t N);

// scores [N, E] from logits [N, E] (in place allowed), then selection. bias: [E] or null.
// fixed_idx: [N, K] or null: hash routing (DeepSeek-V4 tid2eid), the experts are given and the
// scores only weight them.
void router_select(const ModelConfig& c, const float* logits, const float* bias, int64_t N, RouterOut& o,
                   const int32_t* fixed_idx = nullptr);

// dprobs [N, K] -> dscores [N, E] (+=)
void router_probs_backward(const ModelConfig& c, const RouterOut& o, const float* dprobs, int64_t N, float* dscores);
// dscores [N, E] -> dlogits [N, E] (overwrite; dscores may alias dlogits)
void router_scores_backward(const ModelConfig& c, const float* scores, const float* dscores, int64_t N, float* dlogits);

// Sequence-wise auxiliary balance loss (DeepSeek-V3 eqs. 17-20) over B sequences of T tokens:
// mean over sequences of alpha * sum_i f_i P_i. o holds the token rows [n0, n0 + N) of the
// flattened B x T batch (N < 0: all of it). A shard of the batch (sequence parallel) passes
// sum_counts, which sums a [B, E] array of expert selection counts over the shards (every shard
// calls it once, in the same order); f_i then counts the whole sequence and P_i the shard's rows.
// Returns the shard's part of the loss (the parts of all shards add up to the loss); adds
// grad_scale * dL/dscores of its rows into dscores when non-null. Tn > 0 (context parallel): the
// B x T rows are each a part of a sequence of Tn tokens (sum_counts sums over the parts).
double seq_aux_loss(const ModelConfig& c, const RouterOut& o, int64_t B, int64_t T, double alpha, float grad_scale,
                    float* dscores, int64_t n0 = 0, int64_t N = -1,
                    const std::function<void(double*, size_t)>& sum_counts = {}, int64_t Tn = 0);

}  // namespace trex::model
