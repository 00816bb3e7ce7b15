// The DeepSeek-V3.2 lightning indexer's KL loss (DeepSeek-V3.2 report, "DeepSeek Sparse
// Attention"), forward and backward side by side. Per query t of a layer, over its attended keys
// A_t (the indexer's top-k in the sparse stage; every causal key of t's document in the dense
// warm-up):
//   p_t[s] = sum_h P_h[t, s] / sum_{s' in A_t} sum_h P_h[t, s']   the main attention's
//            probabilities summed over heads, L1-normalized over A_t (detached: no gradient)
//   q_t    = softmax over A_t of I_t,  I_t[s] = c * sum_j wts[t, j] relu(iq[t, j] . ik[s])
//            (the indexer's score, c = dI^-0.5 nI^-0.5 as in v32_index_shape)
//   loss   = mean over the N = B T queries of KL(p_t || q_t)   (terms with p = 0 are 0)
//            (context parallel: each rank sums its queries' terms over the whole micro-batch's
//            count; Model::run_cp sums the ranks' parts)
//   recall = mean over queries of the main attention's mass inside the indexer's top-k: dense
//            warm-up, sum of p_t over the top-k; sparse stage, mean over heads of
//            exp(lse_h(top-k) - lse_h(every causal key)), the dense attention's mass there.
// dloss / dI_t[s] = (q_t[s] - p_t[s]) / N. The indexer's inputs (x and the q latent qan) are
// detached: the backward adds the gradients of ix_grad * loss into wq_b, wk, k_norm (LayerNorm)
// and weights_proj only, through the relu, the projections and RoPE; no activation gradient.
// Context parallel: the keys are every cp rank's (all-gathered, v32_index_keys_all); their
// gradients from this rank's queries are reduce-scattered back to the keys' owners.
#pragma once
#include <cstdint>
#include "model/mla.h"

namespace trex::model {

// The indexer's top-k of each query (document-relative, ascending, cnt[i] of them at stride kt),
// the flat key index of the first token of its document and of its own token (the key rows are
// the whole rows' under context parallel: [B, v32_key_len(in)]).
struct IndexerTopk {
  const int32_t* cnt;
  const int32_t* sel;
  int64_t kt;
  const int32_t* start;
  const int32_t* self;
};

// After the attention over s.off / s.idx (s.lse set): -> s.ix_dI [pairs] (kept for the
// backward), s.ix_loss, s.ix_recall. The indexer's queries and keys are recomputed (scratch).
void v32_index_loss_forward(const Ctx&, const AttnIn&, MlaSaved& s, const IndexerTopk& top);
// Gradients of in.ix_grad * loss: += into the indexer's tensors in in.G (the indexer's queries
// and keys recomputed).
void v32_index_loss_backward(const Ctx&, const AttnIn&, const MlaSaved& s);

}  // namespace trex::model
