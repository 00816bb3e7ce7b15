// DeepSeek-V3.2 sparse attention (DSA; transformers' DeepseekV32Indexer + the masked eager
// attention of DeepseekV32Attention), forward and backward. MLA (model/mla.cpp) computes Q, K, V
// as for V3; then per query the lightning indexer picks index_topk tokens and the attention sees
// only those:
//   iq    = rope_half(wq_b(qan))                      [N, nI, dI]  (qan: MLA's q_a_layernorm output)
//   ik    = rope_half(LayerNorm(wk(x)))                [N, dI]      (LayerNorm eps 1e-6, with bias)
//   w     = weights_proj(x) * nI^-0.5                  [N, nI]
//   score[t, s] = sum_h w[t, h] * relu(iq[t, h] . ik[s]) * dI^-0.5,  over the keys s <= t of t's document
//   keys(t) = the top min(index_topk, count) of them (all of them when there are no more)
//   O     = softmax over keys(t) of scale * Q[t] . K[s], times V[s]   (MLA's per-head K, V)
// rope_half: RoPE on the first qk_rope_head_dim dims of each head in the half-split (rotate_half)
// layout with MLA's tables (YaRN attention factor included, as transformers' cos / sin).
// Gradients: the selection carries none (transformers runs the indexer under torch.no_grad), so
// the indexer's weights get none (their layout entries are frozen); Q, K, V get the attention's.
// With AttnIn::ix_loss (train.indexer_loss_weight > 0) the indexer learns from its own KL loss
// against the attention (model/v32_indexer_loss.h); AttnIn::ix_dense (the dense warm-up) makes
// the attention see every causal key of the document instead of the selection.
// Packed rows (seg): a document is a run of equal seg ids; the indexer ranks only its own tokens.
// Context parallel (AttnIn::cp): the queries are this rank's tokens, the keys the whole rows'
// (MLA's K, V of every token, and the indexer keys all-gathered over the cp group); each query
// ranks the keys of its document up to its own sequence index (CpAttn::qidx), so it selects what
// it selects in one process, and the backward's dK, dV cover every key (mla.cpp reduce-scatters
// them through the latent).
// The masked attention runs on kern::sparse_attn (one shared key row set): each (token, head)
// is a query of one head over key rows [K | V] of width dqk + dv, its own row [Q | 0], so the
// scores are exactly q.k and the output's last dv columns are the attention output.
#pragma once
#include <cstdint>
#include "kernels/indexer.h"
#include "model/mla.h"

namespace trex::model {

// Indexer keys of N tokens: x [N, d] at positions pos [N] -> ik [N, dI].
void v32_index_keys(const Ctx&, const AttnIn&, const float* x, int64_t N, const int32_t* pos, float* ik);
// The indexer keys of every key token of the layer's rows: x [B T, d] (in.B x in.T local tokens)
// -> ik [B TK, dI], TK = v32_key_len(in) (context parallel: every cp rank's keys all-gathered, in
// sequence order; else x's own). Collective over the cp group when in.cp is set.
void v32_index_keys_all(const Ctx&, const AttnIn&, const float* x, float* ik);
// Keys per row: the whole sequence's length under context parallel, else in.T.
inline int64_t v32_key_len(const AttnIn& in) { return in.cp ? in.cp->split.T : in.T; }
// Indexer queries and head weights: qan [N, rq], x [N, d] -> iq [N, nI, dI], wts [N, nI] (not
// scaled: v32_index_shape folds nI^-0.5 into the score scale; a positive factor on every score).
void v32_index_queries(const Ctx&, const AttnIn&, const float* x, const float* qan, int64_t N, const int32_t* pos,
                       float* iq, float* wts);
// kern::indexer_topk's shape for one row of T queries over nw keys (compress rate 1: key s is
// valid for the query at position p iff s <= p), index_topk capped at nw.
kern::IndexerShape v32_index_shape(const ModelConfig&, int64_t T, int64_t nw);

// After mla_project: selection, then the attention over it -> s.O [N, H, dv], s.lse and the key
// lists (s.off, s.idx) and padded rows (s.Qp, s.KVp, s.Op) backward reads.
void v32_attn_forward(const Ctx&, const AttnIn&, MlaSaved& s);
// dO [N, H, dv] -> dQ [N, H, dqk], dK [NK, H, dqk], dV [NK, H, dv] (all overwritten; NK = B
// v32_key_len(in): context parallel, this rank's queries' share of every key's gradient).
void v32_attn_backward(const Ctx&, const AttnIn&, const MlaSaved& s, const float* dO, float* dQ, float* dK, float* dV);

}  // namespace trex::model
