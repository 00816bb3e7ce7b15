// DeepSeek-V4 forward + backward of one micro-batch (HF DeepseekV4ForCausalLM, no MTP):
//   X = embed[ids] copied to hc_mult streams                                   [N, n, d]
//   per layer: (y, post, comb) = attn_hc(X); X = post * attn(rms_in(y)) + comb^T X
//              (y, post, comb) = ffn_hc(X);  X = post * moe(rms_post(y)) + comb^T X
//   h = rms_final(hc_head(X)); loss = CE(lm_head(h))
// The MoE of hash layers routes by tid2eid[input_ids]; the others by top-k of the biased
// scores. Gradients accumulate into the gradient slab (scaled by grad_scale / n_valid for CE).
#include <cmath>
#include <cstring>
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "kernels/hyper_conn.h"
#include "kernels/lm_head_ce.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "model/model.h"
#include "model/v4_attn.h"

namespace trex::model {

namespace {

kern::RopeParams v4_rope(const ModelConfig& c, double theta, const RopeScaling& y) {
  kern::RopeParams r{};
  r.dim = (int)c.qk_rope_head_dim;
  r.theta = theta;
  r.yarn = y.yarn;
  r.factor = y.factor;
  r.beta_fast = y.beta_fast;
  r.beta_slow = y.beta_slow;
  r.mscale = y.mscale;
  r.mscale_all_dim = y.mscale_all_dim;
  r.original_max_pos = y.original_max_position_embeddings;
  r.truncate = y.truncate;
  r.attention_factor = y.attention_factor;
  return r;
}

struct HcSaved {
  float *y, *post, *comb, *mix, *rstd;
};

struct V4LayerSaved {
  float* X_in;   // [N, n, d] streams entering the layer
  HcSaved ha;    // attn_hc
  float *n1, *rstd1, *a;  // normed block input, rstd, attention output [N, d]
  V4AttnSaved att;
  float* X_mid;  // [N, n, d] after the attention half
  HcSaved hf;    // ffn_hc
  float *n2, *rstd2, *f;
  MoeSaved moe;
};

HcSaved hc_alloc(StackArena& A, int64_t N, int64_t n, int64_t d) {
  HcSaved h;
  h.y = A.alloc<float>(N * d);
  h.post = A.alloc<float>(N * n);
  h.comb = A.alloc<float>(N * n * n);
  h.mix = A.alloc<float>(N * (2 + n) * n);
  h.rstd = A.alloc<float>(N);
  return h;
}

}  // namespace

void Model::v4_tables(int64_t T) {
  if ((int64_t)v4_cos_[0].size() >= T * (cfg.qk_rope_head_dim / 2) && !v4_cos_[0].empty()) return;
  const int64_t half = cfg.qk_rope_head_dim / 2;
  const kern::RopeParams rp[2] = {v4_rope(cfg, cfg.rope_theta, cfg.rope_scaling),
                                  v4_rope(cfg, cfg.v4.compress_rope_theta, cfg.v4.compress_rope)};
  for (int k = 0; k < 2; ++k) {
    v4_cos_[k].assign(T * half, 0.f);
    v4_sin_[k].assign(T * half, 0.f);
    kern::rope_tables(rp[k], T, v4_cos_[k].data(), v4_sin_[k].data());
  }
}

void Model::init_random_v4(uint64_t seed) {
  // As HF's _init_weights: matrices normal(0, initializer_range), RMSNorm weights 1, sinks,
  // position biases and HC bases 0, HC scales 1. tid2eid (HF: zeros, "real values come from the
  // checkpoint") gets K distinct random experts per token so a fresh model routes sensibly.
  Rng rng(seed);
  float* p = P();
  for (const ParamEntry& e : layout.entries) {
    float* w = p + e.offset;
    const int64_t n = e.shape.numel();
    const std::string& s = e.name;
    auto ends = [&](const char* suf) { return s.size() >= strlen(suf) && s.compare(s.size() - strlen(suf), strlen(suf), suf) == 0; };
    float fill = 1.f;
    if (ends("sinks") || ends("position_bias") || ends("hc.base") || ends("hc_base")) fill = 0.f;
    if (e.shape.ndim >= 2 && !ends("position_bias")) {
      for (int64_t i = 0; i < n; ++i) w[i] = (float)(rng.normal() * cfg.initializer_range);
    } else {
      for (int64_t i = 0; i < n; ++i) w[i] = fill;
    }
  }
  std::fill(buffers.begin(), buffers.end(), 0.f);
  const int64_t E = cfg.n_routed_experts, K = cfg.num_experts_per_tok;
  for (const V4LayerParams& q : layout.v4) {
    if (q.tid2eid < 0) continue;
    std::vector<int32_t> perm(E);
    for (int64_t t = 0; t < cfg.vocab_size; ++t) {
      for (int64_t e = 0; e < E; ++e) perm[e] = (int32_t)e;
      for (int64_t k = 0; k < K; ++k) {  // partial Fisher-Yates
        const int64_t j = k + (int64_t)(rng.uniform() * (double)(E - k)) % (E - k);
        std::swap(perm[k], perm[j]);
        buffers[q.tid2eid + t * K + k] = (float)perm[k];
      }
    }
  }
  refresh_bf16();
}

LossParts Model::run_v4(const Batch& b, float grad_scale, bool backward) {
  const ModelConfig& c = cfg;
  const V4Config& v = c.v4;
  const int64_t B = b.B, T = b.T, N = B * T, d = c.hidden_size, V = c.vocab_size, n = v.hc_mult;
  const int64_t K = c.num_experts_per_tok;
  acts.reset();
  Ctx ctx{prec, &acts, prof};
  StackArena& A = acts;
  float* P = this->P();
  float* G = backward ? this->G() : nullptr;
  const bf16* Pb = this->Pb();
  const float eps = (float)c.rms_norm_eps;
  v4_tables(T);
  const kern::HcShape hs{N, (int)n, d, (int)v.hc_sinkhorn_iters, (float)v.hc_eps, eps};

  // Embedding into every stream.
  float* X = A.alloc<float>(N * n * d);
  parallel_for(N, 64, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i)
      for (int64_t k = 0; k < n; ++k) std::memcpy(X + (i * n + k) * d, P + layout.embed + (int64_t)b.input_ids[i] * d, d * 4);
  });
  // Hash routing tables per token.
  std::vector<int32_t*> hash_idx(c.num_hidden_layers, nullptr);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (layout.v4[l].tid2eid < 0) continue;
    hash_idx[l] = A.alloc<int32_t>(N * K);
    const float* tab = buffers.data() + layout.v4[l].tid2eid;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t k = 0; k < K; ++k) hash_idx[l][i * K + k] = (int32_t)tab[(int64_t)b.input_ids[i] * K + k];
  }

  std::vector<V4LayerSaved> sv(c.num_hidden_layers);
  LossParts out;
  int64_t n_valid = 0;
  for (int64_t i = 0; i < N; ++i) n_valid += b.targets[i] != -100;
  out.n_valid = n_valid;

  auto attn_in = [&](int64_t l) {
    const bool main = v.attn[l] == AttnKind::Sliding;
    return V4AttnIn{&c, &layout.v4[l], l, P, Pb, G,
                    v4_cos_[main ? 0 : 1].data(), v4_sin_[main ? 0 : 1].data(), v4_cos_[1].data(), v4_sin_[1].data(),
                    b.seg, B, T};
  };
  auto moe_in = [&](int64_t l) {
    const LayerParams& lp = layout.layers[l];
    MoeIn mi{&c, &lp, P, Pb, G, lp.bias >= 0 ? buffers.data() + lp.bias : nullptr, B, T, opt.aux_loss_alpha, grad_scale};
    mi.hash_idx = hash_idx[l];
    mi.swiglu_limit = (float)v.swiglu_limit;
    return mi;
  };

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerParams& lp = layout.layers[l];
    const V4LayerParams& q = layout.v4[l];
    V4LayerSaved& s = sv[l];
    s.X_in = X;
    // Attention half.
    s.ha = hc_alloc(A, N, n, d);
    kern::hc_pre_fwd(hs, X, P + q.attn_hc_fn, P + q.attn_hc_base, P + q.attn_hc_scale, s.ha.y, s.ha.post, s.ha.comb,
                     s.ha.mix, s.ha.rstd);
    s.n1 = A.alloc<float>(N * d);
    s.rstd1 = A.alloc<float>(N);
    kern::rmsnorm_fwd(s.ha.y, N, d, P + lp.in_norm, eps, s.n1, s.rstd1);
    s.a = A.alloc<float>(N * d);
    {
      ProfScope ps(prof, "fwd.attn");
      v4_attn_forward(ctx, attn_in(l), s.n1, s.a, s.att);
    }
    s.X_mid = A.alloc<float>(N * n * d);
    kern::hc_post_fwd(hs, X, s.a, s.ha.post, s.ha.comb, s.X_mid);
    // MoE half.
    s.hf = hc_alloc(A, N, n, d);
    kern::hc_pre_fwd(hs, s.X_mid, P + q.ffn_hc_fn, P + q.ffn_hc_base, P + q.ffn_hc_scale, s.hf.y, s.hf.post,
                     s.hf.comb, s.hf.mix, s.hf.rstd);
    s.n2 = A.alloc<float>(N * d);
    s.rstd2 = A.alloc<float>(N);
    kern::rmsnorm_fwd(s.hf.y, N, d, P + lp.post_norm, eps, s.n2, s.rstd2);
    s.f = A.alloc<float>(N * d);
    {
      ProfScope ps(prof, "fwd.moe");
      out.aux += moe_forward(ctx, moe_in(l), s.n2, s.f, s.moe, load_[l].data());
    }
    X = A.alloc<float>(N * n * d);
    kern::hc_post_fwd(hs, s.X_mid, s.f, s.hf.post, s.hf.comb, X);
  }

  // Head: collapse the streams, final norm, LM head fused with cross-entropy.
  float* yh = A.alloc<float>(N * d);
  float* mixh = A.alloc<float>(N * n);
  float* rstdh = A.alloc<float>(N);
  kern::hc_head_fwd(hs, X, P + layout.hc_head_fn, P + layout.hc_head_base, P + layout.hc_head_scale, yh, mixh, rstdh);
  float* hf = A.alloc<float>(N * d);
  float* rstdf = A.alloc<float>(N);
  kern::rmsnorm_fwd(yh, N, d, P + layout.final_norm, eps, hf, rstdf);
  float* dhf = backward ? A.alloc<float>(N * d) : nullptr;
  kern::CeArgs ce{};
  ce.prec = prec;
  ce.N = N, ce.d = d, ce.V = V;
  ce.h = hf;
  ce.W = P + layout.head;
  if (prec == kern::Prec::BF16) {
    bf16* hb = A.alloc<bf16>(N * d);
    to_bf16(hf, hb, N * d);
    ce.h_b = hb;
    ce.W_b = Pb + layout.head;
  }
  ce.labels = b.targets;
  ce.grad_scale = n_valid ? grad_scale / (float)n_valid : 0.f;
  ce.dh = dhf;
  ce.dW = backward ? G + layout.head : nullptr;
  ce.workspace = A.alloc<float>(kern::lm_head_ce_workspace_floats(ce));
  int64_t nv = 0;
  double ce_sum;
  {
    ProfScope ps(prof, backward ? "head_ce.fwd+bwd" : "head_ce.fwd");
    ce_sum = kern::lm_head_ce(ce, &nv);
  }
  out.ce = n_valid ? ce_sum / (double)n_valid : 0.0;
  out.loss = out.ce + out.aux;
  if (!backward) return out;

  // Backward.
  float* dyh = A.alloc<float>(N * d);
  kern::rmsnorm_bwd(dhf, yh, N, d, P + layout.final_norm, rstdf, dyh, G + layout.final_norm);
  float* dX = A.alloc<float>(N * n * d);
  {
    auto mk = A.mark();
    float* work = A.alloc<float>(std::max<size_t>(kern::hc_head_bwd_workspace_floats(hs), 1));
    kern::hc_head_bwd(hs, X, P + layout.hc_head_fn, P + layout.hc_head_base, P + layout.hc_head_scale, mixh, rstdh, dyh,
                      dX, G + layout.hc_head_fn, G + layout.hc_head_base, G + layout.hc_head_scale, work);
    A.release(mk);
  }
  float* dX2 = A.alloc<float>(N * n * d);
  float* df = A.alloc<float>(N * d);
  float* dpost = A.alloc<float>(N * n);
  float* dcomb = A.alloc<float>(N * n * n);
  float* dnorm = A.alloc<float>(N * d);
  float* dy = A.alloc<float>(N * d);
  float* hc_work = A.alloc<float>(std::max<size_t>(kern::hc_pre_bwd_workspace_floats(hs), 1));
  for (int64_t l = c.num_hidden_layers - 1; l >= 0; --l) {
    const LayerParams& lp = layout.layers[l];
    const V4LayerParams& q = layout.v4[l];
    V4LayerSaved& s = sv[l];
    // X_out = post_f * f + comb_f^T X_mid
    kern::hc_post_bwd(hs, s.X_mid, s.f, s.hf.post, s.hf.comb, dX, dX2, df, dpost, dcomb);
    {
      ProfScope ps(prof, "bwd.moe");
      moe_backward(ctx, moe_in(l), s.moe, df, dnorm);
    }
    kern::rmsnorm_bwd(dnorm, s.hf.y, N, d, P + lp.post_norm, s.rstd2, dy, G + lp.post_norm);
    kern::hc_pre_bwd(hs, s.X_mid, P + q.ffn_hc_fn, P + q.ffn_hc_base, P + q.ffn_hc_scale, s.hf.mix, s.hf.rstd, dy,
                     dpost, dcomb, dX2, G + q.ffn_hc_fn, G + q.ffn_hc_base, G + q.ffn_hc_scale, hc_work);
    // X_mid = post_a * a + comb_a^T X_in
    kern::hc_post_bwd(hs, s.X_in, s.a, s.ha.post, s.ha.comb, dX2, dX, df, dpost, dcomb);
    {
      ProfScope ps(prof, "bwd.attn");
      v4_attn_backward(ctx, attn_in(l), s.att, df, dnorm);
    }
    kern::rmsnorm_bwd(dnorm, s.ha.y, N, d, P + lp.in_norm, s.rstd1, dy, G + lp.in_norm);
    kern::hc_pre_bwd(hs, s.X_in, P + q.attn_hc_fn, P + q.attn_hc_base, P + q.attn_hc_scale, s.ha.mix, s.ha.rstd, dy,
                     dpost, dcomb, dX, G + q.attn_hc_fn, G + q.attn_hc_base, G + q.attn_hc_scale, hc_work);
  }
  // Embedding: the sum over streams; columns split across threads (race-free, ordered).
  float* dE = G + layout.embed;
  parallel_for(d, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < N; ++i) {
      float* row = dE + (int64_t)b.input_ids[i] * d;
      for (int64_t k = 0; k < n; ++k) {
        const float* g = dX + (i * n + k) * d;
        for (int64_t j = c0; j < c1; ++j) row[j] += g[j];
      }
    }
  });
  return out;
}

}  // namespace trex::model
