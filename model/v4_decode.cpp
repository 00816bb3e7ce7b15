#include "model/v4_decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include "core/error.h"
#include "kernels/compress_pool.h"
#include "kernels/gemm.h"
#include "kernels/hyper_conn.h"
#include "kernels/indexer.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sparse_attn.h"
#include "model/linear.h"
#include "model/moe.h"

namespace trex::model {

namespace {

// What every layer of one feed shares.
struct Step {
  const ModelConfig& c;
  const ParamLayout& L;
  Ctx ctx;
  const float* P;
  const bf16* Pb;
  const std::vector<V4Feed>& parts;
  std::vector<int64_t> first;  // [parts + 1] first token row of each part
  std::vector<int32_t> pos;    // [N] each token's position in its sequence
  const float *cos[2], *sin[2];
  int64_t N() const { return first.back(); }
  W wt(int64_t off) const { return {P + off, Pb ? Pb + off : nullptr, 0}; }
};

// RoPE on the last rd dims of each of H heads of hd: x [N, H, hd] (as v4_attn.cpp).
void rope_heads(float* x, int64_t N, int H, int64_t hd, int64_t rd, const int32_t* pos, const float* cos,
                const float* sin, bool inverse) {
  kern::rope_apply(x + (hd - rd), N, H, H * hd, hd, (int)rd, pos, cos, sin, kern::RopeLayout::Interleaved, inverse);
}

// First token of the window that compressed entry w covers (CSA windows overlap the previous one).
int64_t window_start(AttnKind k, int64_t w, int64_t m) { return k == AttnKind::CSA ? std::max<int64_t>(0, (w - 1) * m) : w * m; }

// Grouped low-rank projection (v4_attn.cpp's grouped_fwd): Y[:, g olr : (g+1) olr] =
// X[:, g Dg : (g+1) Dg] @ W_g^T, W [G olr, Dg]. X: [N, G Dg] -> Y: [N, G olr].
void grouped_fwd(const Ctx& c, int64_t N, int64_t G, int64_t Dg, int64_t olr, const float* X, W w, float* Y) {
  auto mk = c.ws->mark();
  const bool bf = c.prec == kern::Prec::BF16 && w.b;
  const void* x = bf ? gemm_input(c, X, N * G * Dg) : (const void*)X;
  const size_t es = bf ? 2 : 4;
  const char* wb = bf ? (const char*)w.b : (const char*)w.f;
  std::vector<kern::GemmGroup> gg;
  for (int64_t k = 0; k < G; ++k)
    gg.push_back({(const char*)x + k * Dg * es, wb + k * olr * Dg * es, Y + k * olr, N, olr, Dg, G * Dg, Dg, G * olr});
  grouped_gemm_fwd(c, bf ? kern::Prec::BF16 : kern::Prec::F32, 0.f, gg.data(), (int)gg.size());
  c.ws->release(mk);
}

// One compressor of a sequence (the attention's or the CSA indexer's): appends the n new rows of
// its projections k, g [n, cc dd] to the running window rk, rg (rows from run_base), and the
// entries [nw_old, nw_new) that are now complete, pooled, normed and roped, to out [., dd].
struct Compressor {
  int cc;
  int64_t dd;
  const float *pb, *norm;  // [m, cc dd], [dd]
};

void compress_append(const Step& s, const Compressor& cp, AttnKind kind, int64_t m, int64_t run_base, int64_t nw_old,
                     int64_t nw_new, const float* k, const float* g, int64_t n, std::vector<float>& rk,
                     std::vector<float>& rg, std::vector<float>& out) {
  const int64_t C = cp.cc * cp.dd;
  rk.insert(rk.end(), k, k + n * C);
  rg.insert(rg.end(), g, g + n * C);
  if (nw_new == nw_old) return;
  // Pool the windows from window_start(nw_old): for CSA past entry 0 that also yields entry
  // nw_old - 1 again (its window is where entry nw_old's "Ca" half lives): skipped.
  const int64_t s0 = window_start(kind, nw_old, m), rows = nw_new * m - s0, skip = nw_old - s0 / m;
  StackArena& A = *s.ctx.ws;
  auto mk = A.mark();
  float* pool = A.alloc<float>((rows / m) * cp.dd);
  kern::compress_pool_fwd(1, rows, m, cp.dd, cp.cc, rk.data() + (s0 - run_base) * C, rg.data() + (s0 - run_base) * C,
                          cp.pb, pool);
  const int64_t k_new = nw_new - nw_old;
  out.resize(nw_new * cp.dd);
  float* e = out.data() + nw_old * cp.dd;
  s.ctx.k().rmsnorm_fwd(pool + skip * cp.dd, k_new, cp.dd, cp.norm, (float)s.c.rms_norm_eps, e, nullptr);
  int32_t* cpos = A.alloc<int32_t>(k_new);
  for (int64_t w = 0; w < k_new; ++w) cpos[w] = (int32_t)((nw_old + w) * m);
  rope_heads(e, k_new, 1, cp.dd, s.c.qk_rope_head_dim, cpos, s.cos[1], s.sin[1], false);
  A.release(mk);
}

// Drops the running-window rows before position new_base (rows from run_base, C floats each).
void trim_front(std::vector<float>& v, int64_t run_base, int64_t new_base, int64_t C) {
  v.erase(v.begin(), v.begin() + (new_base - run_base) * C);
}

// Layer l's attention over the new tokens: x [N, d] -> out [N, d]; advances the layer's caches.
void attn_decode(const Step& s, int64_t l, const float* x, float* out) {
  const ModelConfig& cf = s.c;
  const V4Config& v = cf.v4;
  const V4LayerParams& p = s.L.v4[l];
  const AttnKind kind = v.attn[l];
  const int64_t N = s.N(), H = cf.num_attention_heads, G = v.o_groups, d = cf.hidden_size, hd = v.head_dim;
  const int64_t qr = cf.q_lora_rank, rd = cf.qk_rope_head_dim, m = v.rate(l), W = v.sliding_window;
  const int64_t dI = v.index_head_dim, nI = v.index_n_heads, topk = v.index_topk;
  const float eps = (float)cf.rms_norm_eps;
  const int t = kind == AttnKind::Sliding ? 0 : 1;  // RoPE table of the queries and sliding keys
  const Ctx& c = s.ctx;
  StackArena& A = *c.ws;
  auto mk = A.mark();
  const int32_t* pos = s.pos.data();

  // Per-token projections of all the new tokens.
  float* qa = A.alloc<float>(N * qr);
  float* qres = A.alloc<float>(N * qr);
  linear_fwd(c, x, N, d, s.wt(p.q_a), qr, qa);
  c.k().rmsnorm_fwd(qa, N, qr, s.P + p.q_a_norm, eps, qres, nullptr);
  float* qb = A.alloc<float>(N * H * hd);
  float* Q = A.alloc<float>(N * H * hd);
  linear_fwd(c, qres, N, qr, s.wt(p.q_b), H * hd, qb);
  {
    auto mo = A.mark();
    float* ones = A.alloc<float>(hd);
    std::fill(ones, ones + hd, 1.f);
    c.k().rmsnorm_fwd(qb, N * H, hd, ones, eps, Q, nullptr);
    A.release(mo);
  }
  rope_heads(Q, N, (int)H, hd, rd, pos, s.cos[t], s.sin[t], false);
  float* kvp = A.alloc<float>(N * hd);
  float* KVn = A.alloc<float>(N * hd);
  linear_fwd(c, x, N, d, s.wt(p.kv), hd, kvp);
  c.k().rmsnorm_fwd(kvp, N, hd, s.P + p.kv_norm, eps, KVn, nullptr);
  rope_heads(KVn, N, 1, hd, rd, pos, s.cos[t], s.sin[t], false);
  const int cc = kind == AttnKind::CSA ? 2 : 1;
  float *ckv = nullptr, *cg = nullptr, *ikv = nullptr, *ig = nullptr, *iq = nullptr, *wts = nullptr;
  if (kind != AttnKind::Sliding) {
    ckv = A.alloc<float>(N * cc * hd);
    cg = A.alloc<float>(N * cc * hd);
    linear_fwd(c, x, N, d, s.wt(p.c_kv), cc * hd, ckv);
    linear_fwd(c, x, N, d, s.wt(p.c_gate), cc * hd, cg);
  }
  if (kind == AttnKind::CSA) {
    ikv = A.alloc<float>(N * 2 * dI);
    ig = A.alloc<float>(N * 2 * dI);
    linear_fwd(c, x, N, d, s.wt(p.i_kv), 2 * dI, ikv);
    linear_fwd(c, x, N, d, s.wt(p.i_gate), 2 * dI, ig);
    iq = A.alloc<float>(N * nI * dI);
    linear_fwd(c, qres, N, qr, s.wt(p.i_qb), nI * dI, iq);
    rope_heads(iq, N, (int)nI, dI, rd, pos, s.cos[1], s.sin[1], false);
    wts = A.alloc<float>(N * nI);
    linear_fwd(c, x, N, d, s.wt(p.i_w), nI, wts);
    const float ws = (float)std::pow((double)nI, -0.5);
    for (int64_t i = 0; i < N * nI; ++i) wts[i] *= ws;
  }

  // Per sequence: the compressors and the indexer advance; the key rows (the cached window, the
  // new rows, the compressed entries) go into one buffer KV, and each query lists its rows of it.
  const int64_t B = (int64_t)s.parts.size();
  std::vector<int64_t> kv0(B + 1, 0);  // first row of each sequence in KV
  for (int64_t b = 0; b < B; ++b) {
    const V4LayerCache& lc = s.parts[b].cache->layers[l];
    const int64_t len = s.parts[b].cache->len, n = s.parts[b].n;
    const int64_t nw_new = kind == AttnKind::Sliding ? 0 : (len + n) / m;
    kv0[b + 1] = kv0[b] + (len - lc.kv_base) + n + nw_new;
  }
  float* KV = A.alloc<float>(std::max<int64_t>(kv0[B], 1) * hd);
  int32_t* cnt = kind == AttnKind::CSA ? A.alloc<int32_t>(N) : nullptr;
  int32_t* sel = kind == AttnKind::CSA ? A.alloc<int32_t>(N * std::max<int64_t>(topk, 1)) : nullptr;
  int64_t* off = A.alloc<int64_t>(N + 1);
  std::vector<int32_t> idx;
  off[0] = 0;
  for (int64_t b = 0; b < B; ++b) {
    V4LayerCache& lc = s.parts[b].cache->layers[l];
    const int64_t len = s.parts[b].cache->len, n = s.parts[b].n, i0 = s.first[b];
    if (kind != AttnKind::Sliding) {
      const int64_t nw_old = lc.nw, nw_new = (len + n) / m;
      compress_append(s, {cc, hd, s.P + p.c_pb, s.P + p.c_norm}, kind, m, lc.run_base, nw_old, nw_new, ckv + i0 * cc * hd,
                      cg + i0 * cc * hd, n, lc.ckv, lc.cgate, lc.C);
      if (kind == AttnKind::CSA)
        compress_append(s, {2, dI, s.P + p.i_pb, s.P + p.i_norm}, kind, m, lc.run_base, nw_old, nw_new,
                        ikv + i0 * 2 * dI, ig + i0 * 2 * dI, n, lc.iks, lc.igs, lc.IK);
      const int64_t base = window_start(kind, nw_new, m);
      trim_front(lc.ckv, lc.run_base, base, cc * hd);
      trim_front(lc.cgate, lc.run_base, base, cc * hd);
      if (kind == AttnKind::CSA) {
        trim_front(lc.iks, lc.run_base, base, 2 * dI);
        trim_front(lc.igs, lc.run_base, base, 2 * dI);
      }
      lc.run_base = base;
      lc.nw = nw_new;
    }
    if (kind == AttnKind::CSA) {
      const kern::IndexerShape sh{1, n, lc.nw, (int)nI, (int)dI, m, (int)topk, (float)std::pow((double)dI, -0.5)};
      auto mw = A.mark();
      float* work = A.alloc<float>(std::max<size_t>(kern::indexer_workspace_floats(sh), 1));
      float dummy = 0;
      kern::indexer_topk(sh, iq + i0 * nI * dI, lc.nw ? lc.IK.data() : &dummy, wts + i0 * nI, pos + i0, cnt + i0,
                         sel + i0 * topk, nullptr, work);
      A.release(mw);
    }
    // KV rows of this sequence: cached window [kv_base, len), new rows [len, len + n), entries.
    const int64_t cached = len - lc.kv_base, r0 = kv0[b];
    if (cached) std::memcpy(KV + r0 * hd, lc.kv.data(), cached * hd * sizeof(float));
    std::memcpy(KV + (r0 + cached) * hd, KVn + i0 * hd, n * hd * sizeof(float));
    if (lc.nw) std::memcpy(KV + (r0 + cached + n) * hd, lc.C.data(), lc.nw * hd * sizeof(float));
    const int64_t e0 = r0 + cached + n;  // row of entry 0
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = i0 + j, tp = len + j;
      for (int64_t u = std::max<int64_t>(0, tp - W + 1); u <= tp; ++u) idx.push_back((int32_t)(r0 + u - lc.kv_base));
      if (kind == AttnKind::HCA) {
        for (int64_t w = 0; w < std::min<int64_t>((tp + 1) / m, lc.nw); ++w) idx.push_back((int32_t)(e0 + w));
      } else if (kind == AttnKind::CSA) {
        for (int64_t k = 0; k < cnt[i]; ++k) idx.push_back((int32_t)(e0 + sel[i * topk + k]));
      }
      off[i + 1] = (int64_t)idx.size();
    }
    // The window of the next query: the last W - 1 rows.
    lc.kv.insert(lc.kv.end(), KVn + i0 * hd, KVn + (i0 + n) * hd);
    const int64_t keep_from = std::max<int64_t>(lc.kv_base, len + n - (W - 1));
    trim_front(lc.kv, lc.kv_base, keep_from, hd);
    lc.kv_base = keep_from;
  }

  // Attention with sinks, inverse RoPE, grouped output projection.
  float* O = A.alloc<float>(N * H * hd);
  float* lse = A.alloc<float>(N * H);
  // The run's precision, as the training forward (v4_attn.cpp), so both round alike.
  const kern::SparseAttnShape sh{N, (int)H, (int)hd, (float)std::pow((double)hd, -0.5), s.ctx.prec};
  kern::sparse_attn_fwd(sh, Q, KV, kv0[B], off, idx.data(), s.P + p.sinks, O, lse);
  rope_heads(O, N, (int)H, hd, rd, pos, s.cos[t], s.sin[t], true);
  const int64_t olr = v.o_lora_rank, Dg = H * hd / G;
  float* Y = A.alloc<float>(N * G * olr);
  grouped_fwd(c, N, G, Dg, olr, O, s.wt(p.o_a), Y);
  linear_fwd(c, Y, N, G * olr, s.wt(p.o_b), d, out);
  A.release(mk);
}

}  // namespace

void v4_decode_feed(Model& m, const std::vector<V4Feed>& parts, float* logits) {
  const ModelConfig& c = m.cfg;
  const V4Config& v = c.v4;
  TREX_CHECK(c.is_v4() && !parts.empty(), "v4_decode_feed: a DeepSeek-V4 model and at least one part");
  const int64_t d = c.hidden_size, n = v.hc_mult, V = c.vocab_size, K = c.num_experts_per_tok;
  const int64_t B = (int64_t)parts.size();
  StackArena& A = m.acts;
  A.reset();
  Step s{c, m.layout, Ctx{m.prec, &A, nullptr, &m.backend()}, m.P(), m.Pb(), parts, {0}, {}, {}, {}};
  s.ctx.rows_invariant = true;  // a part gets what it gets alone (model/generate.h)
  int64_t tmax = 1;
  for (const V4Feed& f : parts) {
    TREX_CHECK(f.n > 0 && f.cache, "v4_decode_feed: each part needs a cache and at least one token");
    for (int64_t i = 0; i < f.n; ++i) {
      TREX_USER_CHECK(f.ids[i] >= 0 && f.ids[i] < V, "token ids must be in [0, vocab_size)", "token id ", f.ids[i],
                      " is outside the vocabulary (", V, ")");
      s.pos.push_back((int32_t)(f.cache->len + i));
    }
    s.first.push_back(s.first.back() + f.n);
    tmax = std::max(tmax, f.cache->len + f.n);
    if (f.cache->layers.empty()) f.cache->layers.resize(c.num_hidden_layers);
  }
  for (int64_t a = 0; a < B; ++a)
    for (int64_t b = 0; b < a; ++b) TREX_CHECK(parts[a].cache != parts[b].cache, "v4_decode_feed: a cache fed twice");
  // Tables for a power of two of positions: one step further must not rebuild them (their rows
  // do not depend on the length).
  int64_t tab = 64;
  while (tab < tmax) tab *= 2;
  m.v4_rope_tables(tab, s.cos, s.sin);
  const int64_t N = s.N();
  const float* P = s.P;
  const float eps = (float)c.rms_norm_eps;
  const kern::HcShape hs{N, (int)n, d, (int)v.hc_sinkhorn_iters, (float)v.hc_eps, eps, true};

  // Embedding rows copied into every stream: X [N, n, d].
  float* X = A.alloc<float>(N * n * d);
  {
    int64_t i = 0;
    for (const V4Feed& f : parts)
      for (int64_t j = 0; j < f.n; ++j, ++i)
        for (int64_t k = 0; k < n; ++k) std::memcpy(X + (i * n + k) * d, P + m.layout.embed + (int64_t)f.ids[j] * d, d * 4);
  }
  std::vector<int32_t> ids;
  for (const V4Feed& f : parts) ids.insert(ids.end(), f.ids, f.ids + f.n);
  float* y = A.alloc<float>(N * d);
  float* post = A.alloc<float>(N * n);
  float* comb = A.alloc<float>(N * n * n);
  float* mix = A.alloc<float>(N * (2 + n) * n);
  float* rstd = A.alloc<float>(N);
  float* h = A.alloc<float>(N * d);
  float* o = A.alloc<float>(N * d);
  float* Xm = A.alloc<float>(N * n * d);
  float* Xo = A.alloc<float>(N * n * d);
  int32_t* hash = A.alloc<int32_t>(N * K);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerParams& lp = m.layout.layers[l];
    const V4LayerParams& q = m.layout.v4[l];
    auto mk = A.mark();
    kern::hc_pre_fwd(hs, X, P + q.attn_hc_fn, P + q.attn_hc_base, P + q.attn_hc_scale, y, post, comb, mix, rstd);
    s.ctx.k().rmsnorm_fwd(y, N, d, P + lp.in_norm, eps, h, nullptr);
    attn_decode(s, l, h, o);
    kern::hc_post_fwd(hs, X, o, post, comb, Xm);
    kern::hc_pre_fwd(hs, Xm, P + q.ffn_hc_fn, P + q.ffn_hc_base, P + q.ffn_hc_scale, y, post, comb, mix, rstd);
    s.ctx.k().rmsnorm_fwd(y, N, d, P + lp.post_norm, eps, h, nullptr);
    MoeIn mi{&c, &lp, P, s.Pb, nullptr, lp.bias >= 0 ? m.buffers.data() + lp.bias : nullptr, 1, N, 0.0, 1.f};
    if (q.tid2eid >= 0) {  // hash routing: the experts of each token id
      const float* tab = m.buffers.data() + q.tid2eid;
      for (int64_t i = 0; i < N; ++i)
        for (int64_t k = 0; k < K; ++k) hash[i * K + k] = (int32_t)tab[(int64_t)ids[i] * K + k];
      mi.hash_idx = hash;
    }
    mi.swiglu_limit = (float)v.swiglu_limit;
    mi.dispatcher = &m.moe_dispatcher();
    MoeSaved ms;
    moe_forward(s.ctx, mi, h, o, ms, nullptr);
    kern::hc_post_fwd(hs, Xm, o, post, comb, Xo);
    A.release(mk);
    std::swap(X, Xo);
  }
  for (const V4Feed& f : parts) f.cache->len += f.n;

  // Head on each part's last token: hc_head collapse, final norm, LM head (bf16 inputs in bf16
  // mode, as the training loss computes it).
  float* Xl = A.alloc<float>(B * n * d);
  for (int64_t b = 0; b < B; ++b) std::memcpy(Xl + b * n * d, X + (s.first[b + 1] - 1) * n * d, n * d * 4);
  const kern::HcShape hb{B, (int)n, d, (int)v.hc_sinkhorn_iters, (float)v.hc_eps, eps, true};
  kern::hc_head_fwd(hb, Xl, P + m.layout.hc_head_fn, P + m.layout.hc_head_base, P + m.layout.hc_head_scale, y, mix,
                    rstd);
  s.ctx.k().rmsnorm_fwd(y, B, d, P + m.layout.final_norm, eps, h, nullptr);
  if (m.prec == kern::Prec::BF16) {
    bf16* hb16 = A.alloc<bf16>(B * d);
    to_bf16(h, hb16, B * d);
    gemm_fwd(s.ctx, kern::Prec::BF16, kern::Prec::BF16, B, V, d, hb16, d, s.Pb + m.layout.head, d, 0.f, logits, V);
  } else {
    gemm_fwd(s.ctx, kern::Prec::F32, kern::Prec::F32, B, V, d, h, d, P + m.layout.head, d, 0.f, logits, V);
  }
}

}  // namespace trex::model
