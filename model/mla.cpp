#include "model/mla.h"

#include <cstring>
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/attention.h"
#include "kernels/attention_cp.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "model/v32_indexer.h"

namespace trex::model {

namespace {

W wt(const AttnIn& in, int64_t off, int64_t ld = 0) { return {in.P + off, in.Pb ? in.Pb + off : nullptr, ld}; }

// This rank's heads [h0, h0 + Hl) of H under tensor parallelism (all of them when tp is off).
struct Heads {
  int64_t h0, Hl;
  int64_t s0, Hs;  // the stored tensors: their first head is head s0 (h0, or 0 when the model holds
                   // only this slice: TpSlice::held), and o_proj holds the columns of Hs heads
};

Heads local_heads(const AttnIn& in) {
  const int64_t H = in.cfg->num_attention_heads, S = in.tp.size;
  TREX_CHECK(S >= 1 && in.tp.rank >= 0 && in.tp.rank < S, "bad tensor-parallel slice ", in.tp.rank, " of ", S);
  TREX_CHECK(H % S == 0, "attention heads ", H, " are not a multiple of the tensor-parallel size ", S);
  const int64_t h0 = in.tp.rank * (H / S), Hl = H / S;
  return {h0, Hl, in.tp.held ? 0 : h0, in.tp.held ? Hl : H};
}

// The query projection rows of the local heads: q_b [H dqk, rq] (or q_proj [H dqk, d]).
W q_rows(const AttnIn& in, const Heads& hs, int64_t dqk, int64_t cols) {
  const LayerParams& p = *in.p;
  return wt(in, (in.cfg->q_lora_rank ? p.q_b : p.q) + hs.s0 * dqk * cols);
}

// The latent norms (q_a_layernorm, kv_a_layernorm) use eps 1e-6 whatever rms_norm_eps says,
// as in DeepSeek's and Hugging Face's code (RMSNorm(rank) with its default eps).
constexpr float kLatentNormEps = 1e-6f;

kern::RopeLayout layout(const RopeTable& r) {
  return r.interleaved ? kern::RopeLayout::Interleaved : kern::RopeLayout::HalfSplit;
}

}  // namespace

void mla_project(const Ctx& c, const AttnIn& in, const float* x, MlaSaved& s) {
  const ModelConfig& m = *in.cfg;
  const LayerParams& p = *in.p;
  const Heads hs = local_heads(in);
  const int64_t N = in.B * in.T, d = m.hidden_size, H = hs.Hl;  // H: the local heads
  const int64_t dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dqk = m.qk_head_dim(), dv = m.v_head_dim;
  const int64_t r = m.kv_lora_rank, rq = m.q_lora_rank;
  StackArena& A = *c.ws;
  s.x = x;

  // Queries: [N, H, dqk] (this rank's heads), computed below (under context parallelism while
  // the latent's all-gather is in flight).
  s.Q = A.alloc<float>(N * H * dqk);
  if (rq) {
    s.qa = A.alloc<float>(N * rq);
    s.qa_rstd = A.alloc<float>(N);
    s.qan = A.alloc<float>(N * rq);
  }

  // Latent and shared rope key (kva is a temporary split into the two saved parts).
  s.lat = A.alloc<float>(N * r);
  s.lat_rstd = A.alloc<float>(N);
  s.latn = A.alloc<float>(N * r);
  float* kpe = A.alloc<float>(N * (dr ? dr : 1));
  {
    auto mk = A.mark();
    float* kva = A.alloc<float>(N * (r + dr));
    linear_fwd(c, x, N, d, wt(in, p.kv_a), r + dr, kva);
    const int64_t f = sizeof(float);
    c.k().copy_rows(s.lat, r * f, kva, (r + dr) * f, r * f, N);
    if (dr) c.k().copy_rows(kpe, dr * f, kva + r, (r + dr) * f, dr * f, N);
    A.release(mk);
  }
  c.k().rmsnorm_fwd(s.lat, N, r, in.P + p.kv_a_norm, kLatentNormEps, s.latn, s.lat_rstd);
  if (dr) c.k().rope_apply(kpe, N, 1, dr, dr, (int)dr, in.pos, in.rope->cos, in.rope->sin, layout(*in.rope), false);

  // Context parallel: the keys are the whole rows' (NK tokens); their latents and rope keys are
  // all-gathered from the cp ranks ([latn | k_pe] per token, in sequence order), the query
  // projection running while the collective is in flight.
  const int64_t NK = in.cp ? in.B * in.cp->split.T : N;
  const float* latk = s.latn;  // [NK, r]
  const float* kpek = kpe;     // [NK, dr]
  const int64_t f = sizeof(float), w = r + dr;
  float* kpe_all = nullptr;
  CpGather gather;
  StackArena::Mark mkg{};
  if (in.cp) {
    s.latn_all = A.alloc<float>(NK * r);
    kpe_all = A.alloc<float>(NK * (dr ? dr : 1));
    mkg = A.mark();
    float* loc = A.alloc<float>(N * w);
    pack_cols(c, loc, w, N, {{s.latn, r}, {kpe, dr}});
    gather = cp_all_gather_start(*in.cp->cp, in.cp->split, in.B, loc, w, A);
  }

  // Queries, RoPE on the last dr dims of each head.
  if (rq) {
    linear_fwd(c, x, N, d, wt(in, p.q_a), rq, s.qa);
    c.k().rmsnorm_fwd(s.qa, N, rq, in.P + p.q_a_norm, kLatentNormEps, s.qan, s.qa_rstd);
    linear_fwd(c, s.qan, N, rq, q_rows(in, hs, dqk, rq), H * dqk, s.Q);
  } else {
    linear_fwd(c, x, N, d, q_rows(in, hs, dqk, d), H * dqk, s.Q);
  }
  if (dr)
    c.k().rope_apply(s.Q + dn, N, (int)H, H * dqk, dqk, (int)dr, in.pos, in.rope->cos, in.rope->sin, layout(*in.rope),
                     false);

  if (in.cp) {
    float* all = A.alloc<float>(NK * w);
    cp_all_gather_finish(*in.cp->cp, in.cp->split, gather, all);
    unpack_cols(c, all, w, NK, {{s.latn_all, r}, {kpe_all, dr}});
    A.release(mkg);
    latk = s.latn_all, kpek = kpe_all;
  }

  // Per-head keys and values from the latent.
  s.K = A.alloc<float>(NK * H * dqk);
  s.V = A.alloc<float>(NK * H * dv);
  {
    auto mk2 = A.mark();
    float* kv = A.alloc<float>(NK * H * (dn + dv));
    linear_fwd(c, latk, NK, r, wt(in, p.kv_b + hs.s0 * (dn + dv) * r), H * (dn + dv), kv);
    // K [NK, H, dn | dr] = the head's nope part | the shared rope key; V [NK, H, dv].
    c.k().copy_rows(s.K, dqk * f, kv, (dn + dv) * f, dn * f, NK * H);
    c.k().copy_rows(s.V, dv * f, kv + dn, (dn + dv) * f, dv * f, NK * H);
    if (dr)
      for (int64_t h = 0; h < H; ++h) c.k().copy_rows(s.K + h * dqk + dn, H * dqk * f, kpek, dr * f, dr * f, NK);
    A.release(mk2);
  }
}

namespace {

kern::AttnCpShape cp_shape(const Ctx& c, const AttnIn& in, int64_t H, int64_t dqk, int64_t dv) {
  return {(int)in.B, (int)in.T, (int)in.cp->split.T, (int)H, (int)dqk, (int)dv, in.rope->softmax_scale, c.prec};
}

}  // namespace

void mla_forward(const Ctx& c, const AttnIn& in, const float* x, float* out, MlaSaved& s) {
  const ModelConfig& m = *in.cfg;
  const LayerParams& p = *in.p;
  const Heads hs = local_heads(in);
  const int64_t N = in.B * in.T, d = m.hidden_size, H = hs.Hl;
  const int64_t dqk = m.qk_head_dim(), dv = m.v_head_dim;
  StackArena& A = *c.ws;
  mla_project(c, in, x, s);
  if (m.is_v32()) {  // DeepSeek-V3.2: attention over the indexer's top-k tokens
    v32_attn_forward(c, in, s);
  } else if (in.cp) {  // context parallel: the local queries against the whole rows' keys
    s.O = A.alloc<float>(N * H * dv);
    s.lse = A.alloc<float>(N * H);
    ProfScope ps(c.prof, "fwd.mla.attn_core");
    kern::attention_cp_fwd(cp_shape(c, in, H, dqk, dv), s.Q, s.K, s.V, in.cp->qidx, in.cp->seg_full, s.O, s.lse);
  } else {
    s.O = A.alloc<float>(N * H * dv);
    s.lse = A.alloc<float>(N * H);
    kern::AttnShape sh{(int)in.B, (int)in.T, (int)H, (int)dqk, (int)dv, in.rope->softmax_scale, 0, c.prec};
    ProfScope ps(c.prof, "fwd.mla.attn_core");
    c.k().attention_fwd(sh, s.Q, s.K, s.V, s.O, s.lse, in.seg);
  }
  // o_proj [d, H dv]: the columns of the local heads (row-parallel; out is a partial sum), at row
  // stride Hs dv (the whole tensor's, or the held slice's).
  linear_fwd(c, s.O, N, H * dv, wt(in, p.o + hs.s0 * dv, hs.Hs * dv), d, out);
}

void mla_backward(const Ctx& c, const AttnIn& in, const MlaSaved& s, const float* dout, float* dx) {
  const ModelConfig& m = *in.cfg;
  const LayerParams& p = *in.p;
  const Heads hs = local_heads(in);
  const int64_t N = in.B * in.T, d = m.hidden_size, H = hs.Hl;  // H: local heads
  const int64_t dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dqk = m.qk_head_dim(), dv = m.v_head_dim;
  const int64_t r = m.kv_lora_rank, rq = m.q_lora_rank;
  StackArena& A = *c.ws;
  float* G = in.G;
  auto mk = A.mark();

  // Output projection.
  float* dO = A.alloc<float>(N * H * dv);
  linear_bwd(c, dout, s.O, N, H * dv, wt(in, p.o + hs.s0 * dv, hs.Hs * dv), d, dO, false, G + p.o + hs.s0 * dv);

  // Attention core (context parallel: dK, dV of the whole rows' NK keys).
  const int64_t NK = in.cp ? in.B * in.cp->split.T : N;
  float* dQ = A.alloc<float>(N * H * dqk);
  float* dK = A.alloc<float>(NK * H * dqk);
  float* dV = A.alloc<float>(NK * H * dv);
  if (m.is_v32()) {
    v32_attn_backward(c, in, s, dO, dQ, dK, dV);
  } else if (in.cp) {
    ProfScope ps(c.prof, "bwd.mla.attn_core");
    kern::attention_cp_bwd(cp_shape(c, in, H, dqk, dv), s.Q, s.K, s.V, in.cp->qidx, in.cp->seg_full, s.O, s.lse, dO, dQ,
                           dK, dV);
  } else {
    kern::AttnShape sh{(int)in.B, (int)in.T, (int)H, (int)dqk, (int)dv, in.rope->softmax_scale, 0, c.prec};
    ProfScope ps(c.prof, "bwd.mla.attn_core");
    c.k().attention_bwd(sh, s.Q, s.K, s.V, s.O, s.lse, dO, dQ, dK, dV, in.seg);
  }

  // Back into the latent: dkv [NK, H, dn+dv], dk_pe [NK, dr] summed over heads.
  float* dkv = A.alloc<float>(NK * H * (dn + dv));
  float* dkva = A.alloc<float>(N * (r + dr));
  const int64_t f = sizeof(float);
  c.k().copy_rows(dkv, (dn + dv) * f, dK, dqk * f, dn * f, NK * H);
  c.k().copy_rows(dkv + dn, (dn + dv) * f, dV, dv * f, dv * f, NK * H);
  float* dlatn = A.alloc<float>(N * r);
  const int64_t kvb = p.kv_b + hs.s0 * (dn + dv) * r;  // kv_b rows of the local heads
  if (in.cp) {
    // Every key's [dlatn | dk_pe] from this rank's queries, summed over the cp ranks into the
    // owners' rows (the adjoint of the forward's all-gather).
    const int64_t w = r + dr;
    float* dall = A.alloc<float>(NK * w);
    float* dlatn_all = A.alloc<float>(NK * r);
    if (dr) c.k().sum_heads(dK + dn, NK, H, H * dqk, dqk, dr, dall + r, w);
    linear_bwd(c, dkv, s.latn_all, NK, r, wt(in, kvb), H * (dn + dv), dlatn_all, false, G + kvb);
    c.k().copy_rows(dall, w * f, dlatn_all, r * f, r * f, NK);
    cp_reduce_scatter(*in.cp->cp, in.cp->split, in.B, dall, dkva, w, A);
    c.k().copy_rows(dlatn, r * f, dkva, w * f, r * f, N);
  } else {
    if (dr) c.k().sum_heads(dK + dn, N, H, H * dqk, dqk, dr, dkva + r, r + dr);
    linear_bwd(c, dkv, s.latn, N, r, wt(in, kvb), H * (dn + dv), dlatn, false, G + kvb);
  }
  if (dr)
    c.k().rope_apply(dkva + r, N, 1, r + dr, dr, (int)dr, in.pos, in.rope->cos, in.rope->sin, layout(*in.rope), true);
  float* dlat = A.alloc<float>(N * r);
  c.k().rmsnorm_bwd(dlatn, s.lat, N, r, in.P + p.kv_a_norm, s.lat_rstd, dlat, G + p.kv_a_norm);
  c.k().copy_rows(dkva, (r + dr) * f, dlat, r * f, r * f, N);
  linear_bwd(c, dkva, s.x, N, d, wt(in, p.kv_a), r + dr, dx, false, G + p.kv_a);

  // Queries: undo RoPE on the gradient (the rotation's adjoint is the inverse rotation).
  if (dr)
    c.k().rope_apply(dQ + dn, N, (int)H, H * dqk, dqk, (int)dr, in.pos, in.rope->cos, in.rope->sin, layout(*in.rope),
                     true);
  if (rq) {
    float* dqan = A.alloc<float>(N * rq);
    linear_bwd(c, dQ, s.qan, N, rq, q_rows(in, hs, dqk, rq), H * dqk, dqan, false, G + p.q_b + hs.s0 * dqk * rq);
    float* dqa = A.alloc<float>(N * rq);
    c.k().rmsnorm_bwd(dqan, s.qa, N, rq, in.P + p.q_a_norm, s.qa_rstd, dqa, G + p.q_a_norm);
    linear_bwd(c, dqa, s.x, N, d, wt(in, p.q_a), rq, dx, true, G + p.q_a);
  } else {
    linear_bwd(c, dQ, s.x, N, d, q_rows(in, hs, dqk, d), H * dqk, dx, true, G + p.q + hs.s0 * dqk * d);
  }
  A.release(mk);
}

}  // namespace trex::model
