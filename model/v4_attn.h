// DeepSeek-V4 attention block (HF DeepseekV4Attention without a cache), forward and backward:
//   q_res = rmsnorm(q_a(x))                                   [N, qr]   (weighted, eps rms_norm_eps)
//   Q     = rope(rmsnorm_unweighted_per_head(q_b(q_res)))     [N, H, hd]
//   KV    = rope(rmsnorm(kv(x)))                              [N, hd]   one head, used as K and V
//   C     = rope(rmsnorm(pool(ckv(x), cgate(x), position_bias)))  [B, nw, hd] compressed entries
//           (CSA: overlapping windows of 2m; HCA: windows of m), entry w at position w*m
//   keys of query t: KV rows t-W+1..t (sliding_window W) + compressed entries
//           (HCA: every w < (t+1)/m; CSA: the indexer's top index_topk of those)
//   O     = softmax([scale q.k ..., sink_h]) without the sink column, times the keys   [N, H, hd]
//   out   = o_b(grouped o_a(inverse_rope(O)))                 [N, d]
// RoPE: interleaved pairs on the last qk_rope_head_dim dims of each head; sliding layers use the
// "main" table, compressed layers (and the indexer) the "compress" table. The indexer's selection
// carries no gradient, so the indexer's own weights get none (as in the reference), unless the
// indexer trains from its own KL loss (ix_loss; model/v4_indexer.h). The dense warm-up (ix_dense)
// attends every visible compressed entry of a CSA layer instead of the indexer's top-k.
// Positions: the row index t of each token (HF's default position_ids). Packed rows (seg ids)
// mask keys of other documents, and compressed entries whose window starts before the query's
// document; RoPE is relative, so a document's sliding keys see the same q.k as when alone.
// Parameter gradients accumulate into the gradient slab; dx is overwritten.
#pragma once
#include <cstdint>
#include "model/config.h"
#include "model/context_parallel.h"
#include "model/linear.h"
#include "model/params.h"

namespace trex::model {

struct V4AttnIn {
  const ModelConfig* cfg;
  const V4LayerParams* p;
  int64_t layer;
  const float* P;      // parameter slab
  const bf16* Pb;      // bf16 shadow or null
  float* G;            // gradient slab (null: no backward)
  const float *cos, *sin;    // this layer's RoPE table [T, rd/2] (main or compress)
  const float *ccos, *csin;  // compress table [T, rd/2] (compressed entries, indexer)
  const int32_t* seg;  // [B, T] document ids or null
  int64_t B, T;
  // Tensor parallel: this rank computes heads [rank * H / size, (rank + 1) * H / size) and output
  // groups [rank * G / size, ...) (q_b rows, sinks, o_a rows, o_b columns); H and o_groups must be
  // multiples of size. The single KV head, the compressor and the indexer run in full on every
  // rank. `out` and `dx` are this rank's partial sums; the gradients of the unsliced weights
  // inside the block (q_a, q_a_norm, kv, kv_norm, the compressor) are partial sums too. The saved
  // per-head buffers (qb, q_rstd, Q, O, lse, Or) then hold the local H / size heads, and Y the
  // local G / size groups: [N, (G / size) olr].
  TpSlice tp{};
  // The CSA indexer's KL loss (model/v4_indexer.h): computed in the forward with ix_loss; the
  // backward adds ix_grad times its gradient into the indexer's tensors. ix_dense: the dense
  // warm-up (CSA attends every visible compressed entry).
  bool ix_loss = false, ix_dense = false;
  float ix_grad = 0.f;
  // Context parallel (model/v4_context_parallel.h): B rows of T = 2c local tokens (x, out, the
  // queries), the keys those of the whole rows of cp->split.T tokens, seg then the whole rows'
  // documents [B, cp->split.T]. The saved key side holds this rank's held rows (kvp, kv_rstd, the
  // sliding rows of KV, ckv, cgate: the local tokens and their halos) and its own compressed
  // entries (cpool, c_rstd); KV's entries are every rank's, gathered. With tp, cp is the cp group
  // of this tp rank: the key side runs in full on every tp rank, each exchanging it over its own
  // cp group, and the key-side gradients it returns to the owners are this rank's heads' share
  // (partial over tp, as without cp). With ix_loss, the indexer scores every compressed entry the
  // same way and the loss and recall are this rank's queries' share of the micro-batch's
  // (model/v4_indexer.h). null: off.
  const CpAttn* cp = nullptr;
  // Selective recompute of "mla_up_proj" (TrainOptions::recomputes): q_b's output qb is not kept;
  // the backward computes it again from q_res (one GEMM).
  bool drop_qb = false;
};

struct V4AttnSaved {
  const float* x = nullptr;                   // [N, d]
  float *qa = nullptr, *qa_rstd = nullptr, *qres = nullptr;  // [N, qr] x2, [N]
  // qb [N, H*hd] before the per-head norm (null with drop_qb), its rstd [N*H]. The queries Q and
  // the unrotated output Or ([N, H*hd] each) are not kept: the backward rebuilds them from qb and
  // O (one elementwise pass each).
  float *qb = nullptr, *q_rstd = nullptr;
  // NK = N key rows (context parallel: B np, this rank's held rows; model/v4_context_parallel.h).
  int64_t NK = 0;
  float *kvp = nullptr, *kv_rstd = nullptr;   // [NK, hd], [NK]
  int64_t nw = 0, M = 0;                      // compressed entries per row, KV rows (NK + B*nw)
  float* KV = nullptr;                        // [M, hd] sliding rows, then compressed entries
  float *ckv = nullptr, *cgate = nullptr;     // [NK, c*hd]
  // The pooled entries before their norm and its rstd: [B*nw, hd], [B*nw] (context parallel: this
  // rank's own, [B, 2, emax, hd], [B, 2, emax]).
  float *cpool = nullptr, *c_rstd = nullptr;
  int64_t* off = nullptr;                     // [N+1] key lists
  int32_t* idx = nullptr;
  float *O = nullptr, *lse = nullptr;         // [N, H, hd] attention output, [N, H]
  float* Y = nullptr;                         // [N, G*olr] grouped o_a output
  // CSA with V4AttnIn::ix_loss (model/v4_indexer.h): per query its attended compressed entries
  // ix_ent[ix_off[i] .. ix_off[i+1]) (B nw-flat, ascending) and q - p there; the loss and recall.
  int64_t* ix_off = nullptr;
  int32_t* ix_ent = nullptr;
  float* ix_dI = nullptr;
  double ix_loss = 0, ix_recall = 0;
};

// x: [N, d] -> out: [N, d]
void v4_attn_forward(const Ctx&, const V4AttnIn&, const float* x, float* out, V4AttnSaved& s);
// dout: [N, d] -> dx: [N, d] (overwrite); parameter grads += into in.G
void v4_attn_backward(const Ctx&, const V4AttnIn&, const V4AttnSaved& s, const float* dout, float* dx);

}  // namespace trex::model
