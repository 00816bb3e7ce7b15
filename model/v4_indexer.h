// DeepSeek-V4's CSA lightning indexer (HF DeepseekV4Indexer, no cache) and its KL loss, forward
// and backward side by side. Per CSA layer (N = B T tokens, nw = T / m entries per row):
//   ik  = rope(rmsnorm(pool(i_kv(x), i_gate(x), i_pb)))  [B nw, dI]  (its own compressor, 2 dI
//         channels, overlapping windows as the CSA compressor; compress RoPE table, entry w at w m)
//   iq  = rope(i_qb(qres))                                [N, nI, dI] (compress table, token t at t)
//   wts = i_w(x) nI^-0.5                                  [N, nI]
//   I[t, w] = dI^-0.5 sum_h wts[t, h] relu(iq[t, h] . ik[w])
// Selection: the index_topk entries of highest I among the valid ones, w < (t + 1) / m
// (kernels/indexer.h); the attention then keeps those of t's document.
//
// The KL loss (train.indexer_loss_weight > 0; docs/V4.md "Indexer loss"). Per query t over S_t,
// the compressed entries its attention attends (sparse stage: the selected entries of t's
// document; dense warm-up: every visible entry of t's document, v4_entry_visible):
//   p_t[w] = sum_h P_h[t, w] / sum_{w' in S_t} sum_h P_h[t, w']   the main attention's probabilities
//            summed over heads, restricted to S_t and L1-normalized there (the sliding keys and the
//            sink are not scored by the indexer and are left out), detached
//   q_t    = softmax over S_t of I[t, .]
//   loss   = (1 / N) sum_t KL(p_t || q_t)       (terms with p = 0 are 0; S_t empty adds 0)
//   recall = (1 / N) sum_t r_t, the main attention's mass on the visible compressed entries V_t
//            that the selection holds: dense warm-up, sum of p_t over the selection; sparse stage,
//            mean over heads of exp(lse_h(S_t) - lse_h(V_t)), the log-sum-exps of the attention
//            scores over those entries only; r_t = 1 when V_t is empty.
// dloss / dI[t, w] = (q_t[w] - p_t[w]) / N. x and qres are detached: the backward adds the
// gradients of ix_grad * loss into i_w, i_qb, i_kv, i_gate, i_pb and i_norm only (no activation
// gradient), the indexer's projections recomputed.
// Context parallel (V4AttnIn::cp; model/v4_context_parallel.h): every term is one query's, so each
// rank scores its local queries (at their sequence indices) against every compressed entry: the
// indexer's compressor runs on each rank's held rows (its local tokens' i_kv / i_gate and their
// halos), each entry pooled, normalized and roped by its owner and all-gathered, as the
// attention's. N in the means above is the whole micro-batch's B T, so the ranks' losses and
// recalls sum to one process's (Model::run_cp sums them). The backward returns the entries'
// gradients (this rank's queries' share) to their owners, whose pooling backward gives their held
// rows' gradients, returned in turn to the rows' owners; i_pb and i_norm get this rank's share,
// summed by the gradient sync.
#pragma once
#include <cstdint>
#include "model/v4_attn.h"

namespace trex::model {

// Whether compressed entry w of a CSA layer of rate m is visible to token t of row b: complete
// ((w + 1) m <= t + 1, w < nw) and, in a packed row, its window (starting at max(0, (w - 1) m))
// starts in t's document. seg: [B, T] or null.
inline bool v4_entry_visible(const int32_t* seg, int64_t T, int64_t b, int64_t t, int64_t w, int64_t m,
                             int64_t nw) {
  if (w >= nw || (w + 1) * m > t + 1) return false;
  const int64_t u = w > 0 ? (w - 1) * m : 0;
  return !seg || seg[b * T + u] == seg[b * T + t];
}

// The selection: -> cnt [N], sel [N, index_topk] (row-relative entries, ascending, -1 padded).
// x: [N, d], qres: [N, q_lora_rank]
void v4_index_select(const Ctx&, const V4AttnIn&, const float* x, const float* qres, int64_t nw, int32_t* cnt,
                     int32_t* sel);

// After the key lists (s.off / s.idx set): the pairs, each query's attended compressed entries
// -> s.ix_off, s.ix_ent, and s.ix_dI's room (kept for the backward; arena).
void v4_index_loss_pairs(const Ctx&, const V4AttnIn&, V4AttnSaved& s);
// After the attention (the pairs, s.KV, s.lse set; Q [N, H, hd] the queries it attended with):
// -> s.ix_dI, s.ix_loss, s.ix_recall. cnt / sel: v4_index_select's.
void v4_index_loss_forward(const Ctx&, const V4AttnIn&, V4AttnSaved& s, const float* Q, const int32_t* cnt,
                           const int32_t* sel);
// Gradients of in.ix_grad * loss: += into the indexer's tensors in in.G.
void v4_index_loss_backward(const Ctx&, const V4AttnIn&, const V4AttnSaved& s);

}  // namespace trex::model
