#include "model/v4_indexer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/compress_pool.h"
#include "kernels/indexer.h"
#include "kernels/rope.h"
#include "model/indexer_score_bwd.h"
#include "model/v4_context_parallel.h"

namespace trex::model {

namespace {

W wt(const V4AttnIn& in, int64_t off) { return {in.P + off, in.Pb ? in.Pb + off : nullptr, 0}; }

// RoPE on the last rd dims of each of H heads of hd: x [N, H, hd] (as v4_attn.cpp).
void rope_heads(const Ctx& c, float* x, int64_t N, int H, int64_t hd, int64_t rd, const int32_t* pos,
                const float* cos, const float* sin, bool inverse) {
  c.k().rope_apply(x + (hd - rd), N, H, H * hd, hd, (int)rd, pos, cos, sin, kern::RopeLayout::Interleaved, inverse);
}

// Context parallel: this rank's held rows and own entries for the layer (the CSA attention's
// plan: the same window, rate and channels; model/v4_context_parallel.h).
V4CpKeys index_keys(const V4AttnIn& in) {
  const V4Config& v = in.cfg->v4;
  return v4_cp_keys(in.cp->split, v.sliding_window, v.rate(in.layer), 2);
}

// Positions: token i of its row at i % T (context parallel: at its sequence index); entry e of
// its row (e % nw) at (e % nw) m; context parallel, e: this rank's own entries [B, 2, emax]
// (v4_cp_entry_positions). Computed on the host, in backend memory.
struct Pos {
  int32_t *t, *c, *e = nullptr;
};
Pos positions(const Ctx& c, const V4AttnIn& in, int64_t nw, int64_t m, const V4CpKeys* keys) {
  const int64_t B = in.B, T = in.T;
  StackArena& H = c.host_ws();
  Pos p{H.alloc<int32_t>(std::max<int64_t>(B * T, 1)), H.alloc<int32_t>(std::max<int64_t>(B * nw, 1))};
  for (int64_t i = 0; i < B * T; ++i) p.t[i] = (int32_t)(in.cp ? in.cp->qidx[i % T] : i % T);
  for (int64_t i = 0; i < std::max<int64_t>(B * nw, 1); ++i) p.c[i] = i < B * nw ? (int32_t)((i % nw) * m) : 0;
  Pos d{c.device(p.t, std::max<int64_t>(B * T, 1)), c.device(p.c, std::max<int64_t>(B * nw, 1))};
  if (keys) d.e = c.device(v4_cp_entry_positions(*keys, B, m, H), std::max<int64_t>(B * 2 * keys->emax, 1));
  return d;
}

// The indexer's projections (scratch in c.ws): q [N, nI, dI] (roped), w [N, nI] (times nI^-0.5),
// k [B nw, dI]; with keep, also what the key path's backward needs: kv, gate [NK, 2 dI] (the
// compressor's projections), pool [B nw, dI] (before the norm) and its rstd [B nw]. Context
// parallel (keys): kv and gate are this rank's held rows (NK = B np: the local tokens' and their
// halos, exchanged), pool and rstd its own entries [B, 2, emax], and k every rank's entries,
// gathered; else NK = N.
struct Proj {
  float *q, *w, *k;
  float *kv = nullptr, *gate = nullptr, *pool = nullptr, *rstd = nullptr;
};

Proj project(const Ctx& c, const V4AttnIn& in, const V4CpKeys* keys, const float* x, const float* qres,
             const Pos& pos, int64_t nw, bool keep) {
  const ModelConfig& cf = *in.cfg;
  const V4Config& v = cf.v4;
  const V4LayerParams& p = *in.p;
  const int64_t B = in.B, T = in.T, N = B * T, d = cf.hidden_size, dI = v.index_head_dim, nI = v.index_n_heads;
  const int64_t rd = cf.qk_rope_head_dim, m = v.rate(in.layer);
  StackArena& A = *c.ws;
  Proj pr{};
  pr.k = A.alloc<float>(std::max<int64_t>(B * nw, 1) * dI);
  if (nw > 0 && in.cp) {
    const int64_t NK = B * keys->np, NO = B * 2 * keys->emax;
    pr.kv = A.alloc<float>(NK * 2 * dI);
    pr.gate = A.alloc<float>(NK * 2 * dI);
    {
      const int64_t f = sizeof(float), w = 4 * dI;
      auto mk = A.mark();
      float* loc = A.alloc<float>(N * w);  // [N, kv | gate]
      float* all = A.alloc<float>(NK * w);
      float* t = A.alloc<float>(N * 2 * dI);
      linear_fwd(c, x, N, d, wt(in, p.i_kv), 2 * dI, t);
      c.k().copy_rows(loc, w * f, t, 2 * dI * f, 2 * dI * f, N);
      linear_fwd(c, x, N, d, wt(in, p.i_gate), 2 * dI, t);
      c.k().copy_rows(loc + 2 * dI, w * f, t, 2 * dI * f, 2 * dI * f, N);
      v4_cp_halo_gather(*in.cp->cp, *keys, B, loc, all, w, A);
      unpack_cols(c, all, w, NK, {{pr.kv, 2 * dI}, {pr.gate, 2 * dI}});
      A.release(mk);
    }
    pr.pool = A.alloc<float>(NO * dI);
    pr.rstd = keep ? A.alloc<float>(NO) : nullptr;
    v4_cp_pool_fwd(c, *keys, B, m, dI, 2, pr.kv, pr.gate, in.P + p.i_pb, pr.pool);
    auto mo = A.mark();
    float* own = A.alloc<float>(NO * dI);
    c.k().rmsnorm_fwd(pr.pool, NO, dI, in.P + p.i_norm, (float)cf.rms_norm_eps, own, pr.rstd);
    rope_heads(c, own, NO, 1, dI, rd, pos.e, in.ccos, in.csin, false);
    v4_cp_entries_gather(*in.cp->cp, *keys, B, own, pr.k, dI, A);
    A.release(mo);
  } else if (nw > 0) {
    pr.kv = A.alloc<float>(N * 2 * dI);
    pr.gate = A.alloc<float>(N * 2 * dI);
    linear_fwd(c, x, N, d, wt(in, p.i_kv), 2 * dI, pr.kv);
    linear_fwd(c, x, N, d, wt(in, p.i_gate), 2 * dI, pr.gate);
    pr.pool = A.alloc<float>(B * nw * dI);
    pr.rstd = keep ? A.alloc<float>(B * nw) : nullptr;
    c.k().compress_pool_fwd(B, T, m, dI, 2, pr.kv, pr.gate, in.P + p.i_pb, pr.pool);
    c.k().rmsnorm_fwd(pr.pool, B * nw, dI, in.P + p.i_norm, (float)cf.rms_norm_eps, pr.k, pr.rstd);
    rope_heads(c, pr.k, B * nw, 1, dI, rd, pos.c, in.ccos, in.csin, false);
  }
  pr.q = A.alloc<float>(N * nI * dI);
  linear_fwd(c, qres, N, cf.q_lora_rank, wt(in, p.i_qb), nI * dI, pr.q);
  rope_heads(c, pr.q, N, (int)nI, dI, rd, pos.t, in.ccos, in.csin, false);
  pr.w = A.alloc<float>(N * nI);
  linear_fwd(c, x, N, d, wt(in, p.i_w), nI, pr.w);
  c.k().scale(pr.w, N * nI, (float)std::pow((double)nI, -0.5));
  return pr;
}

// Context parallel, the adjoint of project's halo exchange: the held rows' gradients of the
// compressor's projections dkv, dg [NK, 2 dI] (this rank's share), packed [NK, kv | gate],
// returned to their owners and summed there into the local tokens' rows -> lkv, lg [N, 2 dI].
void return_keys(const Ctx& c, const V4AttnIn& in, const V4CpKeys& k, const float* dkv, const float* dg, float* lkv,
                 float* lg) {
  const int64_t dI = in.cfg->v4.index_head_dim;
  v4_cp_halo_return_cols(c, *in.cp->cp, k, in.B, {{dkv, 2 * dI}, {dg, 2 * dI}}, {{lkv, 2 * dI}, {lg, 2 * dI}});
}

double log_sum_exp(const std::vector<double>& v) {
  double mx = -std::numeric_limits<double>::infinity();
  for (double x : v) mx = std::max(mx, x);
  if (!std::isfinite(mx)) return mx;
  double z = 0;
  for (double x : v) z += std::exp(x - mx);
  return mx + std::log(z);
}

}  // namespace

void v4_index_select(const Ctx& c, const V4AttnIn& in, const float* x, const float* qres, int64_t nw, int32_t* cnt,
                     int32_t* sel) {
  const V4Config& v = in.cfg->v4;
  const int64_t m = v.rate(in.layer);
  StackArena& A = *c.ws;
  auto mk = A.mark();
  const V4CpKeys keys = in.cp ? index_keys(in) : V4CpKeys{};
  const V4CpKeys* kp = in.cp ? &keys : nullptr;
  const Pos pos = positions(c, in, nw, m, kp);
  const Proj pr = project(c, in, kp, x, qres, pos, nw, false);
  kern::IndexerShape sh{in.B, in.T, nw, (int)v.index_n_heads, (int)v.index_head_dim, m, (int)v.index_topk,
                        (float)std::pow((double)v.index_head_dim, -0.5)};
  sh.prec = c.prec;  // a bf16 run scores on the bf16 dot product where the attention core does
  float* work = A.alloc<float>(std::max<size_t>(kern::indexer_workspace_floats(sh), 1));
  ProfScope ps(c.prof, "fwd.attn.indexer_topk");
  c.k().indexer_topk(sh, pr.q, pr.k, pr.w, pos.t, cnt, sel, nullptr, work);
  A.release(mk);
}

void v4_index_loss_pairs(const Ctx& c, const V4AttnIn& in, V4AttnSaved& s) {
  const int64_t N = in.B * in.T, NK = s.NK;
  StackArena& A = *c.ws;
  // Pairs: the compressed entries (kv rows >= NK, ascending) of each query's key list.
  s.ix_off = A.alloc<int64_t>(N + 1);
  s.ix_off[0] = 0;
  for (int64_t i = 0; i < N; ++i) {
    int64_t n = 0;
    for (int64_t k = s.off[i]; k < s.off[i + 1]; ++k) n += s.idx[k] >= NK;
    s.ix_off[i + 1] = s.ix_off[i] + n;
  }
  const int64_t pairs = s.ix_off[N];
  s.ix_ent = A.alloc<int32_t>(std::max<int64_t>(pairs, 1));
  s.ix_dI = A.alloc<float>(std::max<int64_t>(pairs, 1));
  for (int64_t i = 0; i < N; ++i) {
    int64_t at = s.ix_off[i];
    for (int64_t k = s.off[i]; k < s.off[i + 1]; ++k)
      if (s.idx[k] >= NK) s.ix_ent[at++] = (int32_t)(s.idx[k] - NK);
  }
}

void v4_index_loss_forward(const Ctx& c, const V4AttnIn& in, V4AttnSaved& s, const float* Q, const int32_t* cnt,
                           const int32_t* sel) {
  const ModelConfig& cf = *in.cfg;
  const V4Config& v = cf.v4;
  TREX_CHECK(!in.tp.on(), "the V4 indexer loss needs every attention head on one rank");
  const int64_t B = in.B, T = in.T, N = B * T, H = cf.num_attention_heads, hd = v.head_dim;
  const int64_t nI = v.index_n_heads, dI = v.index_head_dim, nw = s.nw, m = v.rate(in.layer), kt = v.index_topk;
  // Context parallel: the key rows are this rank's held rows NK (the entries follow them in s.KV),
  // the queries this rank's N at their sequence indices; the loss and recall are divided by the
  // whole micro-batch's query count NQ, so their sums over the cp ranks are one process's.
  const int64_t Tf = in.cp ? in.cp->split.T : T, NK = s.NK, NQ = B * Tf;
  auto seq_index = [&](int64_t i) { return in.cp ? (int64_t)in.cp->qidx[i % T] : i % T; };
  const double scale = std::pow((double)hd, -0.5), cI = std::pow((double)dI, -0.5);
  StackArena& A = *c.ws;
  auto mk = A.mark();
  const V4CpKeys keys = in.cp ? index_keys(in) : V4CpKeys{};
  const V4CpKeys* kp = in.cp ? &keys : nullptr;
  const Pos pos = positions(c, in, nw, m, kp);
  const Proj pr = project(c, in, kp, s.x, s.qres, pos, nw, false);
  std::vector<double> loss(N), recall(N);
  parallel_for(N, 4, [&](int64_t i0, int64_t i1) {
    std::vector<double> p, I, sc, ss;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / T, t = seq_index(i), n = s.ix_off[i + 1] - s.ix_off[i];
      const int32_t* ent = s.ix_ent + s.ix_off[i];
      const float* qi = Q + i * H * hd;
      p.assign(n, 0.0), I.assign(n, 0.0);
      double psum = 0;
      for (int64_t k = 0; k < n; ++k) {
        const float* kv = s.KV + (NK + ent[k]) * hd;
        for (int64_t h = 0; h < H; ++h) p[k] += std::exp(scale * index_dot(qi + h * hd, kv, hd) - (double)s.lse[i * H + h]);
        psum += p[k];
        for (int64_t h = 0; h < nI; ++h)
          I[k] += (double)pr.w[i * nI + h] * std::max(0.0, index_dot(pr.q + (i * nI + h) * dI, pr.k + ent[k] * dI, dI));
        I[k] *= cI;
      }
      const double logz = log_sum_exp(I);
      double kl = 0;
      float* dI_i = s.ix_dI + s.ix_off[i];
      for (int64_t k = 0; k < n; ++k) {
        p[k] = psum > 0 ? p[k] / psum : 0.0;
        const double logq = I[k] - logz;
        if (p[k] > 0) kl += p[k] * (std::log(p[k]) - logq);
        dI_i[k] = (float)(std::exp(logq) - p[k]);
      }
      loss[i] = kl;
      // Recall: the selection's entries of t's document (ascending) against S_t / V_t.
      auto selected = [&](int64_t w) { return std::binary_search(sel + i * kt, sel + i * kt + cnt[i], (int32_t)w); };
      if (in.ix_dense) {  // S_t = V_t: p is the attention's mass over V_t
        double r = 0;
        for (int64_t k = 0; k < n; ++k) r += selected(ent[k] - b * nw) ? p[k] : 0.0;
        recall[i] = n ? r : 1.0;
      } else {
        double r = 0;
        int64_t nv = 0;
        for (int64_t w = 0; w < nw; ++w) nv += v4_entry_visible(in.seg, Tf, b, t, w, m, nw);
        if (nv == 0) {
          recall[i] = 1.0;
          continue;
        }
        for (int64_t h = 0; h < H; ++h) {
          sc.clear(), ss.clear();
          for (int64_t w = 0; w < nw; ++w) {
            if (!v4_entry_visible(in.seg, Tf, b, t, w, m, nw)) continue;
            const double a = scale * index_dot(qi + h * hd, s.KV + (NK + b * nw + w) * hd, hd);
            sc.push_back(a);
            if (selected(w)) ss.push_back(a);
          }
          r += ss.empty() ? 0.0 : std::exp(log_sum_exp(ss) - log_sum_exp(sc));
        }
        recall[i] = r / (double)H;
      }
    }
  });
  A.release(mk);
  double ls = 0, rs = 0;
  for (int64_t i = 0; i < N; ++i) ls += loss[i], rs += recall[i];
  s.ix_loss = NQ ? ls / (double)NQ : 0.0;
  s.ix_recall = NQ ? rs / (double)NQ : 0.0;
}

void v4_index_loss_backward(const Ctx& c, const V4AttnIn& in, const V4AttnSaved& s) {
  const ModelConfig& cf = *in.cfg;
  const V4Config& v = cf.v4;
  const V4LayerParams& lp = *in.p;
  const int64_t B = in.B, T = in.T, N = B * T, d = cf.hidden_size, nw = s.nw, m = v.rate(in.layer);
  const int64_t nI = v.index_n_heads, dI = v.index_head_dim, rd = cf.qk_rope_head_dim, NE = B * nw;
  // Context parallel: the entries are every rank's, the compressor's projections this rank's held
  // rows, the queries this rank's N; the loss is a mean over the whole micro-batch's NQ queries.
  const int64_t Tf = in.cp ? in.cp->split.T : T, NQ = B * Tf;
  // No pair: every gradient is 0 (under cp only when no rank has one: the others' exchanges below
  // need this rank).
  if (NE == 0 || (!in.cp && s.ix_off[N] == 0)) return;
  // g(i, k) = ix_grad / NQ (q - p) dI^-0.5: the score's scale folded in.
  const double g0 = (double)in.ix_grad / (double)NQ * std::pow((double)dI, -0.5);
  const double wsc = std::pow((double)nI, -0.5);
  StackArena& A = *c.ws;
  auto mk = A.mark();
  const V4CpKeys keys = in.cp ? index_keys(in) : V4CpKeys{};
  const V4CpKeys* kp = in.cp ? &keys : nullptr;
  const Pos pos = positions(c, in, nw, m, kp);
  const Proj pr = project(c, in, kp, s.x, s.qres, pos, nw, true);
  float* dw = A.alloc<float>(N * nI);
  float* dq = A.alloc<float>(N * nI * dI);
  float* dk = A.alloc<float>(NE * dI);
  // Query i's pairs: its selected entries s.ix_ent[ix_off[i] ..].
  struct Pairs {
    const V4AttnSaved& s;
    int64_t first(int64_t i) const { return s.ix_off[i]; }
    int64_t n(int64_t i) const { return s.ix_off[i + 1] - s.ix_off[i]; }
    int64_t key(int64_t i, int64_t k) const { return s.ix_ent[s.ix_off[i] + k]; }
  };
  indexer_score_bwd(Pairs{s}, N, NE, nI, dI, pr.q, pr.w, pr.k, s.ix_dI, g0, wsc, dq, dw, dk);  // wts = i_w(x) nI^-0.5
  float* G = in.G;
  // wts = i_w(x) nI^-0.5 (x detached).
  linear_bwd(c, dw, s.x, N, d, wt(in, lp.i_w), nI, nullptr, false, G + lp.i_w);
  // iq = rope(i_qb(qres)) (qres detached): undo the rotation, then i_qb.
  rope_heads(c, dq, N, (int)nI, dI, rd, pos.t, in.ccos, in.csin, true);
  linear_bwd(c, dq, s.qres, N, cf.q_lora_rank, wt(in, lp.i_qb), nI * dI, nullptr, false, G + lp.i_qb);
  // ik = rope(rmsnorm(pool(i_kv(x), i_gate(x), i_pb))).
  float *dkv, *dg;  // [N, 2 dI], the local tokens'
  if (in.cp) {
    // The entries' gradients (this rank's share) summed into their owners; the owners' norm and
    // pooling backward add into their held rows' gradients, which go back to the rows' owners.
    const int64_t NK = B * keys.np, NO = B * 2 * keys.emax;
    float* dko = A.alloc<float>(NO * dI);
    v4_cp_entries_return(*in.cp->cp, keys, B, dk, dko, dI, A);
    rope_heads(c, dko, NO, 1, dI, rd, pos.e, in.ccos, in.csin, true);
    float* dpool = A.alloc<float>(NO * dI);
    c.k().rmsnorm_bwd(dko, pr.pool, NO, dI, in.P + lp.i_norm, pr.rstd, dpool, G + lp.i_norm);
    float* hkv = A.alloc<float>(NK * 2 * dI);  // the held rows' [NK, 2 dI]
    float* hg = A.alloc<float>(NK * 2 * dI);
    c.k().zero(hkv, NK * 2 * dI * sizeof(float));
    c.k().zero(hg, NK * 2 * dI * sizeof(float));
    v4_cp_pool_bwd(c, keys, B, m, dI, 2, pr.kv, pr.gate, in.P + lp.i_pb, dpool, hkv, hg, G + lp.i_pb);
    dkv = A.alloc<float>(N * 2 * dI);
    dg = A.alloc<float>(N * 2 * dI);
    return_keys(c, in, keys, hkv, hg, dkv, dg);
  } else {
    rope_heads(c, dk, NE, 1, dI, rd, pos.c, in.ccos, in.csin, true);
    float* dpool = A.alloc<float>(NE * dI);
    c.k().rmsnorm_bwd(dk, pr.pool, NE, dI, in.P + lp.i_norm, pr.rstd, dpool, G + lp.i_norm);
    dkv = A.alloc<float>(N * 2 * dI);
    dg = A.alloc<float>(N * 2 * dI);
    auto mw = A.mark();
    float* work = A.alloc<float>(std::max<size_t>(kern::compress_pool_bwd_workspace_floats(B, T, m, dI, 2), 1));
    c.k().compress_pool_bwd(B, T, m, dI, 2, pr.kv, pr.gate, in.P + lp.i_pb, dpool, dkv, dg, G + lp.i_pb, work);
    A.release(mw);
  }
  linear_bwd(c, dkv, s.x, N, d, wt(in, lp.i_kv), 2 * dI, nullptr, false, G + lp.i_kv);
  linear_bwd(c, dg, s.x, N, d, wt(in, lp.i_gate), 2 * dI, nullptr, false, G + lp.i_gate);
  A.release(mk);
}

}  // namespace trex::model
