#include "model/v4_attn.h"

#include <cmath>
#include <cstring>
#include <vector>
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/compress_pool.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sparse_attn.h"
#include "model/v4_context_parallel.h"
#include "model/v4_indexer.h"

namespace trex::model {

namespace {

W wt(const V4AttnIn& in, int64_t off, int64_t ld = 0) { return {in.P + off, in.Pb ? in.Pb + off : nullptr, ld}; }
float* gr(const V4AttnIn& in, int64_t off) { return in.G ? in.G + off : nullptr; }

// This rank's slice under tensor parallelism: heads [h0, h0 + Hl) and output groups [g0, g0 + Gl)
// (everything when tp is off). The groups of o_a read H hd / G inputs each, so the local groups
// read exactly the local heads.
struct Slice {
  int64_t h0, Hl, g0, Gl;
  // The stored tensors: their first head / group (h0, g0; 0 when the model holds only this slice:
  // TpSlice::held), and the groups whose columns o_b holds.
  int64_t sh0, sg0, Gs;
};

Slice local_slice(const V4AttnIn& in) {
  const int64_t H = in.cfg->num_attention_heads, G = in.cfg->v4.o_groups, S = in.tp.size;
  TREX_CHECK(S >= 1 && in.tp.rank >= 0 && in.tp.rank < S, "bad tensor-parallel slice ", in.tp.rank, " of ", S);
  TREX_CHECK(H % S == 0, "attention heads ", H, " are not a multiple of the tensor-parallel size ", S);
  TREX_CHECK(G % S == 0, "o_groups ", G, " is not a multiple of the tensor-parallel size ", S);
  const int64_t h0 = in.tp.rank * (H / S), g0 = in.tp.rank * (G / S);
  return {h0, H / S, g0, G / S, in.tp.held ? 0 : h0, in.tp.held ? 0 : g0, in.tp.held ? G / S : G};
}

// RoPE on the last rd dims of each of H heads of hd: x [N, H, hd].
void rope_heads(const Ctx& c, float* x, int64_t N, int H, int64_t hd, int64_t rd, const int32_t* pos,
                const float* cos, const float* sin, bool inverse) {
  c.k().rope_apply(x + (hd - rd), N, H, H * hd, hd, (int)rd, pos, cos, sin, kern::RopeLayout::Interleaved, inverse);
}

// n ones (the unweighted RMSNorm's weight) in backend memory.
float* ones(const Ctx& c, int64_t n) {
  float* o = c.host_ws().alloc<float>(n);
  for (int64_t i = 0; i < n; ++i) o[i] = 1.f;
  return c.device(o, n);
}

// Positions: token i of its row at i % T [B T]; with m > 0, entry e of its row at (e % nw) m
// [max(B nw, 1)] instead. Backend memory (computed on the host).
int32_t* positions(const Ctx& c, int64_t n, int64_t T, int64_t nw, int64_t m) {
  int32_t* p = c.host_ws().alloc<int32_t>(n);
  for (int64_t i = 0; i < n; ++i) p[i] = (int32_t)(m ? (nw ? (i % nw) * m : 0) : i % T);
  return c.device(p, n);
}

// Positions of the queries: token i of its row at i % T, or (context parallel) at its sequence
// index. Backend memory.
const int32_t* query_positions(const Ctx& c, const V4AttnIn& in) {
  const int64_t N = in.B * in.T;
  if (!in.cp) return positions(c, N, in.T, 0, 0);
  return c.device(v4_cp_query_positions(*in.cp, in.B, c.host_ws()), N);
}

// Context parallel: the held key rows of this rank for the layer (model/v4_context_parallel.h).
V4CpKeys cp_keys(const V4AttnIn& in) {
  const V4Config& v = in.cfg->v4;
  const AttnKind kind = v.attn[in.layer];
  return v4_cp_keys(in.cp->split, v.sliding_window, v.rate(in.layer),
                    kind == AttnKind::CSA ? 2 : kind == AttnKind::HCA ? 1 : 0);
}

// The sequence index of each held key row [B np], backend memory.
const int32_t* held_positions(const Ctx& c, const V4CpKeys& k, int64_t B) {
  int32_t* p = c.host_ws().alloc<int32_t>(std::max<int64_t>(B * k.np, 1));
  for (int64_t i = 0; i < B * k.np; ++i) p[i] = k.pos[i % k.np];
  return c.device(p, std::max<int64_t>(B * k.np, 1));
}

// Context parallel: the local tokens' kv(x) [N, hd] and, with a compressor of cc channels,
// c_kv(x), c_gate(x) [N, cc hd], packed, exchanged in one halo exchange into this rank's held rows
// kvp [NK, hd], ckv, cgate [NK, cc hd] (NK = B np; ckv null: a sliding layer). between() runs while
// the rows travel; what it keeps must be allocated before the call.
template <class Between>
void v4_cp_gather_keys(const Ctx& c, const V4AttnIn& in, const V4CpKeys& k, const float* x, float* kvp, float* ckv,
                       float* cgate, Between&& between) {
  const V4LayerParams& p = *in.p;
  const int64_t N = in.B * in.T, NK = in.B * k.np, d = in.cfg->hidden_size, hd = in.cfg->v4.head_dim;
  const int64_t cw = ckv ? (in.cfg->v4.attn[in.layer] == AttnKind::CSA ? 2 : 1) * hd : 0, w = hd + 2 * cw;
  const int64_t f = sizeof(float);
  StackArena& A = *c.ws;
  auto mk = A.mark();
  float* loc = A.alloc<float>(N * w);  // [N, hd | cw | cw]
  float* all = A.alloc<float>(NK * w);
  {
    auto mt = A.mark();
    float* t = A.alloc<float>(N * std::max(hd, cw));
    linear_fwd(c, x, N, d, wt(in, p.kv), hd, t);
    c.k().copy_rows(loc, w * f, t, hd * f, hd * f, N);
    if (cw) {
      linear_fwd(c, x, N, d, wt(in, p.c_kv), cw, t);
      c.k().copy_rows(loc + hd, w * f, t, cw * f, cw * f, N);
      linear_fwd(c, x, N, d, wt(in, p.c_gate), cw, t);
      c.k().copy_rows(loc + hd + cw, w * f, t, cw * f, cw * f, N);
    }
    A.release(mt);
  }
  V4HaloMove g = v4_cp_halo_gather_start(*in.cp->cp, k, in.B, loc, w, A);
  between();
  v4_cp_halo_gather_finish(*in.cp->cp, k, g, all);
  unpack_cols(c, all, w, NK, {{kvp, hd}, {ckv, cw}, {cgate, cw}});
  A.release(mk);
}

// The adjoint: the held rows' gradients dkvp [NK, hd], dckv, dcg [NK, cw] (this rank's queries'
// share; dckv null: none), packed, returned to their owners and summed there into the local
// tokens' rows -> lkvp [N, hd], lckv, lcg [N, cw].
void v4_cp_return_keys(const Ctx& c, const V4AttnIn& in, const V4CpKeys& k, int64_t cw, const float* dkvp,
                       const float* dckv, const float* dcg, float* lkvp, float* lckv, float* lcg) {
  const int64_t hd = in.cfg->v4.head_dim;
  v4_cp_halo_return_cols(c, *in.cp->cp, k, in.B, {{dkvp, hd}, {dckv, cw}, {dcg, cw}},
                         {{lkvp, hd}, {lckv, cw}, {lcg, cw}});
}

// Grouped low-rank projection: Y[:, g*olr : (g+1)*olr] = X[:, g*Dg : (g+1)*Dg] @ W_g^T with
// W [G*olr, Dg] (W_g its g-th block of rows). X: [N, G*Dg], Y: [N, G*olr].
struct Grouped {
  int64_t N, G, Dg, olr;
};

void grouped_fwd(const Ctx& c, const Grouped& g, const float* X, W w, float* Y) {
  auto mk = c.ws->mark();
  const bool bf = c.prec == kern::Prec::BF16 && w.b;
  const void* x = bf ? gemm_input(c, X, g.N * g.G * g.Dg) : (const void*)X;
  const size_t es = bf ? 2 : 4;
  const char* wb = bf ? (const char*)w.b : (const char*)w.f;
  std::vector<kern::GemmGroup> gg;
  for (int64_t k = 0; k < g.G; ++k)
    gg.push_back({(const char*)x + k * g.Dg * es, wb + k * g.olr * g.Dg * es, Y + k * g.olr, g.N, g.olr, g.Dg,
                  g.G * g.Dg, g.Dg, g.G * g.olr});
  grouped_gemm_fwd(c, bf ? kern::Prec::BF16 : kern::Prec::F32, 0.f, gg.data(), (int)gg.size());
  c.ws->release(mk);
}

// dY -> dX (overwrite), dW (+=)
void grouped_bwd(const Ctx& c, const Grouped& g, const float* X, W w, const float* dY, float* dX, float* dW) {
  auto mk = c.ws->mark();
  const bool bf = c.prec == kern::Prec::BF16 && w.b;
  const kern::Prec pr = bf ? kern::Prec::BF16 : kern::Prec::F32;
  const size_t es = bf ? 2 : 4;
  const void* dy = bf ? gemm_input(c, dY, g.N * g.G * g.olr) : (const void*)dY;
  const char* wb = bf ? (const char*)w.b : (const char*)w.f;
  std::vector<kern::GemmGroup> gg;
  for (int64_t k = 0; k < g.G; ++k)
    gg.push_back({(const char*)dy + k * g.olr * es, wb + k * g.olr * g.Dg * es, dX + k * g.Dg, g.N, g.Dg, g.olr,
                  g.G * g.olr, g.Dg, g.G * g.Dg});
  c.k().grouped_gemm(pr, false, false, 1.f, 0.f, gg.data(), (int)gg.size());
  if (dW) {
    const void* x = bf ? gemm_input(c, X, g.N * g.G * g.Dg) : (const void*)X;
    gg.clear();
    for (int64_t k = 0; k < g.G; ++k)
      gg.push_back({(const char*)dy + k * g.olr * es, (const char*)x + k * g.Dg * es, dW + k * g.olr * g.Dg, g.olr,
                    g.Dg, g.N, g.G * g.olr, g.G * g.Dg, g.Dg});
    c.k().grouped_gemm(pr, true, false, 1.f, 1.f, gg.data(), (int)gg.size());
  }
  c.ws->release(mk);
}

// q_b's output of the local heads: qres [N, qr] -> qb [N, H hd] (the forward's, and the
// backward's rebuild under "mla_up_proj": the same GEMM, the same bits).
void v4_q_up(const Ctx& c, const V4AttnIn& in, const float* qres, float* qb) {
  const ModelConfig& cf = *in.cfg;
  const int64_t N = in.B * in.T, H = local_slice(in).Hl, hd = cf.v4.head_dim, qr = cf.q_lora_rank;
  linear_fwd(c, qres, N, qr, wt(in, in.p->q_b + local_slice(in).sh0 * hd * qr), H * hd, qb);
}

// The queries: Q = rope(rmsnorm_unweighted_per_head(qb)) -> Q [N, H, hd], rstd [N H] (the
// forward's and the backward's rebuild: the same kernels on the same qb, the same bits).
void v4_queries(const Ctx& c, const V4AttnIn& in, const float* qb, const int32_t* tpos, float* Q, float* rstd) {
  const ModelConfig& cf = *in.cfg;
  const int64_t N = in.B * in.T, H = local_slice(in).Hl, hd = cf.v4.head_dim;
  {
    auto mk = c.ws->mark();
    c.k().rmsnorm_fwd(qb, N * H, hd, ones(c, hd), (float)cf.rms_norm_eps, Q, rstd);
    c.ws->release(mk);
  }
  rope_heads(c, Q, N, (int)H, hd, cf.qk_rope_head_dim, tpos, in.cos, in.sin, false);
}

// The attention output with its RoPE dims rotated back: -> Or [N, H hd] (arena), the grouped
// o_a's input; the forward's and the backward's, the same bits.
float* v4_unrotated(const Ctx& c, const V4AttnIn& in, const float* O, const int32_t* tpos) {
  const ModelConfig& cf = *in.cfg;
  const int64_t N = in.B * in.T, H = local_slice(in).Hl, hd = cf.v4.head_dim;
  float* Or = c.ws->alloc<float>(N * H * hd);
  c.k().copy(Or, O, N * H * hd * sizeof(float));
  rope_heads(c, Or, N, (int)H, hd, cf.qk_rope_head_dim, tpos, in.cos, in.sin, true);
  return Or;
}

}  // namespace

void v4_attn_forward(const Ctx& c, const V4AttnIn& in, const float* x, float* out, V4AttnSaved& s) {
  const ModelConfig& cf = *in.cfg;
  const V4Config& v = cf.v4;
  const V4LayerParams& p = *in.p;
  const AttnKind kind = v.attn[in.layer];
  const Slice sl = local_slice(in);
  // H, G: this rank's heads and output groups; Hf, Gf: the whole layer's.
  const int64_t Hf = cf.num_attention_heads, Gf = v.o_groups, H = sl.Hl, G = sl.Gl;
  const int64_t B = in.B, T = in.T, N = B * T, d = cf.hidden_size, hd = v.head_dim;
  const int64_t qr = cf.q_lora_rank, rd = cf.qk_rope_head_dim, m = v.rate(in.layer), W = v.sliding_window;
  const float eps = (float)cf.rms_norm_eps;
  StackArena& A = *c.ws;
  s.x = x;
  // Key rows: this rank's held rows of the whole rows of Tf tokens (context parallel), else the
  // queries' own.
  const int cc = kind == AttnKind::CSA ? 2 : kind == AttnKind::HCA ? 1 : 0;  // compressor channels
  const int64_t Tf = in.cp ? in.cp->split.T : T;
  const V4CpKeys keys = in.cp ? cp_keys(in) : V4CpKeys{};
  const int64_t NK = in.cp ? B * keys.np : N;
  const int32_t* tpos = query_positions(c, in);
  const int32_t* kpos = in.cp ? held_positions(c, keys, B) : tpos;

  // Query path: q_a, its norm, q_b's output qb (kept unless in.drop_qb; the queries Q are built
  // below, after the kept buffers). Context parallel: it runs while the key side's halos travel.
  s.qa = A.alloc<float>(N * qr);
  s.qa_rstd = A.alloc<float>(N);
  s.qres = A.alloc<float>(N * qr);
  s.qb = in.drop_qb ? nullptr : A.alloc<float>(N * H * hd);
  s.q_rstd = A.alloc<float>(N * H);
  auto query_rest = [&] {  // after q_a
    c.k().rmsnorm_fwd(s.qa, N, qr, in.P + p.q_a_norm, eps, s.qres, s.qa_rstd);
    if (s.qb) v4_q_up(c, in, s.qres, s.qb);
  };
  auto query_path = [&] {
    linear_fwd(c, x, N, d, wt(in, p.q_a), qr, s.qa);
    query_rest();
  };

  // Sliding key/value rows, then compressed entries.
  s.nw = kind == AttnKind::Sliding ? 0 : Tf / m;
  const int64_t nw = s.nw;
  s.NK = NK, s.M = NK + B * nw;
  s.KV = A.alloc<float>(s.M * hd);
  s.kvp = A.alloc<float>(NK * hd);
  s.kv_rstd = A.alloc<float>(NK);
  const int32_t* cpos = nullptr;
  if (in.cp) {  // the local tokens' key-side projections, their halos exchanged into the held rows
    if (cc) s.ckv = A.alloc<float>(NK * cc * hd), s.cgate = A.alloc<float>(NK * cc * hd);
    v4_cp_gather_keys(c, in, keys, x, s.kvp, s.ckv, s.cgate, query_path);
  } else {
    // The projections of x (q_a, kv, the compressor's kv and gate) into their kept buffers, on one
    // bf16 copy of x (a BF16 run), then the rest of the query path.
    cpos = positions(c, std::max<int64_t>(B * nw, 1), Tf, nw, m);
    if (kind != AttnKind::Sliding) {
      s.ckv = A.alloc<float>(N * cc * hd);
      s.cgate = A.alloc<float>(N * cc * hd);
      s.cpool = A.alloc<float>(std::max<int64_t>(B * nw, 1) * hd);
      s.c_rstd = A.alloc<float>(std::max<int64_t>(B * nw, 1));
    }
    const auto mx = A.mark();
    const Act xa = act_with_bf16(c, x, N * d);
    linear_fwd(c, xa, N, d, wt(in, p.q_a), qr, s.qa);
    linear_fwd(c, xa, N, d, wt(in, p.kv), hd, s.kvp);
    if (kind != AttnKind::Sliding) {
      linear_fwd(c, xa, N, d, wt(in, p.c_kv), cc * hd, s.ckv);
      linear_fwd(c, xa, N, d, wt(in, p.c_gate), cc * hd, s.cgate);
    }
    A.release(mx);
    query_rest();
  }
  c.k().rmsnorm_fwd(s.kvp, NK, hd, in.P + p.kv_norm, eps, s.KV, s.kv_rstd);
  rope_heads(c, s.KV, NK, 1, hd, rd, kpos, in.cos, in.sin, false);
  if (in.cp && kind != AttnKind::Sliding) {
    // This rank's entries: pooled from its held rows, normalized and roped, then all-gathered
    // into C. s.cpool / c_rstd keep its own [B, 2, emax] (model/v4_context_parallel.h).
    const int64_t NO = B * 2 * keys.emax;
    s.cpool = A.alloc<float>(std::max<int64_t>(NO, 1) * hd);
    s.c_rstd = A.alloc<float>(std::max<int64_t>(NO, 1));
    if (nw > 0) {
      ProfScope ps(c.prof, "fwd.attn.compress_pool");
      const int32_t* epos = c.device(v4_cp_entry_positions(keys, B, m, c.host_ws()), std::max<int64_t>(NO, 1));
      v4_cp_pool_fwd(c, keys, B, m, hd, cc, s.ckv, s.cgate, in.P + p.c_pb, s.cpool);
      const auto mo = A.mark();
      float* own = A.alloc<float>(NO * hd);
      c.k().rmsnorm_fwd(s.cpool, NO, hd, in.P + p.c_norm, eps, own, s.c_rstd);
      rope_heads(c, own, NO, 1, hd, rd, epos, in.ccos, in.csin, false);
      v4_cp_entries_gather(*in.cp->cp, keys, B, own, s.KV + NK * hd, hd, A);
      A.release(mo);
    }
  }
  if (!in.cp && kind != AttnKind::Sliding) {
    if (nw > 0) {
      ProfScope ps(c.prof, "fwd.attn.compress_pool");
      c.k().compress_pool_fwd(B, Tf, m, hd, cc, s.ckv, s.cgate, in.P + p.c_pb, s.cpool);
      float* C = s.KV + NK * hd;
      c.k().rmsnorm_fwd(s.cpool, B * nw, hd, in.P + p.c_norm, eps, C, s.c_rstd);
      rope_heads(c, C, B * nw, 1, hd, rd, cpos, in.ccos, in.csin, false);
    }
  }

  // Key lists.
  int32_t* cnt = nullptr;
  int32_t* sel = nullptr;
  const int64_t topk = v.index_topk;
  if (kind == AttnKind::CSA) {
    cnt = A.alloc<int32_t>(N);
    sel = A.alloc<int32_t>(N * topk);
    v4_index_select(c, in, x, s.qres, nw, cnt, sel);
  }
  // The rows each query attends (kernels/v4_rows.h); the host reads back their total (one
  // number) to size the list.
  const kern::V4KeyShape ks{B, Tf, W, m, nw,
                            kind == AttnKind::Sliding ? kern::V4Keys::Sliding
                            : kind == AttnKind::HCA   ? kern::V4Keys::Hca
                            : in.ix_dense             ? kern::V4Keys::CsaDense
                                                      : kern::V4Keys::Csa,
                            (int)topk};
  s.off = A.alloc<int64_t>(N + 1);
  if (in.cp) {  // the local queries at their sequence indices (host: cp runs on the CPU)
    v4_cp_key_lists(ks, *in.cp, keys, in.seg, cnt, sel, s.off, &s.idx, A);
  } else {
    c.k().v4_key_offsets(ks, in.seg, cnt, sel, s.off);
    int64_t n_rows = 0;
    c.k().to_host(&n_rows, s.off + N, sizeof(int64_t));
    s.idx = A.alloc<int32_t>(std::max<int64_t>(n_rows, 1));
    c.k().v4_key_fill(ks, in.seg, cnt, sel, s.off, s.idx);
  }

  // Attention with sinks, inverse RoPE, grouped output projection. The kept buffers first (O, lse,
  // Y, the indexer loss's pairs), then the scratch: Q (and qb when dropped) and Or, rebuilt by the
  // backward (v4_queries, v4_unrotated).
  s.O = A.alloc<float>(N * H * hd);
  s.lse = A.alloc<float>(N * H);
  const int64_t olr = v.o_lora_rank, Dg = Hf * hd / Gf;
  s.Y = A.alloc<float>(N * G * olr);
  const bool ix = kind == AttnKind::CSA && in.ix_loss;
  if (ix) v4_index_loss_pairs(c, in, s);
  const auto mq = A.mark();
  float* qb = s.qb;
  if (!qb) {
    qb = A.alloc<float>(N * H * hd);
    v4_q_up(c, in, s.qres, qb);
  }
  float* Q = A.alloc<float>(N * H * hd);
  v4_queries(c, in, qb, tpos, Q, s.q_rstd);
  kern::SparseAttnShape sh{N, (int)H, (int)hd, (float)std::pow((double)hd, -0.5), c.prec};
  {
    ProfScope ps(c.prof, "fwd.attn.core");
    c.k().sparse_attn_fwd(sh, Q, s.KV, s.M, s.off, s.idx, in.P + p.sinks + sl.sh0, s.O, s.lse);
  }
  if (ix) {
    ProfScope ps(c.prof, "fwd.attn.indexer_loss");
    v4_index_loss_forward(c, in, s, Q, cnt, sel);
  }
  float* Or = v4_unrotated(c, in, s.O, tpos);
  // o_a [Gf olr, Hf hd / Gf] group-major: rows of the local groups; o_b [d, Gf olr]: their columns
  // (row-parallel, out is a partial sum).
  const Grouped g{N, G, Dg, olr};
  grouped_fwd(c, g, Or, wt(in, p.o_a + sl.sg0 * olr * Dg), s.Y);
  A.release(mq);
  linear_fwd(c, s.Y, N, G * olr, wt(in, p.o_b + sl.sg0 * olr, sl.Gs * olr), d, out);
}

void v4_attn_backward(const Ctx& c, const V4AttnIn& in, const V4AttnSaved& s, const float* dout, float* dx) {
  const ModelConfig& cf = *in.cfg;
  const V4Config& v = cf.v4;
  const V4LayerParams& p = *in.p;
  const AttnKind kind = v.attn[in.layer];
  const Slice sl = local_slice(in);
  const int64_t Hf = cf.num_attention_heads, Gf = v.o_groups, H = sl.Hl, G = sl.Gl;  // as in forward
  const int64_t B = in.B, T = in.T, N = B * T, d = cf.hidden_size, hd = v.head_dim;
  const int64_t qr = cf.q_lora_rank, rd = cf.qk_rope_head_dim, m = v.rate(in.layer), nw = s.nw;
  StackArena& A = *c.ws;
  auto mk = A.mark();
  const int64_t Tf = in.cp ? in.cp->split.T : T, NK = s.NK;  // key rows, as in the forward
  const V4CpKeys keys = in.cp ? cp_keys(in) : V4CpKeys{};
  const int32_t* tpos = query_positions(c, in);
  const int32_t* kpos = in.cp ? held_positions(c, keys, B) : tpos;

  // Output projections.
  const int64_t olr = v.o_lora_rank, Dg = Hf * hd / Gf, GO = G * olr;
  const int64_t ob = p.o_b + sl.sg0 * olr, oa = p.o_a + sl.sg0 * olr * Dg;  // local columns / rows
  float* dY = A.alloc<float>(N * GO);
  linear_bwd(c, dout, s.Y, N, GO, wt(in, ob, sl.Gs * olr), d, dY, false, gr(in, ob));
  float* dO = A.alloc<float>(N * H * hd);
  const Grouped g{N, G, Dg, olr};
  {
    auto mw = A.mark();
    grouped_bwd(c, g, v4_unrotated(c, in, s.O, tpos), wt(in, oa), dY, dO, gr(in, oa));
    A.release(mw);
  }
  rope_heads(c, dO, N, (int)H, hd, rd, tpos, in.cos, in.sin, false);  // adjoint of the inverse rotation

  // Attention, on the queries rebuilt from qb (itself rebuilt by q_b when the forward dropped it;
  // kept until the per-head norm's backward below).
  float* dQ = A.alloc<float>(N * H * hd);
  float* dKV = A.alloc<float>(s.M * hd);
  c.k().zero(dKV, s.M * hd * sizeof(float));
  float* qb = s.qb;
  if (!qb) {
    qb = A.alloc<float>(N * H * hd);
    v4_q_up(c, in, s.qres, qb);
  }
  kern::SparseAttnShape sh{N, (int)H, (int)hd, (float)std::pow((double)hd, -0.5), c.prec};
  {
    auto mw = A.mark();
    float* Q = A.alloc<float>(N * H * hd);
    v4_queries(c, in, qb, tpos, Q, A.alloc<float>(N * H));
    float* work = A.alloc<float>(std::max<size_t>(kern::sparse_attn_bwd_workspace_floats(sh, s.M), 1));
    ProfScope ps(c.prof, "bwd.attn.core");
    c.k().sparse_attn_bwd(sh, Q, s.KV, s.M, s.off, s.idx, in.P + p.sinks + sl.sh0, s.O, s.lse, dO, dQ, dKV,
                          gr(in, p.sinks + sl.sh0), work);
    A.release(mw);
  }

  // Sliding KV rows -> kv_norm -> kv_proj (context parallel: the held rows' NK, their
  // projections' gradients returned to the owners below).
  rope_heads(c, dKV, NK, 1, hd, rd, kpos, in.cos, in.sin, true);
  float* dkvp = A.alloc<float>(NK * hd);
  c.k().rmsnorm_bwd(dKV, s.kvp, NK, hd, in.P + p.kv_norm, s.kv_rstd, dkvp, gr(in, p.kv_norm));

  // Compressed entries -> kv_norm -> pooling -> kv_proj / gate_proj.
  const int cc = kind == AttnKind::CSA ? 2 : 1;
  float *dckv = nullptr, *dcg = nullptr;  // [NK, cc hd]
  if (kind != AttnKind::Sliding && nw > 0 && in.cp) {
    // The entries' gradients (this rank's queries' share) summed into their owners; the owners'
    // norm and pooling backward add into the held rows' dckv, dcg.
    const int64_t NO = B * 2 * keys.emax;
    float* dCo = A.alloc<float>(NO * hd);
    v4_cp_entries_return(*in.cp->cp, keys, B, dKV + NK * hd, dCo, hd, A);
    const int32_t* epos = c.device(v4_cp_entry_positions(keys, B, m, c.host_ws()), NO);
    rope_heads(c, dCo, NO, 1, hd, rd, epos, in.ccos, in.csin, true);
    float* dpool = A.alloc<float>(NO * hd);
    c.k().rmsnorm_bwd(dCo, s.cpool, NO, hd, in.P + p.c_norm, s.c_rstd, dpool, gr(in, p.c_norm));
    dckv = A.alloc<float>(NK * cc * hd);
    dcg = A.alloc<float>(NK * cc * hd);
    c.k().zero(dckv, NK * cc * hd * sizeof(float));
    c.k().zero(dcg, NK * cc * hd * sizeof(float));
    float* dpb = in.G ? in.G + p.c_pb : A.alloc<float>(m * cc * hd);
    if (!in.G) c.k().zero(dpb, m * cc * hd * sizeof(float));
    ProfScope ps(c.prof, "bwd.attn.compress_pool");
    v4_cp_pool_bwd(c, keys, B, m, hd, cc, s.ckv, s.cgate, in.P + p.c_pb, dpool, dckv, dcg, dpb);
  } else if (kind != AttnKind::Sliding && nw > 0) {
    const int32_t* cpos = positions(c, B * nw, Tf, nw, m);
    float* dC = dKV + NK * hd;
    rope_heads(c, dC, B * nw, 1, hd, rd, cpos, in.ccos, in.csin, true);
    float* dpool = A.alloc<float>(B * nw * hd);
    c.k().rmsnorm_bwd(dC, s.cpool, B * nw, hd, in.P + p.c_norm, s.c_rstd, dpool, gr(in, p.c_norm));
    dckv = A.alloc<float>(NK * cc * hd);
    dcg = A.alloc<float>(NK * cc * hd);
    float* dpb = in.G ? in.G + p.c_pb : A.alloc<float>(m * cc * hd);
    if (!in.G) c.k().zero(dpb, m * cc * hd * sizeof(float));
    {
      auto mw = A.mark();
      float* work = A.alloc<float>(std::max<size_t>(kern::compress_pool_bwd_workspace_floats(B, Tf, m, hd, cc), 1));
      ProfScope ps(c.prof, "bwd.attn.compress_pool");
      c.k().compress_pool_bwd(B, Tf, m, hd, cc, s.ckv, s.cgate, in.P + p.c_pb, dpool, dckv, dcg, dpb, work);
      A.release(mw);
    }
  }
  if (in.cp) {  // the key-side gradients summed into the owners' rows, then the projections
    const int64_t cw = dckv ? cc * hd : 0;
    float* lkvp = A.alloc<float>(N * hd);
    float* lckv = cw ? A.alloc<float>(N * cw) : nullptr;
    float* lcg = cw ? A.alloc<float>(N * cw) : nullptr;
    v4_cp_return_keys(c, in, keys, cw, dkvp, dckv, dcg, lkvp, lckv, lcg);
    linear_bwd(c, lkvp, s.x, N, d, wt(in, p.kv), hd, dx, false, gr(in, p.kv));
    if (cw) {
      linear_bwd(c, lckv, s.x, N, d, wt(in, p.c_kv), cw, dx, true, gr(in, p.c_kv));
      linear_bwd(c, lcg, s.x, N, d, wt(in, p.c_gate), cw, dx, true, gr(in, p.c_gate));
    }
  }

  // Query path: rope^-1 -> per-head norm -> q_b -> q_a_norm -> q_a.
  rope_heads(c, dQ, N, (int)H, hd, rd, tpos, in.cos, in.sin, true);
  float* dqb = A.alloc<float>(N * H * hd);
  {
    auto mw = A.mark();
    float* dw = A.alloc<float>(hd);
    c.k().zero(dw, hd * sizeof(float));
    c.k().rmsnorm_bwd(dQ, qb, N * H, hd, ones(c, hd), s.q_rstd, dqb, dw);
    A.release(mw);
  }
  float* dqres = A.alloc<float>(N * qr);
  const int64_t qb_off = p.q_b + sl.sh0 * hd * qr;  // q_b rows of the local heads
  linear_bwd(c, dqb, s.qres, N, qr, wt(in, qb_off), H * hd, dqres, false, gr(in, qb_off));
  float* dqa = A.alloc<float>(N * qr);
  c.k().rmsnorm_bwd(dqres, s.qa, N, qr, in.P + p.q_a_norm, s.qa_rstd, dqa, gr(in, p.q_a_norm));
  // The projections of x last, on one bf16 copy of x (a BF16 run; context parallel ran kv and the
  // compressor's above): kv (dx overwritten), the compressor's kv and gate, q_a (dx +=).
  const Act xa = in.cp ? Act(s.x) : act_with_bf16(c, s.x, N * d);
  if (!in.cp) {
    linear_bwd(c, dkvp, xa, N, d, wt(in, p.kv), hd, dx, false, gr(in, p.kv));
    if (dckv) {
      linear_bwd(c, dckv, xa, N, d, wt(in, p.c_kv), cc * hd, dx, true, gr(in, p.c_kv));
      linear_bwd(c, dcg, xa, N, d, wt(in, p.c_gate), cc * hd, dx, true, gr(in, p.c_gate));
    }
  }
  linear_bwd(c, dqa, xa, N, d, wt(in, p.q_a), qr, dx, true, gr(in, p.q_a));
  A.release(mk);
  if (kind == AttnKind::CSA && in.ix_loss && in.ix_grad != 0.f && in.G) {
    ProfScope ps(c.prof, "bwd.attn.indexer_loss");
    v4_index_loss_backward(c, in, s);
  }
}

}  // namespace trex::model
