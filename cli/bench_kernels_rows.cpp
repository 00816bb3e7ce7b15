#include "cli/bench_kernels_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include "core/error.h"
#include "core/rng.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/rows.h"
#include "kernels/compress_pool.h"
#include "kernels/gemm.h"
#include "kernels/hyper_conn.h"
#include "kernels/indexer.h"
#include "kernels/lm_head_ce.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sparse_attn.h"
#include "kernels/swiglu.h"
#include "model/linear.h"
#include "model/moe.h"
#include "model/router.h"

namespace trex::cli::kbench {

using model::AttnKind;
using ll = long long;

std::string fmt(const char* f, ...) {
  char buf[256];
  va_list a;
  va_start(a, f);
  std::vsnprintf(buf, sizeof buf, f, a);
  va_end(a);
  return buf;
}

// Operands of a grouped call's groups against the buffers they were cut from (base, elements):
// each group's op(A) [M, K], op(B) [K, N] and C [M, N] must lie inside them, so a row whose
// buffers are sized for another shape fails here instead of reading past them.
struct Span {
  const void* base;
  int64_t n;
};
void check_groups(const char* row, const std::vector<kern::GemmGroup>& g, bool ta, bool tb, int64_t eb, Span a,
                  Span b, Span c) {
  auto inside = [&](const char* what, const void* p, const Span& s, int64_t es, int64_t rows, int64_t cols,
                    int64_t ld) {
    const int64_t off = ((const char*)p - (const char*)s.base) / es;
    const int64_t end = rows && cols ? off + (rows - 1) * ld + cols : off;
    TREX_CHECK(off >= 0 && end <= s.n, "bench kernels: ", row, ": a group's ", what, " reaches elements [", off, ", ",
               end, ") of a buffer of ", s.n);
  };
  for (const kern::GemmGroup& q : g) {
    inside("A", q.A, a, eb, ta ? q.K : q.M, ta ? q.M : q.K, q.lda);
    inside("B", q.B, b, eb, tb ? q.N : q.K, tb ? q.K : q.N, q.ldb);
    inside("C", q.C, c, 4, q.M, q.N, q.ldc);
  }
}

// ---- Dense linear algebra -------------------------------------------------------------------

// kern::gemm_bf16 / gemm_f32: C[M,N] = op(A) op(B) (+ C when beta = 1), operands of es bytes.
// FLOPs 2 M N K; bytes es (M K + K N) + 4 M N (8 M N when C is accumulated into).
void gemm(Plan& p, const std::string& w, const char* what, bool bf, bool ta, bool tb, int64_t M, int64_t N,
          int64_t K, float beta) {
  Op o;
  o.kernel = std::string(bf ? "gemm_bf16 " : "gemm_f32 ") + what;
  o.shape = fmt("%lldx%lldx%lld", (ll)M, (ll)N, (ll)K);
  o.gemm_bf16 = bf;
  o.flops = 2.0 * M * N * K;
  o.bytes = (bf ? 2.0 : 4.0) * (M * K + K * N) + (beta != 0 ? 8.0 : 4.0) * M * N;
  o.make = [=](Bufs& b) -> Runner {
    const int64_t lda = ta ? M : K, ldb = tb ? K : N;
    float* C = b.f(M * N);
    if (bf) {
      const bf16 *A = b.b(M * K, 1), *Bm = b.b(K * N, 2);
      return [=] { kern::gemm_bf16(ta, tb, M, N, K, 1.f, A, lda, Bm, ldb, beta, C, N); };
    }
    const float *A = b.f(M * K, 1), *Bm = b.f(K * N, 2);
    return [=] { kern::gemm_f32(ta, tb, M, N, K, 1.f, A, lda, Bm, ldb, beta, C, N); };
  };
  p.add(std::move(o), w);
}

// model::to_bf16 (the bf16 copy of a GEMM operand, model/linear.cpp): bytes 6 n.
void to_bf16(Plan& p, const std::string& w, int64_t n) {
  Op o;
  o.kernel = "to_bf16";
  o.shape = fmt("n=%lld", (ll)n);
  o.bytes = 6.0 * n;
  o.make = [=](Bufs& b) -> Runner {
    const float* x = b.f(n, 1);
    bf16* y = b.b(n, 2);
    return [=] { model::to_bf16(x, y, n); };
  };
  p.add(std::move(o), w);
}

// model::linear_fwd / linear_bwd on rows x in -> out: y = x W^T, dx = dy W, dW += dy^T x; in
// bf16 mode x is copied to bf16 first (backward: dy, and x again for dW) unless the caller made
// that copy (x_cast false).
void linear(Plan& p, const Run& r, const std::string& w, int64_t rows, int64_t in, int64_t out, bool backward,
            bool x_cast) {
  if (r.bf && x_cast) to_bf16(p, w, rows * in);
  gemm(p, w, "fwd", r.bf, false, true, rows, out, in, 0.f);
  if (!backward) return;
  if (r.bf) to_bf16(p, w, rows * out);
  if (r.bf && x_cast) to_bf16(p, w, rows * in);
  gemm(p, w, "dx", r.bf, false, false, rows, in, out, 0.f);
  gemm(p, w, "dW", r.bf, true, false, out, in, rows, 1.f);
}

// kern::grouped_gemm over the experts' sorted rows (model/moe.cpp), weight slab [E, out, in],
// R = sum of rows: FLOPs 2 R out in each;
//   fwd Y = X W_e^T   bytes es (R in + E out in) + 4 R out
//   dx  dX = dY W_e   bytes es (R out + E out in) + 4 R in
//   dW  dW_e += dY^T X  bytes es R (out + in) + 8 E out in
void experts(Plan& p, const Run& r, const std::string& w, int64_t out, int64_t in) {
  const std::vector<int64_t> rows = r.rows;
  const int64_t E = (int64_t)rows.size(), R = r.N * r.c.num_experts_per_tok;
  const bool bf = r.bf;
  const double es = bf ? 2 : 4;
  const int64_t eb = bf ? 2 : 4;  // bytes per operand element
  const int64_t mn = *std::min_element(rows.begin(), rows.end()), mx = *std::max_element(rows.begin(), rows.end());
  for (int v = 0; v < 3; ++v) {  // fwd, dx, dW
    Op o;
    o.kernel = std::string("grouped_gemm ") + (v == 0 ? "fwd" : v == 1 ? "dx" : "dW");
    o.shape = fmt("E=%lld R=%lld (%lld..%lld/expert) out=%lld in=%lld", (ll)E, (ll)R, (ll)mn, (ll)mx, (ll)out, (ll)in);
    o.gemm_bf16 = bf;
    o.flops = 2.0 * R * out * in;
    o.bytes = v == 0 ? es * (R * in + E * out * in) + 4.0 * R * out
              : v == 1 ? es * (R * out + E * out * in) + 4.0 * R * in
                       : es * R * (out + in) + 8.0 * E * out * in;
    o.make = [=](Bufs& b) -> Runner {
      const kern::Prec pr = bf ? kern::Prec::BF16 : kern::Prec::F32;
      auto in_op = [&](int64_t n, uint64_t s) -> const char* {
        return bf ? (const char*)b.b(n, s) : (const char*)b.f(n, s);
      };
      const int64_t nX = R * (v == 0 ? in : out), nW = v == 2 ? R * in : E * out * in;
      const int64_t nC = v == 2 ? E * out * in : R * (v == 0 ? out : in);
      const char* X = in_op(nX, 1);   // X [R, in] (fwd), dY [R, out] (dx, dW)
      const char* Wt = in_op(nW, 2);  // W slab [E, out, in], or X [R, in] (dW)
      float* C = b.f(nC);
      auto g = std::make_shared<std::vector<kern::GemmGroup>>();
      int64_t r0 = 0;
      for (int64_t e = 0; e < E; ++e) {
        const int64_t M = rows[e];
        const char* We = Wt + e * out * in * eb;
        if (M && v == 0) g->push_back({X + r0 * in * eb, We, C + r0 * out, M, out, in, in, in, out});
        if (M && v == 1) g->push_back({X + r0 * out * eb, We, C + r0 * in, M, in, out, out, in, in});
        if (M && v == 2)
          g->push_back({X + r0 * out * eb, Wt + r0 * in * eb, C + e * out * in, out, in, M, out, in, in});
        r0 += M;
      }
      const bool ta = v == 2, tb = v == 0;
      const float beta = v == 2 ? 1.f : 0.f;
      check_groups("grouped_gemm (experts)", *g, ta, tb, eb, {X, nX}, {Wt, nW}, {C, nC});
      return [=] { kern::grouped_gemm(pr, ta, tb, 1.f, beta, g->data(), (int)g->size()); };
    };
    p.add(std::move(o), w);
  }
}

// ---- Memory-bound kernels of every layer ----------------------------------------------------

// kern::rmsnorm (rows x d): fwd reads x, writes y: bytes 8 rows d, FLOPs 4 rows d; bwd reads dy
// and x, writes dx: bytes 12 rows d, FLOPs 8 rows d.
void rmsnorm(Plan& p, const std::string& w, int64_t rows, int64_t d, bool backward) {
  for (int v = 0; v < (backward ? 2 : 1); ++v) {
    Op o;
    o.kernel = v ? "rmsnorm_bwd" : "rmsnorm_fwd";
    o.shape = fmt("%lldx%lld", (ll)rows, (ll)d);
    o.flops = (v ? 8.0 : 4.0) * rows * d;
    o.bytes = (v ? 12.0 : 8.0) * rows * d + 8.0 * rows;
    o.make = [=](Bufs& b) -> Runner {
      const float *x = b.f(rows * d, 1), *wt = b.f(d, 2);
      float *y = b.f(rows * d), *rstd = b.f(rows);
      if (!v) return [=] { kern::rmsnorm_fwd(x, rows, d, wt, 1e-6f, y, rstd); };
      kern::rmsnorm_fwd(x, rows, d, wt, 1e-6f, y, rstd);
      const float* dy = b.f(rows * d, 3);
      float *dx = b.f(rows * d), *dw = b.f(d);
      return [=] { kern::rmsnorm_bwd(dy, x, rows, d, wt, rstd, dx, dw); };
    };
    p.add(std::move(o), w);
  }
}

// kern::rope_apply on H heads of D rotated dims per token; the slice of head h of token n starts
// at off + n st + h sh of the buffer. Reads and writes the slice, reads a cos and a sin row per
// token: bytes 8 N H D + 4 N D; FLOPs 3 N H D.
void rope(Plan& p, const Run& r, const std::string& w, int64_t N, int H, int64_t st, int64_t sh, int64_t off, int D,
          bool inverse) {
  Op o;
  o.kernel = inverse ? "rope_apply inverse" : "rope_apply";
  o.shape = fmt("N=%lld H=%d D=%d stride=%lld", (ll)N, H, D, (ll)st);
  o.flops = 3.0 * N * H * D;
  o.bytes = 8.0 * N * H * D + 4.0 * N * D;
  const int64_t T = r.T;
  o.make = [=](Bufs& b) -> Runner {
    float* x = b.f(N * st, 1);
    int32_t* pos = b.i32(N);
    for (int64_t i = 0; i < N; ++i) pos[i] = (int32_t)(i % T);
    float *cs = b.f(T * D / 2), *sn = b.f(T * D / 2);
    kern::rope_tables(kern::RopeParams{D, 10000.0}, T, cs, sn);
    return [=] {
      kern::rope_apply(x + off, N, H, st, sh, D, pos, cs, sn, kern::RopeLayout::Interleaved, inverse);
    };
  };
  p.add(std::move(o), w);
}

// kern::swiglu (rows x F, clamp `limit`): fwd reads gu [rows, 2F], writes h: bytes 12 rows F;
// bwd reads dh and gu, writes dgu: bytes 20 rows F. FLOPs ~8 / ~16 per h element.
void swiglu(Plan& p, const std::string& w, int64_t rows, int64_t F, float limit, bool bf16_grad) {
  for (int v = 0; v < 2; ++v) {
    Op o;
    o.kernel = v ? (bf16_grad ? "swiglu_bwd_bf16" : "swiglu_bwd") : "swiglu_fwd";
    o.shape = fmt("%lldx%lld", (ll)rows, (ll)F);
    o.flops = (v ? 16.0 : 8.0) * rows * F;
    o.bytes = (v ? (bf16_grad ? 16.0 : 20.0) : 12.0) * rows * F;
    o.make = [=](Bufs& b) -> Runner {
      const float* gu = b.f(rows * 2 * F, 1, 4.f);
      if (!v) {
        float* h = b.f(rows * F);
        return [=] { kern::swiglu_fwd(gu, rows, F, limit, h); };
      }
      const float* dh = b.f(rows * F, 2);
      if (bf16_grad) {
        bf16* dgb = b.b(rows * 2 * F, 3);
        return [=] { kern::swiglu_bwd_bf16(dh, gu, rows, F, limit, dgb); };
      }
      float* dgu = b.f(rows * 2 * F);
      return [=] { kern::swiglu_bwd(dh, gu, rows, F, limit, dgu); };
    };
    p.add(std::move(o), w);
  }
}

// ---- Attention ----------------------------------------------------------------------------

// kern::attention (causal, flash style) over B rows of T tokens, H heads: P = T (T+1) / 2 attended
// pairs per row and head; FLOPs fwd 2 (dqk + dv) P B H (S = q k, O = P v), bwd 2 (3 dqk + 2 dv)
// P B H (S recomputed, dV, dP, dQ, dK). Bytes fwd 4 B T H (2 dqk + 2 dv); bwd twice that. A bf16
// run's attention rounds its products' operands to bf16 (the AVX512_BF16 kernel where the CPU
// has it): rated against the best peak, as the bf16 GEMMs are.
void attention(Plan& p, const Run& r, const std::string& w, int H, int dqk, int dv, float scale) {
  const int64_t B = r.B, T = r.T;
  const double pairs = (double)T * (T + 1) / 2 * B * H;
  for (int v = 0; v < 2; ++v) {
    Op o;
    o.kernel = v ? "attention_bwd" : "attention_fwd";
    o.shape = fmt("B=%lld T=%lld H=%d dqk=%d dv=%d causal", (ll)B, (ll)T, H, dqk, dv);
    o.flops = (v ? 2.0 * (3 * dqk + 2 * dv) : 2.0 * (dqk + dv)) * pairs;
    o.bytes = (v ? 8.0 : 4.0) * B * T * H * (2 * dqk + 2 * dv);
    o.gemm_bf16 = r.bf;
    const kern::Prec prec = r.bf ? kern::Prec::BF16 : kern::Prec::F32;
    o.make = [=](Bufs& b) -> Runner {
      const kern::AttnShape sh{(int)B, (int)T, H, dqk, dv, scale, 0, prec};
      const int64_t nq = B * T * H * dqk, nv = B * T * H * dv;
      const float *q = b.f(nq, 1), *k = b.f(nq, 2), *vv = b.f(nv, 3);
      float *out = b.f(nv), *lse = b.f(B * H * T);
      if (!v) return [=] { kern::attention_fwd(sh, q, k, vv, out, lse); };
      kern::attention_fwd(sh, q, k, vv, out, lse);
      const float* dO = b.f(nv, 4);
      float *dq = b.f(nq), *dk = b.f(nq), *dvv = b.f(nv);
      return [=] { kern::attention_bwd(sh, q, k, vv, out, lse, dO, dq, dk, dvv); };
    };
    p.add(std::move(o), w);
  }
}

const char* kind_name(AttnKind k) { return k == AttnKind::Sliding ? "sliding" : k == AttnKind::CSA ? "csa" : "hca"; }

// kern::sparse_attn (H heads of D sharing one kv row per key, with sinks) over the key lists of
// a V4 layer: per attended key and head FLOPs fwd 4 D (q.k, p kv), bwd 10 D (s recomputed, dp,
// dq, dkv from q and dO). Bytes: q, o (+ dO, dq) and every kv row once, plus the key lists.
// The CSA layers' selection is a random subset of the formed entries of the indexer's size. A bf16
// run's sparse attention rounds its products' operands to bf16 (the AVX512_BF16 kernel where the
// CPU has it): rated against the best peak, as the causal attention is.
void sparse_attn(Plan& p, const Run& r, const std::string& w, const V4Keys& ks, int H, int D) {
  const int64_t B = r.B, T = r.T, N = r.N, M = N + B * ks.nw;
  double keys = 0;
  for (int64_t t = 0; t < T; ++t) keys += (double)(ks.window(t) + ks.compressed(t));
  keys *= (double)B;
  for (int v = 0; v < 2; ++v) {
    Op o;
    o.kernel = v ? "sparse_attn_bwd" : "sparse_attn_fwd";
    o.shape = fmt("N=%lld H=%d D=%d %s keys/query=%.0f", (ll)N, H, D, kind_name(ks.kind), keys / N);
    o.flops = (v ? 10.0 : 4.0) * H * D * keys;
    o.bytes = (v ? 16.0 : 8.0) * N * H * D + (v ? 12.0 : 4.0) * M * D + 4.0 * keys;
    o.gemm_bf16 = r.bf;
    const kern::Prec prec = r.bf ? kern::Prec::BF16 : kern::Prec::F32;
    o.make = [=](Bufs& b) -> Runner {
      int64_t* off = b.i64(N + 1);
      int32_t* idx = b.i32((int64_t)keys);
      Rng rng(17);
      std::vector<int32_t> pool;
      int64_t k = 0;
      for (int64_t i = 0; i < N; ++i) {
        const int64_t bi = i / T, t = i % T;
        off[i] = k;
        for (int64_t u = t - ks.window(t) + 1; u <= t; ++u) idx[k++] = (int32_t)(bi * T + u);
        const int64_t f = ks.formed(t), c = ks.compressed(t);
        pool.resize(f);
        for (int64_t j = 0; j < f; ++j) pool[j] = (int32_t)j;
        for (int64_t j = 0; j < c && c < f; ++j) std::swap(pool[j], pool[j + (int64_t)(rng.next_u64() % (f - j))]);
        std::sort(pool.begin(), pool.begin() + c);
        for (int64_t j = 0; j < c; ++j) idx[k++] = (int32_t)(N + bi * ks.nw + pool[j]);
      }
      off[N] = k;
      const kern::SparseAttnShape sh{N, H, D, (float)std::pow((double)D, -0.5), prec};
      const float *q = b.f(N * H * D, 1), *kv = b.f(M * D, 2), *sink = b.f(H, 3);
      float *out = b.f(N * H * D), *lse = b.f(N * H);
      if (!v) return [=] { kern::sparse_attn_fwd(sh, q, kv, M, off, idx, sink, out, lse); };
      kern::sparse_attn_fwd(sh, q, kv, M, off, idx, sink, out, lse);
      const float* dO = b.f(N * H * D, 4);
      float *dq = b.f(N * H * D), *dkv = b.f(M * D), *dsink = b.f(H);
      float* work = b.f((int64_t)kern::sparse_attn_bwd_workspace_floats(sh, M));
      return [=] { kern::sparse_attn_bwd(sh, q, kv, M, off, idx, sink, out, lse, dO, dq, dkv, dsink, work); };
    };
    p.add(std::move(o), w);
  }
}

// kern::indexer_topk (forward only): scores nh heads of dI for the valid entries of the queries
// that have more than min(topk, nw) of them (the fast path), then the top-k. FLOPs 2 nh (dI + 1)
// per scored entry; bytes: q, wts, the compressed keys and the selection once. A bf16 run scores
// on the bf16 dot product where the attention core does (kern::IndexerShape::prec): rated against
// the best peak there.
void indexer(Plan& p, const Run& r, const std::string& w, int64_t nw, int nh, int dI, int64_t m, int topk) {
  const int64_t B = r.B, T = r.T;
  double scored = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t valid = kern::indexer_valid_count(t, m, nw);
    if (valid > std::min<int64_t>(topk, nw)) scored += (double)valid;
  }
  scored *= (double)B;
  Op o;
  o.kernel = "indexer_topk";
  o.shape = fmt("B=%lld T=%lld nw=%lld nh=%d dI=%d topk=%d", (ll)B, (ll)T, (ll)nw, nh, dI, topk);
  o.flops = 2.0 * nh * (dI + 1) * scored;
  o.bytes = 4.0 * (B * T * nh * (dI + 1) + B * nw * dI + B * T * (topk + 1));
  const kern::Prec prec = r.bf ? kern::Prec::BF16 : kern::Prec::F32;
  o.gemm_bf16 = kern::attention_bf16_kernels(prec);
  o.make = [=](Bufs& b) -> Runner {
    kern::IndexerShape sh{B, T, nw, nh, dI, m, topk, (float)std::pow((double)dI, -0.5)};
    sh.prec = prec;
    const float *q = b.f(B * T * nh * dI, 1), *k = b.f(B * nw * dI, 2), *wts = b.f(B * T * nh, 3);
    int32_t* pos = b.i32(B * T);
    for (int64_t i = 0; i < B * T; ++i) pos[i] = (int32_t)(i % T);
    int32_t *cnt = b.i32(B * T), *sel = b.i32(B * T * topk);
    float* work = b.f((int64_t)kern::indexer_workspace_floats(sh));
    return [=] { kern::indexer_topk(sh, q, k, wts, pos, cnt, sel, nullptr, work); };
  };
  p.add(std::move(o), w);
}

// kern::compress_pool (windows of m tokens, hd dims, c = 1 or 2 overlapping halves): fwd reads kv
// and gate [B, T, c hd], writes [B, T/m, hd]: bytes 4 (2 B T c hd + B nw hd), FLOPs ~6 B T c hd;
// bwd also reads dout and writes dkv, dgate: bytes 4 (4 B T c hd + B nw hd), FLOPs ~10 B T c hd.
void compress_pool(Plan& p, const Run& r, const std::string& w, int64_t m, int64_t hd, int c, bool backward) {
  const int64_t B = r.B, T = r.T, nw = T / m, n = B * T * c * hd;
  for (int v = 0; v < (backward ? 2 : 1); ++v) {
    Op o;
    o.kernel = v ? "compress_pool_bwd" : "compress_pool_fwd";
    o.shape = fmt("B=%lld T=%lld m=%lld hd=%lld c=%d", (ll)B, (ll)T, (ll)m, (ll)hd, c);
    o.flops = (v ? 10.0 : 6.0) * n;
    o.bytes = 4.0 * ((v ? 4.0 : 2.0) * n + B * nw * hd);
    o.make = [=](Bufs& b) -> Runner {
      const float *kv = b.f(n, 1), *gate = b.f(n, 2), *pb = b.f(m * c * hd, 3);
      if (!v) {
        float* out = b.f(B * nw * hd);
        return [=] { kern::compress_pool_fwd(B, T, m, hd, c, kv, gate, pb, out); };
      }
      const float* dout = b.f(B * nw * hd, 4);
      float *dkv = b.f(n), *dgate = b.f(n), *dpb = b.f(m * c * hd);
      float* work = b.f((int64_t)kern::compress_pool_bwd_workspace_floats(B, T, m, hd, c));
      return [=] { kern::compress_pool_bwd(B, T, m, hd, c, kv, gate, pb, dout, dkv, dgate, dpb, work); };
    };
    p.add(std::move(o), w);
  }
}

// kern::hc_* (mHC) on N tokens of n streams of d, K = n d, R = (2 + n) n projections (head: n):
//   pre / head fwd: RMSNorm, projection, coefficients, collapse: FLOPs N (2 R K + 4 K); bytes 4 (N K + R K + N d)
//   pre / head bwd: FLOPs N (4 R K + 6 K); bytes 4 (2 N K + N d + 2 R K)   (head: dx written, not accumulated)
//   post fwd: out[k] = post[k] f + sum_j comb[j][k] x[j]: FLOPs 2 N n (n + 1) d; bytes 4 (2 N K + N d)
//   post bwd: FLOPs 4 N n (n + 1) d; bytes 4 (3 N K + 2 N d)
// pre bwd's dx is accumulated into: 4 N K more bytes.
// pre bwd then post bwd (one pass): the two, less the sum written and read back: FLOPs pre bwd +
// post bwd; bytes 4 (2 N K + N d + 2 R K) + 4 N K (dx read) + 4 (2 N K + 2 N d).
void hyper_conn(Plan& p, const Run& r, const std::string& w, const char* which, bool fwd, bool bwd) {
  const model::V4Config& v4 = r.c.v4;
  const int64_t N = r.N, n = v4.hc_mult, d = r.c.hidden_size, K = n * d;
  const std::string kind = which;
  const int64_t R = kind == "head" ? n : (2 + n) * n;
  const kern::HcShape s{N, (int)n, d, (int)v4.hc_sinkhorn_iters, (float)v4.hc_eps, (float)r.c.rms_norm_eps};
  if (kind == "pre_then_post") {
    Op o;
    o.kernel = "hc_pre_bwd_then_post";
    o.shape = fmt("N=%lld n=%lld d=%lld", (ll)N, (ll)n, (ll)d);
    o.flops = N * (4.0 * R * K + 6.0 * K) + 4.0 * N * n * (n + 1) * d;
    o.bytes = 4.0 * (2 * N * K + N * d + 2 * R * K) + 4.0 * N * K + 4.0 * (2 * N * K + 2 * N * d);
    o.make = [=](Bufs& b) -> Runner {
      const float* x = b.f(N * K, 1);
      const float *fn = b.f(R * K, 2, 0.02f), *base = b.f(R, 3, 0.1f), *scale = b.f(3, 4);
      float *y = b.f(N * d), *mix = b.f(N * R), *rstd = b.f(N), *post = b.f(N * n), *comb = b.f(N * n * n);
      kern::hc_pre_fwd(s, x, fn, base, scale, y, post, comb, mix, rstd);
      const float *dy = b.f(N * d, 5), *dx = b.f(N * K, 8);
      float *dfn = b.f(R * K), *dbase = b.f(R), *dscale = b.f(3);
      float *dpost = b.f(N * n, 6), *dcomb = b.f(N * n * n, 7);  // the pre step's, then the post step's (as in the model)
      const float *x2 = b.f(N * K, 9), *f2 = b.f(N * d, 10), *post2 = b.f(N * n, 11), *comb2 = b.f(N * n * n, 12, 0.5f);
      float *dX = b.f(N * K), *df = b.f(N * d);
      float* work = b.f((int64_t)kern::hc_pre_bwd_workspace_floats(s));
      return [=] {
        kern::hc_pre_bwd_then_post(s, x, fn, base, scale, mix, rstd, dy, dpost, dcomb, dx, dfn, dbase, dscale, work,
                                   {x2, f2, post2, comb2, dX, df, dpost, dcomb});
      };
    };
    p.add(std::move(o), w);
    return;
  }
  for (int v = 0; v < 2; ++v) {
    if (!(v ? bwd : fwd)) continue;
    Op o;
    o.kernel = "hc_" + kind + (v ? "_bwd" : "_fwd");
    o.shape = fmt("N=%lld n=%lld d=%lld", (ll)N, (ll)n, (ll)d);
    if (kind == "post") {
      o.flops = (v ? 4.0 : 2.0) * N * n * (n + 1) * d;
      o.bytes = v ? 4.0 * (3 * N * K + 2 * N * d) : 4.0 * (2 * N * K + N * d);
    } else {
      o.flops = v ? N * (4.0 * R * K + 6.0 * K) : N * (2.0 * R * K + 4.0 * K);
      o.bytes = v ? 4.0 * (2 * N * K + N * d + 2 * R * K) + (kind == "pre" ? 4.0 * N * K : 0.0)
                  : 4.0 * (N * K + R * K + N * d);
    }
    o.make = [=](Bufs& b) -> Runner {
      const float* x = b.f(N * K, 1);
      if (kind == "post") {
        const float *f = b.f(N * d, 2), *post = b.f(N * n, 3), *comb = b.f(N * n * n, 4, 0.5f);
        if (!v) {
          float* out = b.f(N * K);
          return [=] { kern::hc_post_fwd(s, x, f, post, comb, out); };
        }
        const float* dout = b.f(N * K, 5);
        float *dx = b.f(N * K), *df = b.f(N * d), *dpost = b.f(N * n), *dcomb = b.f(N * n * n);
        return [=] { kern::hc_post_bwd(s, x, f, post, comb, dout, dx, df, dpost, dcomb); };
      }
      const float *fn = b.f(R * K, 2, 0.02f), *base = b.f(R, 3, 0.1f), *scale = b.f(3, 4);
      float *y = b.f(N * d), *mix = b.f(N * R), *rstd = b.f(N);
      float *dx = b.f(N * K), *dfn = b.f(R * K), *dbase = b.f(R), *dscale = b.f(3);
      const float* dy = b.f(N * d, 5);
      if (kind == "head") {
        if (!v) return [=] { kern::hc_head_fwd(s, x, fn, base, scale, y, mix, rstd); };
        kern::hc_head_fwd(s, x, fn, base, scale, y, mix, rstd);
        float* work = b.f((int64_t)kern::hc_head_bwd_workspace_floats(s));
        return [=] { kern::hc_head_bwd(s, x, fn, base, scale, mix, rstd, dy, dx, dfn, dbase, dscale, work); };
      }
      float *post = b.f(N * n), *comb = b.f(N * n * n);
      if (!v) return [=] { kern::hc_pre_fwd(s, x, fn, base, scale, y, post, comb, mix, rstd); };
      kern::hc_pre_fwd(s, x, fn, base, scale, y, post, comb, mix, rstd);
      const float *dpost = b.f(N * n, 6), *dcomb = b.f(N * n * n, 7);
      float* work = b.f((int64_t)kern::hc_pre_bwd_workspace_floats(s));
      return [=] {
        kern::hc_pre_bwd(s, x, fn, base, scale, mix, rstd, dy, dpost, dcomb, dx, dfn, dbase, dscale, work);
      };
    };
    p.add(std::move(o), w);
  }
}

// V4's grouped low-rank output projection o_a (model/v4_attn.cpp grouped_fwd / grouped_bwd): G
// groups of N x Dg -> olr, one kern::grouped_gemm each of fwd, dx, dW; FLOPs 2 N G olr Dg each;
// bytes as a dense GEMM of the same operands.
void grouped_oa(Plan& p, const Run& r, const std::string& w, int64_t G, int64_t Dg, int64_t olr) {
  const int64_t N = r.N;
  const bool bf = r.bf;
  const double es = bf ? 2 : 4;
  const int64_t eb = bf ? 2 : 4;  // bytes per operand element
  if (bf) to_bf16(p, w, N * G * Dg), to_bf16(p, w, N * G * olr), to_bf16(p, w, N * G * Dg);
  for (int v = 0; v < 3; ++v) {
    Op o;
    o.kernel = std::string("grouped_gemm ") + (v == 0 ? "fwd" : v == 1 ? "dx" : "dW");
    o.shape = fmt("G=%lld N=%lld out=%lld in=%lld", (ll)G, (ll)N, (ll)olr, (ll)Dg);
    o.gemm_bf16 = bf;
    o.flops = 2.0 * N * G * olr * Dg;
    o.bytes = v == 0 ? es * (N * G * Dg + G * olr * Dg) + 4.0 * N * G * olr
              : v == 1 ? es * (N * G * olr + G * olr * Dg) + 4.0 * N * G * Dg
                       : es * N * G * (olr + Dg) + 8.0 * G * olr * Dg;
    o.make = [=](Bufs& b) -> Runner {
      auto in_op = [&](int64_t n, uint64_t s) -> const char* {
        return bf ? (const char*)b.b(n, s) : (const char*)b.f(n, s);
      };
      const Span sx{in_op(N * G * Dg, 1), N * G * Dg}, sy{in_op(N * G * olr, 2), N * G * olr};
      const Span sw{in_op(G * olr * Dg, 3), G * olr * Dg};
      const int64_t nC = std::max(N * G * std::max(Dg, olr), G * olr * Dg);
      const char *X = (const char*)sx.base, *dY = (const char*)sy.base, *Wt = (const char*)sw.base;
      float* C = b.f(nC);
      auto g = std::make_shared<std::vector<kern::GemmGroup>>();
      for (int64_t k = 0; k < G; ++k) {
        const char *x = X + k * Dg * eb, *dy = dY + k * olr * eb, *wk = Wt + k * olr * Dg * eb;
        if (v == 0) g->push_back({x, wk, C + k * olr, N, olr, Dg, G * Dg, Dg, G * olr});
        if (v == 1) g->push_back({dy, wk, C + k * Dg, N, Dg, olr, G * olr, Dg, G * Dg});
        if (v == 2) g->push_back({dy, x, C + k * olr * Dg, olr, Dg, N, G * olr, G * Dg, Dg});
      }
      const kern::Prec pr = bf ? kern::Prec::BF16 : kern::Prec::F32;
      const bool ta = v == 2, tb = v == 0;
      const float beta = v == 2 ? 1.f : 0.f;
      check_groups("grouped_gemm (o_a)", *g, ta, tb, eb, v == 0 ? sx : sy, v == 2 ? sx : sw, {C, nC});
      return [=] { kern::grouped_gemm(pr, ta, tb, 1.f, beta, g->data(), (int)g->size()); };
    };
    p.add(std::move(o), w);
  }
}

// ---- MoE routing and its glue loops ---------------------------------------------------------

// The router (model/moe.cpp, f32): logits = x Wr^T (gemm_f32 fwd, dx accumulated, dW), then
// model::router_select (bytes 8 N E + 8 N K: logits in, scores out, the selection) and in backward
// router_probs_backward + router_scores_backward (bytes 12 N E).
void router(Plan& p, const Run& r, const std::string& w) {
  const model::ModelConfig& c = r.c;
  const int64_t N = r.N, E = c.n_routed_experts, K = c.num_experts_per_tok, d = c.hidden_size;
  gemm(p, w, "fwd", false, false, true, N, E, d, 0.f);
  gemm(p, w, "dx", false, false, false, N, d, E, 1.f);
  gemm(p, w, "dW", false, true, false, E, d, N, 1.f);
  for (int v = 0; v < 2; ++v) {
    Op o;
    o.kernel = v ? "router bwd" : "router_select";
    o.shape = fmt("N=%lld E=%lld K=%lld %s", (ll)N, (ll)E, (ll)K, model::scoring_name(c.scoring_func).c_str());
    o.flops = (v ? 6.0 : 10.0) * N * E;
    o.bytes = v ? 12.0 * N * E : 8.0 * N * E + 8.0 * N * K;
    o.make = [&c, N, E, K, v](Bufs& b) -> Runner {
      const float* logits = b.f(N * E, 1, 3.f);
      auto ro = std::make_shared<model::RouterOut>();
      ro->scores = b.f(N * E);
      ro->idx = b.i32(N * K);
      ro->probs = b.f(N * K);
      if (!v) return [&c, logits, N, ro] { model::router_select(c, logits, nullptr, N, *ro); };
      model::router_select(c, logits, nullptr, N, *ro);
      const float* dprobs = b.f(N * K, 2);
      float* dsc = b.f(N * E);
      return [&c, N, E, ro, dprobs, dsc] {
        std::fill(dsc, dsc + N * E, 0.f);
        model::router_probs_backward(c, *ro, dprobs, N, dsc);
        model::router_scores_backward(c, ro->scores, dsc, N, dsc);
      };
    };
    p.add(std::move(o), w);
  }
}

// model/moe.h's row operations (the same functions moe_forward / moe_backward call):
//   dispatch: moe_sort (counting sort of the R = N K (token, slot) pairs by expert), then the
//     gather of x rows into sorted order (run again in backward for dW of gate|up): bytes 8 R d +
//     12 R; bf16 (one rank): kern::gather_rows_bf16 from x's bf16 copy, bytes 4 R d + 12 R
//   combine: out[n] += sum_k p[n,k] y[row(n,k)]: bytes 4 (R d + 2 N d), FLOPs 2 R d
//   combine bwd: dy[row] = p dout[n]: bytes 4 (N d + R d), FLOPs R d (the probabilities' gradient
//     comes from the experts' backward, kern::moe_probs_bwd)
//   dispatch bwd: dx[n] += dxs[row(n,k)]: bytes 4 (R d + 2 N d), FLOPs R d
void moe_glue(Plan& p, const Run& r, const std::string& w) {
  const int64_t N = r.N, K = r.c.num_experts_per_tok, d = r.c.hidden_size, E = r.c.n_routed_experts, R = N * K;
  const std::vector<int32_t> idx = r.idx;
  const std::vector<float> probs = r.probs;
  const bool bf = r.bf;
  const char* names[4] = {"moe dispatch", "moe combine", "moe combine bwd", "moe dispatch bwd"};
  for (int v = 0; v < 4; ++v) {
    Op o;
    o.kernel = names[v];
    o.shape = fmt("N=%lld K=%lld d=%lld", (ll)N, (ll)K, (ll)d);
    o.flops = v == 0 ? 0.0 : v == 1 ? 2.0 * R * d : 1.0 * R * d;
    o.bytes = v == 0 ? (bf ? 4.0 : 8.0) * R * d + 12.0 * R : v == 2 ? 4.0 * (N * d + R * d) : 4.0 * (R * d + 2 * N * d);
    o.make = [=](Bufs& b) -> Runner {
      int32_t *row_token = b.i32(R), *slot_row = b.i32(R);
      auto offsets = std::make_shared<std::vector<int64_t>>();
      auto sort = [=] { model::moe_sort(idx.data(), N, K, E, *offsets, row_token, slot_row, nullptr); };
      sort();
      const float* x = b.f(N * d, 1);
      float* xs = b.f(R * d, 2);
      if (v == 0 && bf) {
        const bf16* xb = b.b(N * d, 4);
        bf16* xsb = b.b(R * d, 5);
        return [=] {
          sort();
          kern::gather_rows_bf16(xb, row_token, R, d, xsb);
        };
      }
      if (v == 0)
        return [=] {
          sort();
          kern::gather_rows(x, row_token, R, d, xs);
        };
      float* out = b.f(N * d, 3);
      auto pv = std::make_shared<std::vector<float>>(probs);
      if (v == 1) return [=] { kern::moe_combine(xs, pv->data(), slot_row, N, K, d, out); };
      float* dy = b.f(R * d);
      if (v == 2) return [=] { kern::moe_combine_bwd(x, pv->data(), slot_row, N, K, d, dy); };
      return [=] { kern::moe_dispatch_bwd(xs, slot_row, N, K, d, out); };
    };
    if (v == 0) p.add(o, w);  // dispatch's gather runs again in backward (without the sort)
    p.add(std::move(o), w);
  }
}

// kern::lm_head_ce with gradients: FLOPs kern::lm_head_ce_flops (6 N V d when one chunk covers the
// vocabulary, else 8: the logits formed twice); bytes es (N d + 2 V d) + 4 N d + 8 V d: W read in
// both passes, dh written, dW accumulated.
void lm_head_ce(Plan& p, const Run& r, const std::string& w) {
  const int64_t N = r.N, d = r.c.hidden_size, V = r.c.vocab_size;
  const bool bf = r.bf;
  Op o;
  o.kernel = "lm_head_ce";
  o.shape = fmt("N=%lld d=%lld V=%lld", (ll)N, (ll)d, (ll)V);
  o.gemm_bf16 = bf;
  kern::CeArgs shape;
  shape.N = N, shape.d = d, shape.V = V;
  o.flops = kern::lm_head_ce_flops(shape, true);
  o.bytes = (bf ? 2.0 : 4.0) * (N * d + 2 * V * d) + 4.0 * N * d + 8.0 * V * d;
  o.make = [=](Bufs& b) -> Runner {
    auto a = std::make_shared<kern::CeArgs>();
    a->prec = bf ? kern::Prec::BF16 : kern::Prec::F32;
    a->N = N, a->d = d, a->V = V;
    a->h = b.f(N * d, 1);
    a->W = b.f(V * d, 2, 0.05f);
    if (bf) a->h_b = b.b(N * d, 1), a->W_b = b.b(V * d, 2);
    int32_t* labels = b.i32(N);
    for (int64_t i = 0; i < N; ++i) labels[i] = (int32_t)((i * 7919) % V);
    a->labels = labels;
    a->grad_scale = 1.f / (float)N;
    a->dh = b.f(N * d);
    a->dW = b.f(V * d);
    a->workspace = b.f((int64_t)kern::lm_head_ce_workspace_floats(*a));
    return [a] { kern::lm_head_ce(*a, nullptr); };
  };
  p.add(std::move(o), w);
}

// The optimizer (train/optimizer.cpp), run once per step per parameter tensor; timed here as one
// call over a slab of up to 16M elements and scaled to the parameter count (it is linear in n):
// sum_squares of the gradients (bytes 4 n) and AdamW with the bf16 copy (bytes 30 n: grad,
// master, moments read; master, moments, bf16 copy written; 28 n without the copy); and the
// gradient buffer zeroed for the next step (kern::zero_bytes, as Model::zero_grads; bytes 4 n).
void optimizer(Plan& p, const Run& r, int64_t n_all, int64_t n_trained) {
  const int64_t cap = int64_t{16} << 20;
  const bool bf = r.bf;
  {
    const int64_t t = std::min(n_all, cap);
    Op o;
    o.kernel = "zero_grads";
    o.shape = fmt("n=%lld", (ll)n_all);
    o.bytes = 4.0 * n_all;
    o.scale = (double)n_all / (double)t;
    if (n_all > t) o.note = fmt("timed on %lld elements, scaled", (ll)t);
    o.make = [=](Bufs& b) -> Runner {
      float* g = b.f(t, 2, 1e-3f);
      return [=] { kern::zero_bytes(g, (size_t)t * sizeof(float)); };
    };
    p.add(std::move(o), "step");
  }
  for (int v = 0; v < 2; ++v) {
    const int64_t n = v ? n_trained : n_all, t = std::min(n, cap);
    Op o;
    o.kernel = v ? "adamw_step" : "sum_squares";
    o.shape = fmt("n=%lld", (ll)n);
    o.flops = (v ? 12.0 : 2.0) * n;
    o.bytes = (v ? (bf ? 30.0 : 28.0) : 4.0) * n;
    o.scale = (double)n / (double)t;
    if (n > t) o.note = fmt("timed on %lld elements, scaled", (ll)t);
    o.make = [=](Bufs& b) -> Runner {
      float *pp = b.f(t, 1, 0.5f), *g = b.f(t, 2, 1e-3f), *m1 = b.f(t), *m2 = b.f(t);
      if (!v) return [=] { kern::sum_squares(g, t); };
      bf16* pb = bf ? b.b(t, 3) : nullptr;
      auto step = std::make_shared<int64_t>(0);
      return [=] {
        const kern::AdamWParams hp{1e-4, 0.9, 0.95, 1e-8, 0.1, ++*step, 0.5f};
        kern::adamw_step(hp, pp, g, m1, m2, t, pb);
      };
    };
    p.add(std::move(o), "optimizer");
  }
}

}  // namespace trex::cli::kbench
