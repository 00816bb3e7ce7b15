#include "model/v32_indexer.h"

#include <algorithm>
#include <cmath>
#include "core/error.h"
#include "kernels/layernorm.h"
#include "kernels/sparse_attn.h"
#include "model/v32_indexer_loss.h"

namespace trex::model {

namespace {

// The indexer's projections read f32 weights in bf16 runs too (no bf16 shadow), as the router
// does: a discrete top-k over scores whose gaps are far below bf16's rounding would otherwise
// pick other tokens than the f32 model (measured on the parity cases: bf16-rounded projections
// moved the loss by 0.04-0.08 within three steps).
W wt(const AttnIn& in, int64_t off) { return {in.P + off, nullptr, 0}; }

// LayerNorm eps of the indexer's k_norm (nn.LayerNorm(index_head_dim, eps=1e-6) in transformers).
constexpr float kIndexNormEps = 1e-6f;

}  // namespace

void v32_index_keys(const Ctx& c, const AttnIn& in, const float* x, int64_t N, const int32_t* pos, float* ik) {
  const ModelConfig& m = *in.cfg;
  const LayerParams& p = *in.p;
  const int64_t dI = m.v32.index_head_dim, dr = m.qk_rope_head_dim;
  linear_fwd(c, x, N, m.hidden_size, wt(in, p.ix_wk), dI, ik);
  kern::layernorm_fwd(ik, N, dI, in.P + p.ix_knorm_w, in.P + p.ix_knorm_b, kIndexNormEps, ik);
  if (dr)
    c.k().rope_apply(ik, N, 1, dI, dI, (int)dr, pos, in.rope->cos, in.rope->sin, kern::RopeLayout::HalfSplit, false);
}

void v32_index_queries(const Ctx& c, const AttnIn& in, const float* x, const float* qan, int64_t N,
                       const int32_t* pos, float* iq, float* wts) {
  const ModelConfig& m = *in.cfg;
  const LayerParams& p = *in.p;
  const int64_t nI = m.v32.index_n_heads, dI = m.v32.index_head_dim, dr = m.qk_rope_head_dim;
  linear_fwd(c, qan, N, m.q_lora_rank, wt(in, p.ix_wq_b), nI * dI, iq);
  if (dr)
    c.k().rope_apply(iq, N, (int)nI, nI * dI, dI, (int)dr, pos, in.rope->cos, in.rope->sin,
                     kern::RopeLayout::HalfSplit, false);
  linear_fwd(c, x, N, m.hidden_size, wt(in, p.ix_w), nI, wts);
}

kern::IndexerShape v32_index_shape(const ModelConfig& m, int64_t T, int64_t nw) {
  const int64_t nI = m.v32.index_n_heads, dI = m.v32.index_head_dim;
  // transformers: weights * nI^-0.5 and scores * dI^-0.5; both are positive factors of every score.
  const float scale = (float)(std::pow((double)dI, -0.5) * std::pow((double)nI, -0.5));
  return {1, T, nw, (int)nI, (int)dI, 1, (int)std::min<int64_t>(m.v32.index_topk, std::max<int64_t>(nw, 1)), scale};
}

void v32_index_keys_all(const Ctx& c, const AttnIn& in, const float* x, float* ik) {
  const int64_t N = in.B * in.T, dI = in.cfg->v32.index_head_dim;
  if (!in.cp) return v32_index_keys(c, in, x, N, in.pos, ik);
  StackArena& A = *c.ws;
  const auto mk = A.mark();
  float* loc = A.alloc<float>(N * dI);
  v32_index_keys(c, in, x, N, in.pos, loc);
  cp_all_gather(*in.cp->cp, in.cp->split, in.B, loc, ik, dI, A);
  A.release(mk);
}

void v32_attn_forward(const Ctx& c, const AttnIn& in, MlaSaved& s) {
  const ModelConfig& m = *in.cfg;
  TREX_CHECK(c.host_memory(), "DeepSeek-V3.2 attention runs on host memory only");
  TREX_CHECK(m.q_lora_rank > 0 && s.qan, "DeepSeek-V3.2 attention needs the q LoRA latent");
  const int64_t B = in.B, T = in.T, N = B * T, H = m.num_attention_heads / in.tp.size;
  const int64_t TK = v32_key_len(in), NK = B * TK;  // keys: the whole rows' under context parallel
  const int64_t nI = m.v32.index_n_heads, dI = m.v32.index_head_dim;
  const int64_t dqk = m.qk_head_dim(), dv = m.v_head_dim, D = dqk + dv;
  StackArena& A = *c.ws;

  // Selection: per document (a run of equal seg ids, the whole row without seg), the indexer's
  // top-k among its tokens up to the query. sel holds document-relative indices.
  const kern::IndexerShape row = v32_index_shape(m, TK, TK);
  const int64_t kt = row.topk;
  int32_t* cnt = A.alloc<int32_t>(N);
  int32_t* sel = A.alloc<int32_t>(N * kt);
  int32_t* start = A.alloc<int32_t>(N);  // first token (flat key index) of each query's document
  int32_t* self = A.alloc<int32_t>(N);   // the query's own token (flat key index)
  {
    auto mk = A.mark();
    float* iq = A.alloc<float>(N * nI * dI);
    float* wts = A.alloc<float>(N * nI);
    float* ik = A.alloc<float>(NK * dI);
    v32_index_queries(c, in, s.x, s.qan, N, in.pos, iq, wts);
    v32_index_keys_all(c, in, s.x, ik);
    int32_t* iota = A.alloc<int32_t>(TK);  // positions inside a document: key s is valid iff s <= t
    for (int64_t t = 0; t < TK; ++t) iota[t] = (int32_t)t;
    const int32_t* qidx = in.cp ? in.cp->qidx : iota;     // [T] sequence index of each local position
    const int32_t* seg = in.cp ? in.cp->seg_full : in.seg;  // [B, TK] document ids, or null
    float* work = A.alloc<float>(std::max<size_t>(kern::indexer_workspace_floats(row), 1));
    ProfScope ps(c.prof, "fwd.mla.indexer_topk");
    for (int64_t b = 0; b < B; ++b) {
      const int32_t* sg = seg ? seg + b * TK : nullptr;
      // Runs of local positions at consecutive sequence indices inside one document (without
      // context parallel: the documents), each ranking the keys [s0, its last query].
      for (int64_t j0 = 0; j0 < T;) {
        const int64_t q0 = qidx[j0];
        int64_t j1 = j0 + 1;
        while (j1 < T && qidx[j1] == qidx[j1 - 1] + 1 && (!sg || sg[qidx[j1]] == sg[q0])) ++j1;
        int64_t s0 = 0;  // the document's first token
        if (sg)
          for (s0 = q0; s0 > 0 && sg[s0 - 1] == sg[q0];) --s0;
        const int64_t i0 = b * T + j0, n = j1 - j0;
        kern::IndexerShape sh = v32_index_shape(m, n, qidx[j1 - 1] - s0 + 1);
        sh.topk = (int)kt;  // the row's sel stride (a query selects at most its document's keys before it)
        sh.prec = c.prec;   // a bf16 run scores on the bf16 dot product where the attention core does
        kern::indexer_topk(sh, iq + i0 * nI * dI, ik + (b * TK + s0) * dI, wts + i0 * nI, iota + (q0 - s0), cnt + i0,
                           sel + i0 * kt, nullptr, work);
        for (int64_t j = j0; j < j1; ++j)
          start[b * T + j] = (int32_t)(b * TK + s0), self[b * T + j] = (int32_t)(b * TK + qidx[j]);
        j0 = j1;
      }
    }
    A.release(mk);
  }
  // Key lists of the N H (token, head) queries over the NK H key rows (row j H + h: key token j,
  // head h): the selection, or in the dense warm-up every token of the document up to the query.
  auto nkeys = [&](int64_t i) -> int64_t { return in.ix_dense ? self[i] - start[i] + 1 : cnt[i]; };
  auto key = [&](int64_t i, int64_t k) -> int64_t { return start[i] + (in.ix_dense ? k : sel[i * kt + k]); };
  s.off = A.alloc<int64_t>(N * H + 1);
  s.off[0] = 0;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t h = 0; h < H; ++h) s.off[i * H + h + 1] = s.off[i * H + h] + nkeys(i);
  s.idx = A.alloc<int32_t>(std::max<int64_t>(s.off[N * H], 1));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t h = 0; h < H; ++h) {
      int32_t* o = s.idx + s.off[i * H + h];
      for (int64_t k = 0; k < nkeys(i); ++k) o[k] = (int32_t)(key(i, k) * H + h);
    }

  // Padded rows: queries [Q | 0], keys [K | V]; the output's last dv columns are O.
  const int64_t f = sizeof(float), R = N * H, RK = NK * H;
  s.Qp = A.alloc<float>(R * D);
  s.KVp = A.alloc<float>(RK * D);
  s.Op = A.alloc<float>(R * D);
  s.lse = A.alloc<float>(R);
  s.O = A.alloc<float>(R * dv);
  c.k().zero(s.Qp, R * D * f);
  c.k().copy_rows(s.Qp, D * f, s.Q, dqk * f, dqk * f, R);
  c.k().copy_rows(s.KVp, D * f, s.K, dqk * f, dqk * f, RK);
  c.k().copy_rows(s.KVp + dqk, D * f, s.V, dv * f, dv * f, RK);
  kern::SparseAttnShape sh{R, 1, (int)D, in.rope->softmax_scale, c.prec};
  {
    ProfScope ps(c.prof, "fwd.mla.attn_core");
    kern::sparse_attn_fwd(sh, s.Qp, s.KVp, RK, s.off, s.idx, nullptr, s.Op, s.lse);
  }
  c.k().copy_rows(s.O, dv * f, s.Op + dqk, D * f, dv * f, R);
  if (in.ix_loss) {
    ProfScope ps(c.prof, "fwd.mla.indexer_loss");
    v32_index_loss_forward(c, in, s, {cnt, sel, kt, start, self});
  }
}

void v32_attn_backward(const Ctx& c, const AttnIn& in, const MlaSaved& s, const float* dO, float* dQ, float* dK,
                       float* dV) {
  const ModelConfig& m = *in.cfg;
  const int64_t N = in.B * in.T, NK = in.B * v32_key_len(in), H = m.num_attention_heads / in.tp.size;
  const int64_t dqk = m.qk_head_dim(), dv = m.v_head_dim, D = dqk + dv;
  const int64_t f = sizeof(float), R = N * H, RK = NK * H;
  StackArena& A = *c.ws;
  auto mk = A.mark();
  float* dOp = A.alloc<float>(R * D);
  float* dQp = A.alloc<float>(R * D);
  float* dKVp = A.alloc<float>(RK * D);
  c.k().zero(dOp, R * D * f);
  c.k().zero(dKVp, RK * D * f);
  c.k().copy_rows(dOp + dqk, D * f, dO, dv * f, dv * f, R);
  kern::SparseAttnShape sh{R, 1, (int)D, in.rope->softmax_scale, c.prec};
  {
    ProfScope ps(c.prof, "bwd.mla.attn_core");
    float* work = A.alloc<float>(std::max<size_t>(kern::sparse_attn_bwd_workspace_floats(sh, RK), 1));
    kern::sparse_attn_bwd(sh, s.Qp, s.KVp, RK, s.off, s.idx, nullptr, s.Op, s.lse, dOp, dQp, dKVp, nullptr, work);
  }
  c.k().copy_rows(dQ, dqk * f, dQp, D * f, dqk * f, R);
  c.k().copy_rows(dK, dqk * f, dKVp, D * f, dqk * f, RK);
  c.k().copy_rows(dV, dv * f, dKVp + dqk, D * f, dv * f, RK);
  A.release(mk);
  if (in.ix_loss && in.ix_grad != 0.f) {
    ProfScope ps(c.prof, "bwd.mla.indexer_loss");
    v32_index_loss_backward(c, in, s);
  }
}

}  // namespace trex::model
