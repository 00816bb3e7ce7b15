#include "model/v32_indexer_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/layernorm.h"
#include "model/indexer_score_bwd.h"
#include "model/v32_indexer.h"

namespace trex::model {

namespace {

W wt(const AttnIn& in, int64_t off) { return {in.P + off, nullptr, 0}; }
constexpr float kIndexNormEps = 1e-6f;  // as v32_indexer.cpp

// The key lists of the attention: query i attends the tokens s.idx[s.off[i H] + k] / H (its
// head-0 row), k < n(i); its pairs start at first(i) = s.off[i H] / H.
struct Lists {
  const MlaSaved& s;
  int64_t H;
  int64_t n(int64_t i) const { return s.off[i * H + 1] - s.off[i * H]; }
  int64_t first(int64_t i) const { return s.off[i * H] / H; }
  int64_t key(int64_t i, int64_t k) const { return s.idx[s.off[i * H] + k] / H; }
};

// The indexer's queries [N, nI, dI], head weights [N, nI] (unscaled) and keys [NK, dI] (every
// key row: v32_index_keys_all), as the selection computed them (scratch in c.ws).
struct Proj {
  float *q, *w, *k;
};
Proj project(const Ctx& c, const AttnIn& in, const MlaSaved& s) {
  const ModelConfig& m = *in.cfg;
  const int64_t N = in.B * in.T, nI = m.v32.index_n_heads, dI = m.v32.index_head_dim;
  const int64_t NK = in.B * v32_key_len(in);
  Proj p{c.ws->alloc<float>(N * nI * dI), c.ws->alloc<float>(N * nI), c.ws->alloc<float>(NK * dI)};
  v32_index_queries(c, in, s.x, s.qan, N, in.pos, p.q, p.w);
  v32_index_keys_all(c, in, s.x, p.k);
  return p;
}

}  // namespace

void v32_index_loss_forward(const Ctx& c, const AttnIn& in, MlaSaved& s, const IndexerTopk& top) {
  const ModelConfig& m = *in.cfg;
  const int64_t N = in.B * in.T, H = m.num_attention_heads / in.tp.size;
  const int64_t Nq = in.B * v32_key_len(in);  // the micro-batch's queries (the loss is their mean)
  const int64_t nI = m.v32.index_n_heads, dI = m.v32.index_head_dim, dqk = m.qk_head_dim();
  const double scale = in.rope->softmax_scale, cI = v32_index_shape(m, 1, 1).softmax_scale;
  const Lists L{s, H};
  s.ix_dI = c.ws->alloc<float>(std::max<int64_t>(L.first(N), 1));
  auto mk = c.ws->mark();
  const Proj pr = project(c, in, s);
  std::vector<double> loss(N), recall(N);
  parallel_for(N, 4, [&](int64_t i0, int64_t i1) {
    std::vector<double> p, I;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = L.n(i);
      p.assign(n, 0.0), I.assign(n, 0.0);
      const float* qi = s.Q + i * H * dqk;
      double psum = 0, imax = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k < n; ++k) {
        const int64_t j = L.key(i, k);
        for (int64_t h = 0; h < H; ++h)
          p[k] += std::exp(scale * index_dot(qi + h * dqk, s.K + (j * H + h) * dqk, dqk) - (double)s.lse[i * H + h]);
        psum += p[k];
        for (int64_t h = 0; h < nI; ++h)
          I[k] += (double)pr.w[i * nI + h] * std::max(0.0, index_dot(pr.q + (i * nI + h) * dI, pr.k + j * dI, dI));
        I[k] *= cI;
        imax = std::max(imax, I[k]);
      }
      double z = 0;
      for (int64_t k = 0; k < n; ++k) z += std::exp(I[k] - imax);
      const double logz = imax + std::log(z);
      double kl = 0;
      float* dI_i = s.ix_dI + L.first(i);
      for (int64_t k = 0; k < n; ++k) {
        p[k] /= psum;
        const double logq = I[k] - logz;
        if (p[k] > 0) kl += p[k] * (std::log(p[k]) - logq);
        dI_i[k] = (float)(std::exp(logq) - p[k]);
      }
      loss[i] = kl;
      if (in.ix_dense) {  // the attended keys are the document's tokens start..self in order
        double r = 0;
        for (int64_t k = 0; k < top.cnt[i]; ++k) r += p[top.sel[i * top.kt + k]];
        recall[i] = r;
      } else {  // the dense attention's mass on the selected keys, from its log-sum-exp
        double r = 0;
        for (int64_t h = 0; h < H; ++h) {
          double mx = -std::numeric_limits<double>::infinity(), z2 = 0;
          std::vector<double>& sc = I;  // reuse as scratch: the scores of every causal key
          sc.assign(top.self[i] - top.start[i] + 1, 0.0);
          for (int64_t j = top.start[i]; j <= top.self[i]; ++j) {
            sc[j - top.start[i]] = scale * index_dot(qi + h * dqk, s.K + (j * H + h) * dqk, dqk);
            mx = std::max(mx, sc[j - top.start[i]]);
          }
          for (double v : sc) z2 += std::exp(v - mx);
          r += std::exp((double)s.lse[i * H + h] - (mx + std::log(z2)));
        }
        recall[i] = r / (double)H;
      }
    }
  });
  c.ws->release(mk);
  double ls = 0, rs = 0;
  for (int64_t i = 0; i < N; ++i) ls += loss[i], rs += recall[i];
  s.ix_loss = Nq ? ls / (double)Nq : 0.0;
  s.ix_recall = Nq ? rs / (double)Nq : 0.0;
}

void v32_index_loss_backward(const Ctx& c, const AttnIn& in, const MlaSaved& s) {
  const ModelConfig& m = *in.cfg;
  const LayerParams& lp = *in.p;
  const int64_t N = in.B * in.T, H = m.num_attention_heads / in.tp.size, d = m.hidden_size;
  const int64_t NK = in.B * v32_key_len(in);  // key rows (and the micro-batch's queries)
  const int64_t nI = m.v32.index_n_heads, dI = m.v32.index_head_dim, dr = m.qk_rope_head_dim;
  const Lists L{s, H};
  // g(i, k) = dloss_total / dI_i[k] times c: ix_grad / NK (q - p) c; the score's scale folded in.
  const double g0 = (double)in.ix_grad / (double)NK * v32_index_shape(m, 1, 1).softmax_scale;
  StackArena& A = *c.ws;
  auto mk = A.mark();
  const Proj pr = project(c, in, s);
  float* dw = A.alloc<float>(N * nI);
  float* dq = A.alloc<float>(N * nI * dI);
  float* dk = A.alloc<float>(NK * dI);
  indexer_score_bwd(L, N, NK, nI, dI, pr.q, pr.w, pr.k, s.ix_dI, g0, 1.0, dq, dw, dk);
  if (in.cp) cp_reduce_scatter(*in.cp->cp, in.cp->split, in.B, dk, dk, dI, A);  // -> this rank's keys [N, dI]
  float* G = in.G;
  // weights_proj(x): x detached.
  linear_bwd(c, dw, s.x, N, d, wt(in, lp.ix_w), nI, nullptr, false, G + lp.ix_w);
  // iq = rope(wq_b(qan)): undo RoPE on the gradient, then wq_b (qan detached).
  if (dr)
    c.k().rope_apply(dq, N, (int)nI, nI * dI, dI, (int)dr, in.pos, in.rope->cos, in.rope->sin,
                     kern::RopeLayout::HalfSplit, true);
  linear_bwd(c, dq, s.qan, N, m.q_lora_rank, wt(in, lp.ix_wq_b), nI * dI, nullptr, false, G + lp.ix_wq_b);
  // ik = rope(LayerNorm(wk(x))): undo RoPE, the LayerNorm on wk(x) recomputed, then wk.
  if (dr)
    c.k().rope_apply(dk, N, 1, dI, dI, (int)dr, in.pos, in.rope->cos, in.rope->sin, kern::RopeLayout::HalfSplit,
                     true);
  float* y0 = A.alloc<float>(N * dI);
  float* dy0 = A.alloc<float>(N * dI);
  linear_fwd(c, s.x, N, d, wt(in, lp.ix_wk), dI, y0);
  kern::layernorm_bwd(dk, y0, N, dI, in.P + lp.ix_knorm_w, kIndexNormEps, dy0, G + lp.ix_knorm_w, G + lp.ix_knorm_b);
  linear_bwd(c, dy0, s.x, N, d, wt(in, lp.ix_wk), dI, nullptr, false, G + lp.ix_wk);
  A.release(mk);
}

}  // namespace trex::model
