// DeepSeek-V4 forward + backward of one micro-batch (HF DeepseekV4ForCausalLM, plus the MTP
// blocks of DeepSeek's reference inference/model.py when the run trains them):
//   X = embed[ids] copied to hc_mult streams                                   [N, n, d]
//   per layer: (y, post, comb) = attn_hc(X); X = post * attn(rms_in(y)) + comb^T X
//              (y, post, comb) = ffn_hc(X);  X = post * moe(rms_post(y)) + comb^T X
//   h = rms_final(hc_head(X)); loss = CE(lm_head(h))
//   MTP depth k (1..D): X_k = h_proj(hnorm(X_{k-1})) + e_proj(enorm(embed[ids shifted by k]))
//   (X_0 = the main streams), one more layer (sliding attention, MoE), then its own hc_head and
//   norm and the shared LM head predict the token k+1 ahead; loss += weight * mean_k CE_k.
// The MoE of hash layers routes by tid2eid[input_ids]; the others by top-k of the biased
// scores. Gradients accumulate into the gradient slab (scaled by grad_scale / n_valid for CE).
#include <cmath>
#include <cstring>
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/gemm.h"
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
  HcSaved ha;    // attn_hc (selective "mhc": y, mix, rstd null)
  float *n1, *rstd1, *a;  // normed block input, rstd, attention output [N, d]
  V4AttnSaved att;
  float* X_mid;  // [N, n, d] after the attention half (selective "mhc": null)
  HcSaved hf;    // ffn_hc (as ha)
  float *n2, *rstd2, *f;
  MoeSaved moe;
};

// HF _init_weights for one V4 tensor: matrices normal(0, std); RMSNorm weights and HC scales 1;
// sinks, position biases and HC bases 0.
void hf_init(const ParamEntry& en, float* w, Rng& rng, double std) {
  auto ends = [&](const char* suf) {
    const size_t k = strlen(suf);
    return en.name.size() >= k && en.name.compare(en.name.size() - k, k, suf) == 0;
  };
  const bool zero = ends("sinks") || ends("position_bias") || ends("hc.base") || ends("hc_base");
  for (int64_t i = 0; i < en.shape.numel(); ++i)
    w[i] = zero ? 0.f : en.shape.ndim >= 2 ? (float)(rng.normal() * std) : 1.f;
}

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
  if ((int64_t)v4_cos_[0].size() < T * (cfg.qk_rope_head_dim / 2) || v4_cos_[0].empty()) {
    const int64_t half = cfg.qk_rope_head_dim / 2;
    const kern::RopeParams rp[2] = {v4_rope(cfg, cfg.rope_theta, cfg.rope_scaling),
                                    v4_rope(cfg, cfg.v4.compress_rope_theta, cfg.v4.compress_rope)};
    for (int k = 0; k < 2; ++k) {
      v4_cos_[k].assign(T * half, 0.f);
      v4_sin_[k].assign(T * half, 0.f);
      kern::rope_tables(rp[k], T, v4_cos_[k].data(), v4_sin_[k].data());
    }
  }
  // On a device: the four tables [main cos | main sin | compress cos | compress sin] in drope_,
  // sent again whenever they grew (or the backend changed: use_backend empties drope_).
  const size_t sz = v4_cos_[0].size();
  if (on_device() && drope_.size() != 4 * sz) {
    drope_ = kern::DeviceBuffer<float>(*be_, 4 * sz);
    for (int k = 0; k < 2; ++k) {
      be_->to_device(drope_.get() + 2 * k * sz, v4_cos_[k].data(), sz * sizeof(float));
      be_->to_device(drope_.get() + (2 * k + 1) * sz, v4_sin_[k].data(), sz * sizeof(float));
    }
  }
}

void Model::init_random_v4(uint64_t seed) {
  // As HF's _init_weights: matrices normal(0, initializer_range), RMSNorm weights 1, sinks,
  // position biases and HC bases 0, HC scales 1. tid2eid (HF: zeros, "real values come from the
  // checkpoint") gets K distinct random experts per token so a fresh model routes sensibly.
  Rng rng(seed);
  for_each_init_target([&](const ParamEntry& e, float* w) { hf_init(e, w, rng, cfg.initializer_range); });
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

namespace {

// Everything one micro-batch's layers need (pointers into the model).
struct Env {
  const ModelConfig& c;
  const ParamLayout& L;
  const Batch& b;
  Ctx ctx;
  const float* P;  // the backend's slabs (Model::dev_P ...)
  float* G;        // null: forward only
  const bf16* Pb;
  float* buffers;  // host: the hash tables and router biases
  const float* const* cos;  // [2] main, compress RoPE tables (backend memory)
  const float* const* sin;
  ExpertLoad* load;
  kern::HcShape hs;
  double aux_alpha;
  float grad_scale;
  std::vector<int32_t*> hash_idx;  // per layer [N, K] or null
  const MoeDispatcher* dispatcher = nullptr;  // where the routed rows go (Model::moe_dispatcher)
  int64_t slab_first = 0;                     // the first expert of the weight slab
  Model* model = nullptr;              // tensor parallel: the slice and Model::tp_block_*
  SeqShard sh = {};                    // sequence parallel: this rank's token rows (else all)
  // The CSA indexer's KL loss (V4AttnIn::ix_*): its stage and gradient factor; the counted
  // forward adds each CSA layer's loss and recall to ix_sum / ix_recall.
  bool ix_loss = false, ix_dense = false;
  float ix_grad = 0.f;
  double *ix_sum = nullptr, *ix_recall = nullptr;
  const int32_t* seg = nullptr;        // the batch's documents [B, T] in backend memory (or null)
  const float* dbuf = nullptr;         // buffers in backend memory (the router biases); null: buffers
  // Context parallel (Model::run_cp): b is this rank's part of the micro-batch; the attention's
  // keys are the whole rows', exchanged as each layer needs (V4AttnIn::cp), and cp_sum sums the
  // aux loss's counts over the cp group (sequence parallel: over the tp group first).
  const CpAttn* cp = nullptr;
  std::function<void(double*, size_t)> cp_sum = {};
  // Selective recompute of "moe" (TrainOptions::recomputes): layer_forward drops the MoE block's
  // activations (keeps its input s.n2 and output s.f); moe_replay rebuilds them before the backward.
  bool drop_moe = false;
  bool moe_act = false;   // selective recompute of "moe_act": the experts' SwiGLU output is recomputed
  bool shared_act = false;  // "shared_experts": the shared experts' gate|up and SwiGLU are recomputed
  bool moe_out = false;     // "moe_out": the routed experts' outputs are recomputed
  bool up_proj = false;   // "mla_up_proj": the attention's q_b output is recomputed (V4AttnIn::drop_qb)
  // "mhc": layer_forward keeps of the hyper-connections only X_in, a, f, the normed block inputs
  // and the post / comb mixes (V4LayerSaved: X_mid and the mixes' y, mix, rstd null); the
  // backward computes the rest again (layer_backward).
  bool mhc = false;
  int64_t N() const { return sh.rows; }  // token rows of every per-token array here
};

V4AttnIn attn_in(const Env& e, int64_t l) {
  const bool main = e.c.v4.attn[l] == AttnKind::Sliding;
  V4AttnIn in{&e.c, &e.L.v4[l], l, e.P, e.Pb, e.G, e.cos[main ? 0 : 1], e.sin[main ? 0 : 1],
              e.cos[1], e.sin[1], e.seg, e.b.B, e.b.T,
              e.model ? e.model->tensor_parallel().slice : TpSlice{}};
  in.ix_loss = e.ix_loss, in.ix_dense = e.ix_dense, in.ix_grad = e.ix_grad;
  in.drop_qb = e.up_proj;
  if (e.cp) in.cp = e.cp, in.seg = e.cp->seg_full;  // the keys' documents: the whole rows'
  return in;
}

MoeIn moe_in(const Env& e, int64_t l) {
  const LayerParams& lp = e.L.layers[l];
  const float* bufs = e.dbuf ? e.dbuf : e.buffers;
  MoeIn mi{&e.c, &lp, e.P, e.Pb, e.G, lp.bias >= 0 ? bufs + lp.bias : nullptr, e.b.B, e.b.T, e.aux_alpha,
           e.grad_scale};
  mi.hash_idx = e.hash_idx[l];  // host memory (MoeIn)
  mi.swiglu_limit = (float)e.c.v4.swiglu_limit;
  mi.dispatcher = e.dispatcher;
  mi.slab_first = e.slab_first;
  mi.recompute_act = e.moe_act;
  mi.recompute_shared = e.shared_act;
  mi.recompute_out = e.moe_out;
  if (e.sh.on()) {
    mi.n0 = e.sh.n0, mi.rows = e.sh.rows;
    const Model* m = e.model;
    mi.seq_sum = [m](double* v, size_t n) { m->tp_sum(v, (int64_t)n); };
  }
  if (e.cp) mi.T_seq = e.cp->split.T, mi.seq_sum = e.cp_sum;  // the whole sequences' counts and length
  return mi;
}

// A block's input from the streams X [N, n, d]: (y, post, comb, mix, rstd) = hc_pre(X) with the
// mix tensors at fn / base / scale, then nrm = rmsnorm(y) with weight `norm` -> nrm [N, d], rstd [N]
// (arena). Returns the mix's saved set; under "mhc" only post and comb are kept (y, mix and its
// rstd are scratch, rebuilt by mix_again in the backward).
HcSaved block_input(Env& e, const float* X, int64_t fn, int64_t base, int64_t scale, int64_t norm, float*& nrm,
                    float*& rstd) {
  StackArena& A = *e.ctx.ws;
  const int64_t N = e.N(), n = e.c.v4.hc_mult, d = e.c.hidden_size;
  const float* P = e.P;
  HcSaved h{};
  StackArena::Mark mk{};
  if (e.mhc) {
    h.post = A.alloc<float>(N * n);
    h.comb = A.alloc<float>(N * n * n);
    nrm = A.alloc<float>(N * d);
    rstd = A.alloc<float>(N);
    mk = A.mark();
    h.y = A.alloc<float>(N * d);
    h.mix = A.alloc<float>(N * (2 + n) * n);
    h.rstd = A.alloc<float>(N);
  } else {
    h = hc_alloc(A, N, n, d);
    nrm = A.alloc<float>(N * d);
    rstd = A.alloc<float>(N);
  }
  e.ctx.k().hc_pre_fwd(e.hs, X, P + fn, P + base, P + scale, h.y, h.post, h.comb, h.mix, h.rstd);
  e.ctx.k().rmsnorm_fwd(h.y, N, d, P + norm, (float)e.c.rms_norm_eps, nrm, rstd);
  if (e.mhc) {
    A.release(mk);
    h.y = h.mix = h.rstd = nullptr;
  }
  return h;
}

// "mhc": the mix of the streams X again (hc_pre, the forward's bits) -> the whole set (arena);
// post and comb land in scratch too (the kept ones hold the same values).
HcSaved mix_again(Env& e, const float* X, int64_t fn, int64_t base, int64_t scale) {
  const int64_t N = e.N(), n = e.c.v4.hc_mult, d = e.c.hidden_size;
  HcSaved h = hc_alloc(*e.ctx.ws, N, n, d);
  e.ctx.k().hc_pre_fwd(e.hs, X, e.P + fn, e.P + base, e.P + scale, h.y, h.post, h.comb, h.mix, h.rstd);
  return h;
}

// One decoder layer: X [N, n, d] -> returns the output streams (arena). Adds the aux loss and
// counts the expert loads; aux null: neither (the backward replaying the layer, full recompute).
float* layer_forward(Env& e, int64_t l, float* X, V4LayerSaved& s, double* aux) {
  StackArena& A = *e.ctx.ws;
  const int64_t N = e.N(), n = e.c.v4.hc_mult, d = e.c.hidden_size;
  const LayerParams& lp = e.L.layers[l];
  const V4LayerParams& q = e.L.v4[l];
  s.X_in = X;
  // Selective "mhc": the output streams' buffer holds the mid-layer streams until the MoE's output
  // turns them into the layer's output (they are not kept apart).
  float* out = e.mhc ? A.alloc<float>(N * n * d) : nullptr;
  s.ha = block_input(e, X, q.attn_hc_fn, q.attn_hc_base, q.attn_hc_scale, lp.in_norm, s.n1, s.rstd1);
  s.a = A.alloc<float>(N * d);
  {
    ProfScope ps(e.ctx.prof, "fwd.attn");
    if (e.model) {  // all B T tokens in, the heads' partial outputs summed (row-parallel o_b)
      const float* in = e.model->tp_block_in(e.sh, s.n1, d);
      float* a = e.model->tp_block_out_buf(e.sh, s.a, d);
      v4_attn_forward(e.ctx, attn_in(e, l), in, a, s.att);
      e.model->tp_block_out(e.sh, a, s.a, d);
    } else {
      v4_attn_forward(e.ctx, attn_in(e, l), s.n1, s.a, s.att);
    }
  }
  if (aux && e.ix_sum && e.c.v4.attn[l] == AttnKind::CSA) *e.ix_sum += s.att.ix_loss, *e.ix_recall += s.att.ix_recall;
  s.X_mid = e.mhc ? nullptr : A.alloc<float>(N * n * d);
  float* X_mid = e.mhc ? out : s.X_mid;
  e.ctx.k().hc_post_fwd(e.hs, X, s.a, s.ha.post, s.ha.comb, X_mid);
  s.hf = block_input(e, X_mid, q.ffn_hc_fn, q.ffn_hc_base, q.ffn_hc_scale, lp.post_norm, s.n2, s.rstd2);
  s.f = A.alloc<float>(N * d);
  {
    ProfScope ps(e.ctx.prof, "fwd.moe");
    const auto mk = A.mark();
    const double a = moe_forward(e.ctx, moe_in(e, l), s.n2, s.f, s.moe, aux ? e.load->layer(l) : nullptr);
    if (aux) *aux += a;
    if (e.drop_moe) A.release(mk);
  }
  if (e.mhc) {  // out = hc_post(X_mid, f) over X_mid's buffer, through a copy
    const auto mk = A.mark();
    float* xm = A.alloc<float>(N * n * d);
    e.ctx.k().copy(xm, out, N * n * d * sizeof(float));
    e.ctx.k().hc_post_fwd(e.hs, xm, s.f, s.hf.post, s.hf.comb, out);
    A.release(mk);
  } else {
    out = A.alloc<float>(N * n * d);
    e.ctx.k().hc_post_fwd(e.hs, s.X_mid, s.f, s.hf.post, s.hf.comb, out);
  }
  return out;
}

// Selective recompute of "moe": the MoE block's forward again on its kept input s.n2 (its output
// into a scratch buffer, the aux loss and loads not counted), so s.moe holds its activations.
void moe_replay(Env& e, int64_t l, V4LayerSaved& s) {
  float* f = e.ctx.ws->alloc<float>(e.N() * e.c.hidden_size);
  moe_forward(e.ctx, moe_in(e, l), s.n2, f, s.moe, nullptr);
}

// Row r of [N, n, d] streams <- row r / n (or, with ids, token ids[r / n]) of a [., d] table:
// ids [N] host -> [N n] backend memory, from the host scratch (arena on the CPU: release it).
const int32_t* stream_rows(const Ctx& c, const int32_t* ids, int64_t N, int64_t n) {
  int32_t* r = c.host_ws().alloc<int32_t>(N * n);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t k = 0; k < n; ++k) r[i * n + k] = ids ? ids[i] : (int32_t)i;
  return c.device(r, N * n);
}

// The embedding rows of ids [N] (host) copied into every stream: -> X [N, n, d] (arena).
float* embed_streams(const Ctx& c, const float* E, const int32_t* ids, int64_t N, int64_t n, int64_t d) {
  StackArena& A = *c.ws;
  float* X = A.alloc<float>(N * n * d);
  const auto mk = A.mark();
  c.k().gather_rows(E, stream_rows(c, ids, N, n), N * n, d, X);
  A.release(mk);
  return X;
}

// dE[ids[i]] += g[i, k] for i < N, k < n, in that order (ids host, g [N, n, d]).
void embed_backward(const Ctx& c, float* dE, const int32_t* ids, const float* g, int64_t N, int64_t n, int64_t d) {
  const auto mk = c.ws->mark();
  c.k().scatter_add_rows(g, stream_rows(c, ids, N, n), N * n, d, dE);
  c.ws->release(mk);
}

// Hash routing: the experts of each token of the main layers (MTP blocks route by top-k), in
// host memory (MoeIn::hash_idx).
void hash_routes(Env& e, const ParamLayout& L, const float* buffers, const int32_t* ids) {
  const int64_t N = e.N(), K = e.c.num_experts_per_tok;
  for (int64_t l = 0; l < e.c.num_hidden_layers; ++l) {
    if (L.v4[l].tid2eid < 0) continue;
    e.hash_idx[l] = e.ctx.host_ws().alloc<int32_t>(N * K);
    const float* tab = buffers + L.v4[l].tid2eid;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t k = 0; k < K; ++k) e.hash_idx[l][i * K + k] = (int32_t)tab[(int64_t)ids[i] * K + k];
  }
}

// Scratch of the backward pass, shared by all layers.
struct BwdScratch {
  float *dX2, *df, *dpost, *dcomb, *dnorm, *dy, *hc_work;
};

// dX: [N, n, d] gradient of the layer's output in, of its input out (in place).
void layer_backward(Env& e, int64_t l, V4LayerSaved& s, float* dX, const BwdScratch& w) {
  const int64_t N = e.N(), d = e.c.hidden_size;
  const LayerParams& lp = e.L.layers[l];
  const V4LayerParams& q = e.L.v4[l];
  const float* P = e.P;
  float* G = e.G;
  StackArena& A = *e.ctx.ws;
  // Selective "mhc": the mid-layer streams again (hc_post of the kept X_in and a: the forward's
  // bits), once for each of their two uses so they are not held through the MoE's backward.
  auto mid = [&]() -> const float* {
    if (s.X_mid) return s.X_mid;
    float* xm = A.alloc<float>(N * e.c.v4.hc_mult * d);
    e.ctx.k().hc_post_fwd(e.hs, s.X_in, s.a, s.ha.post, s.ha.comb, xm);
    return xm;
  };
  auto mk = A.mark();
  e.ctx.k().hc_post_bwd(e.hs, mid(), s.f, s.hf.post, s.hf.comb, dX, w.dX2, w.df, w.dpost, w.dcomb);
  A.release(mk);
  {
    ProfScope ps(e.ctx.prof, "bwd.moe");
    moe_backward(e.ctx, moe_in(e, l), s.moe, w.df, w.dnorm);
  }
  const float* X_mid = mid();
  const HcSaved hf = e.mhc ? mix_again(e, X_mid, q.ffn_hc_fn, q.ffn_hc_base, q.ffn_hc_scale) : s.hf;
  e.ctx.k().rmsnorm_bwd(w.dnorm, hf.y, N, d, P + lp.post_norm, s.rstd2, w.dy, G + lp.post_norm);
  // The MoE's pre step, then the attention's post step on the stream gradient it leaves, in one
  // pass (dX2 is not written back and read again): dX, df, dpost, dcomb of the attention's step.
  e.ctx.k().hc_pre_bwd_then_post(e.hs, X_mid, P + q.ffn_hc_fn, P + q.ffn_hc_base, P + q.ffn_hc_scale, hf.mix,
                                 hf.rstd, w.dy, w.dpost, w.dcomb, w.dX2, G + q.ffn_hc_fn, G + q.ffn_hc_base,
                                 G + q.ffn_hc_scale, w.hc_work,
                                 {s.X_in, s.a, s.ha.post, s.ha.comb, dX, w.df, w.dpost, w.dcomb});
  A.release(mk);
  {
    ProfScope ps(e.ctx.prof, "bwd.attn");
    if (e.model) {
      const float* dy = e.model->tp_block_in(e.sh, w.df, d);
      float* dn = e.model->tp_block_out_buf(e.sh, w.dnorm, d);
      v4_attn_backward(e.ctx, attn_in(e, l), s.att, dy, dn);
      e.model->tp_block_out(e.sh, dn, w.dnorm, d);
    } else {
      v4_attn_backward(e.ctx, attn_in(e, l), s.att, w.df, w.dnorm);
    }
  }
  mk = A.mark();
  const HcSaved ha = e.mhc ? mix_again(e, s.X_in, q.attn_hc_fn, q.attn_hc_base, q.attn_hc_scale) : s.ha;
  e.ctx.k().rmsnorm_bwd(w.dnorm, ha.y, N, d, P + lp.in_norm, s.rstd1, w.dy, G + lp.in_norm);
  e.ctx.k().hc_pre_bwd(e.hs, s.X_in, P + q.attn_hc_fn, P + q.attn_hc_base, P + q.attn_hc_scale, ha.mix, ha.rstd,
                       w.dy, w.dpost, w.dcomb, dX, G + q.attn_hc_fn, G + q.attn_hc_base, G + q.attn_hc_scale,
                       w.hc_work);
  A.release(mk);
}

// A head: hc_head collapse, final norm, LM head fused with cross-entropy (its backward to dhf
// runs inside lm_head_ce when G is set).
struct Head {
  int64_t fn, base, scale, norm;  // parameter offsets
  const float* X = nullptr;       // [N, n, d]
  float *yh = nullptr, *mix = nullptr, *rstdh = nullptr, *rstdf = nullptr, *dhf = nullptr;
};

double head_forward(Env& e, Head& h, const int32_t* targets, float ce_scale, kern::Prec prec) {
  StackArena& A = *e.ctx.ws;
  const int64_t N = e.N(), n = e.c.v4.hc_mult, d = e.c.hidden_size;
  h.yh = A.alloc<float>(N * d);
  h.mix = A.alloc<float>(N * n);
  h.rstdh = A.alloc<float>(N);
  e.ctx.k().hc_head_fwd(e.hs, h.X, e.P + h.fn, e.P + h.base, e.P + h.scale, h.yh, h.mix, h.rstdh);
  h.rstdf = A.alloc<float>(N);
  h.dhf = e.G ? A.alloc<float>(N * d) : nullptr;
  // The normed rows, their bf16 copy and the head's workspace: released once the head has run.
  const auto mk = A.mark();
  float* hf = A.alloc<float>(N * d);
  e.ctx.k().rmsnorm_fwd(h.yh, N, d, e.P + h.norm, (float)e.c.rms_norm_eps, hf, h.rstdf);
  kern::CeArgs ce{};
  ce.prec = prec;
  ce.N = N, ce.d = d, ce.V = e.c.vocab_size;
  ce.h = hf;
  ce.W = e.P + e.L.head;
  if (prec == kern::Prec::BF16) {
    bf16* hb = A.alloc<bf16>(N * d);
    e.ctx.k().to_bf16(hf, d, N, d, hb);
    ce.h_b = hb;
    ce.W_b = e.Pb + e.L.head;
  }
  ce.labels = targets;
  ce.grad_scale = ce_scale;
  ce.dh = h.dhf;
  ce.dW = e.G ? e.G + e.L.head : nullptr;
  ce.workspace = A.alloc<float>(kern::lm_head_ce_workspace_floats(ce));
  int64_t nv = 0;
  double sum;
  {
    ProfScope ps(e.ctx.prof, e.G ? "head_ce.fwd+bwd" : "head_ce.fwd");
    sum = e.ctx.k().lm_head_ce(ce, &nv);
  }
  A.release(mk);
  return sum;
}

// -> dX [N, n, d] (overwrite)
void head_backward(Env& e, const Head& h, float* dX) {
  StackArena& A = *e.ctx.ws;
  const int64_t N = e.N(), d = e.c.hidden_size;
  auto mk = A.mark();
  float* dyh = A.alloc<float>(N * d);
  e.ctx.k().rmsnorm_bwd(h.dhf, h.yh, N, d, e.P + h.norm, h.rstdf, dyh, e.G + h.norm);
  float* work = A.alloc<float>(std::max<size_t>(kern::hc_head_bwd_workspace_floats(e.hs), 1));
  e.ctx.k().hc_head_bwd(e.hs, h.X, e.P + h.fn, e.P + h.base, e.P + h.scale, h.mix, h.rstdh, dyh, dX, e.G + h.fn,
                        e.G + h.base, e.G + h.scale, work);
  A.release(mk);
}

// Saved state of one MTP depth.
struct MtpSaved {
  int32_t *ids, *tg;      // [N] shifted tokens and targets (host)
  const int32_t *ids_d, *tg_d;  // their copies in backend memory
  int64_t n_valid;
  float *e, *en, *e_rstd;  // [N, d] embedding rows, normed, rstd [N]
  float* h_rstd;           // [N*n] rstd of the previous streams (their normed rows are not kept)
  float* ep;               // [N, d] e_proj output
  float* X;                // [N, n, d] block input
  V4LayerSaved layer;
  Head head;
};

}  // namespace

LossParts Model::run_v4(const Batch& b, float grad_scale, bool backward, const StageIO* io) {
  const ModelConfig& c = cfg;
  const V4Config& v = c.v4;
  const int64_t B = b.B, T = b.T, N = B * T, d = c.hidden_size, n = v.hc_mult;
  const int64_t Lm = c.num_hidden_layers, D = v.mtp_layers;
  const PipelineStage& st = stage_;
  const int64_t l0 = st.l0, l1 = stage_end();
  const bool count_stats = !io || io->count;
  // The CSA indexer loss: its gradient factor; the dense warm-up trains only the indexer, so the
  // LM loss's gradients (CE, aux, MTP) are scaled by 0.
  const float ix_grad = (float)(grad_scale * opt.indexer_loss_weight);
  if (opt.dense_warmup()) grad_scale = 0.f;
  acts.reset();
  host_acts_.reset();
  StackArena& A = acts;
  // Context parallel: b is this rank's part of the micro-batch fb (run_cp); the RoPE tables, the
  // target counts and the MTP's shifted tokens are the whole rows'.
  const Batch& fb = cp_full_ ? *cp_full_ : b;
  v4_tables(fb.T);
  const float *rcos[2], *rsin[2];
  v4_device_tables(rcos, rsin);
  // Sequence parallel: this rank's token rows [n0, n0 + Nl); everything else: all N of them.
  // Every per-token array below has Nl rows; the attention sees all N (tp_block_in / out).
  const SeqShard sh = seq_shard_of(N);
  const int64_t Nl = sh.rows, n0 = sh.n0;
  // Parameters, gradients and activations in the backend's memory; the host keeps the batch, the
  // positions, the hash routes and the MTP's shifted tokens (Ctx::host / device move them).
  Env e{c, layout, b, Ctx{prec, &acts, prof, be_, be_->host_addressable() ? nullptr : &host_acts_}, dev_P(),
        backward ? dev_G() : nullptr, dev_Pb(), buffers.data(), rcos, rsin, &load_,
        kern::HcShape{Nl, (int)n, d, (int)v.hc_sinkhorn_iters, (float)v.hc_eps, (float)c.rms_norm_eps},
        opt.aux_loss_alpha, grad_scale, std::vector<int32_t*>(layout.layers.size(), nullptr)};
  e.dispatcher = &moe_dispatcher();
  e.slab_first = ep_.slab_first;
  e.model = this;
  e.sh = sh;
  LossParts out;
  e.ix_loss = opt.indexer_metrics(), e.ix_dense = opt.dense_warmup(), e.ix_grad = ix_grad;
  e.drop_moe = opt.recomputes(kRecomputeMoe);
  e.moe_act = opt.recomputes(kRecomputeMoeAct);
  e.shared_act = opt.recomputes(kRecomputeSharedExperts);
  e.moe_out = opt.recomputes(kRecomputeMoeOut);
  e.up_proj = opt.recomputes(kRecomputeMlaUpProj);
  e.mhc = opt.recomputes(kRecomputeMhc);
  e.ix_sum = &out.indexer, e.ix_recall = &out.indexer_recall;
  e.seg = b.seg ? e.ctx.device(b.seg, N) : nullptr;
  if (cp_full_) {
    e.cp = &cp_attn_;
    e.cp_sum = [this, tp_shard = sh.on()](double* v, size_t k) {
      if (tp_shard) tp_sum(v, (int64_t)k);  // sequence parallel: the tp shards of the cp rank's tokens first
      const double t0 = now_ms();
      cp_.comm->all_reduce(v, k);
      cp_.wait_ms += now_ms() - t0;
    };
  }
  // The router biases in the backend's memory (one copy per step; they change between steps).
  if (!buffers.empty()) e.dbuf = e.ctx.device(buffers.data(), (int64_t)buffers.size());
  const Ctx& cx = e.ctx;
  const float* P = e.P;
  float* G = e.G;

  auto need = [&](int64_t g) {
    if (params_needed) params_needed(g);
  };
  float* X;  // [N, n, d] (pipeline stages after the first: the previous stage's output)
  if (st.first) {
    need(kGradGroupEmbed);
    X = embed_streams(cx, P + layout.embed, b.input_ids + n0, Nl, n, d);
  } else {
    X = A.alloc<float>(Nl * n * d);
    be_->to_device(X, io->x_in, Nl * n * d * sizeof(float));
  }
  hash_routes(e, layout, buffers.data(), b.input_ids + n0);

  int64_t n_valid = 0;  // of the whole micro-batch (the CE is its mean)
  for (int64_t i = 0; i < fb.B * fb.T; ++i) n_valid += fb.targets[i] != -100;
  out.n_valid = st.last ? n_valid : 0;
  double* aux = count_stats ? &out.aux : nullptr;

  // Full recompute: a layer keeps only its input streams; its activations are dropped after the
  // forward and rebuilt by replaying it just before its backward.
  const bool replay = opt.recompute == Recompute::Full;
  auto forward_kept = [&](int64_t l, float* Xin, V4LayerSaved& s) -> float* {
    ProfSpan span(prof, [&] { return layer_region(l, "fwd"); });
    if (!replay) return layer_forward(e, l, Xin, s, aux);
    float* kept = A.alloc<float>(Nl * n * d);
    const auto mk = A.mark();
    cx.k().copy(kept, layer_forward(e, l, Xin, s, aux), Nl * n * d * sizeof(float));
    A.release(mk);
    return kept;
  };
  auto backward_replayed = [&](int64_t l, V4LayerSaved& s, float* dX, const BwdScratch& w) {
    const auto mk = A.mark();
    ProfSpan span(prof, [&] { return layer_region(l, "bwd"); });
    if (replay) {  // its regions are not timed again (bwd.recompute holds them)
      ProfScope ps(prof, "bwd.recompute");
      e.ctx.prof = nullptr;
      layer_forward(e, l, s.X_in, s, nullptr);
      e.ctx.prof = prof;
    }
    if (e.drop_moe) {  // selective "moe"
      ProfScope ps(prof, "bwd.recompute");
      e.ctx.prof = nullptr;
      moe_replay(e, l, s);
      e.ctx.prof = prof;
    }
    layer_backward(e, l, s, dX, w);
    A.release(mk);
  };
  std::vector<V4LayerSaved> sv(Lm);
  for (int64_t l = l0; l < l1; ++l) {
    need(l);
    X = forward_kept(l, X, sv[l]);
  }
  BwdScratch w;
  auto alloc_scratch = [&] {
    w.dX2 = A.alloc<float>(Nl * n * d);
    w.df = A.alloc<float>(Nl * d);
    w.dpost = A.alloc<float>(Nl * n);
    w.dcomb = A.alloc<float>(Nl * n * n);
    w.dnorm = A.alloc<float>(Nl * d);
    w.dy = A.alloc<float>(Nl * d);
    w.hc_work = A.alloc<float>(std::max<size_t>(kern::hc_pre_bwd_workspace_floats(e.hs), 1));
  };
  // The stage's layers backward from dX (the gradient of their output streams), then the
  // embedding (first stage) or the gradient of the previous stage's output.
  auto layers_backward = [&](float* dX) {
    for (int64_t l = l1 - 1; l >= l0; --l) {
      backward_replayed(l, sv[l], dX, w);
      if (grad_ready) grad_ready(l);
    }
    if (!st.first) {
      be_->to_host(io->dx_in, dX, Nl * n * d * sizeof(float));
      if (grad_ready && owns_grad_group(kGradGroupEmbed)) grad_ready(kGradGroupEmbed);  // MTP / tied head
      return;
    }
    embed_backward(cx, G + layout.embed, b.input_ids + n0, dX, Nl, n, d);
    if (grad_ready) grad_ready(kGradGroupEmbed);
  };
  const double indexer_part = opt.indexer_loss_weight * out.indexer;  // the loss's indexer term
  out.loss = out.aux + indexer_part;
  if (!st.last) {  // a pipeline stage before the last: X goes to the next stage, dX comes back
    if (!backward) {
      be_->to_host(io->x_out, X, Nl * n * d * sizeof(float));
      return out;
    }
    alloc_scratch();
    float* dX = A.alloc<float>(Nl * n * d);
    be_->to_device(dX, io->dy, Nl * n * d * sizeof(float));
    layers_backward(dX);
    return out;
  }
  need(kGradGroupHead);
  if (layout.head == layout.embed || D > 0) need(kGradGroupEmbed);  // tied head; MTP reads the embedding
  Head hm{layout.hc_head_fn, layout.hc_head_base, layout.hc_head_scale, layout.final_norm, X};
  const double ce_sum =
      head_forward(e, hm, cx.device(b.targets + n0, Nl), n_valid ? grad_scale / (float)n_valid : 0.f, prec);
  out.ce = n_valid ? ce_sum / (double)n_valid : 0.0;

  // MTP depths.
  std::vector<MtpSaved> ms(D);
  const float* Xprev = X;
  const float w_mtp = (float)opt.mtp_loss_weight;
  for (int64_t k = 0; k < D; ++k) {
    const V4MtpParams& t = layout.mtp[k];
    const int64_t l = Lm + k, shift = k + 1;
    MtpSaved& m = ms[k];
    need(l);
    // Token g of the whole micro-batch fb: its next (shift)-th token and target; n_valid counts
    // the whole micro-batch, the arrays hold this rank's rows [n0, n0 + Nl) (context parallel:
    // local token i is fb's token cp_batch_->flat[i]).
    const int64_t Tw = fb.T;
    auto next = [&](int64_t g, int32_t* id, int32_t* tg) {
      const int64_t ti = g % Tw, j = g + shift;
      const bool ok = ti + shift < Tw && (!fb.seg || fb.seg[j] == fb.seg[g]);
      *id = ok ? fb.input_ids[j] : fb.input_ids[g];
      *tg = ok ? fb.targets[j] : -100;
    };
    m.ids = cx.host_ws().alloc<int32_t>(Nl);
    m.tg = cx.host_ws().alloc<int32_t>(Nl);
    m.n_valid = 0;
    for (int64_t g = 0; g < fb.B * Tw; ++g) {
      int32_t id, tg;
      next(g, &id, &tg);
      m.n_valid += tg != -100;
    }
    for (int64_t i = n0; i < n0 + Nl; ++i) next(cp_batch_ ? cp_batch_->flat[i] : i, &m.ids[i - n0], &m.tg[i - n0]);
    m.ids_d = cx.device(m.ids, Nl), m.tg_d = cx.device(m.tg, Nl);
    const float eps = (float)c.rms_norm_eps;
    m.e = A.alloc<float>(Nl * d);
    cx.k().gather_rows(P + layout.embed, m.ids_d, Nl, d, m.e);
    m.en = A.alloc<float>(Nl * d);
    m.e_rstd = A.alloc<float>(Nl);
    e.ctx.k().rmsnorm_fwd(m.e, Nl, d, P + t.enorm, eps, m.en, m.e_rstd);
    m.h_rstd = A.alloc<float>(Nl * n);
    m.ep = A.alloc<float>(Nl * d);
    linear_fwd(e.ctx, m.en, Nl, d, W{P + t.e_proj, e.Pb ? e.Pb + t.e_proj : nullptr}, d, m.ep);
    m.X = A.alloc<float>(Nl * n * d);
    {  // the normed streams hn are scratch: the backward norms them again
      const auto mk = A.mark();
      float* hn = A.alloc<float>(Nl * n * d);
      e.ctx.k().rmsnorm_fwd(Xprev, Nl * n, d, P + t.hnorm, eps, hn, m.h_rstd);
      linear_fwd(e.ctx, hn, Nl * n, d, W{P + t.h_proj, e.Pb ? e.Pb + t.h_proj : nullptr}, d, m.X);
      A.release(mk);
    }
    {  // X[i, r] += ep[i] for every stream r
      const auto mk = A.mark();
      float* epn = A.alloc<float>(Nl * n * d);
      cx.k().gather_rows(m.ep, stream_rows(cx, nullptr, Nl, n), Nl * n, d, epn);
      cx.k().add(m.X, epn, Nl * n * d);
      A.release(mk);
    }
    float* Xk = forward_kept(l, m.X, m.layer);
    m.head = Head{t.hc_fn, t.hc_base, t.hc_scale, t.norm, Xk};
    const float sc = m.n_valid ? grad_scale * w_mtp / (float)D / (float)m.n_valid : 0.f;
    const double s = head_forward(e, m.head, m.tg_d, sc, prec);
    out.mtp += (m.n_valid ? s / (double)m.n_valid : 0.0) / (double)D;
    Xprev = Xk;
  }
  out.loss = out.ce + out.aux + opt.mtp_loss_weight * out.mtp + indexer_part;
  if (!backward) return out;

  // Backward.
  alloc_scratch();
  float* dX = A.alloc<float>(Nl * n * d);
  float* dprev = D ? A.alloc<float>(Nl * n * d) : nullptr;  // MTP's gradient into the streams below it
  if (dprev) cx.k().zero(dprev, Nl * n * d * sizeof(float));
  for (int64_t k = D - 1; k >= 0; --k) {
    const V4MtpParams& t = layout.mtp[k];
    MtpSaved& m = ms[k];
    head_backward(e, m.head, dX);
    if (dprev) cx.k().add(dX, dprev, Nl * n * d);  // from depth k+1
    backward_replayed(Lm + k, m.layer, dX, w);
    // X = h_proj(hn) + e_proj(en) broadcast over streams; hn normed again (the forward's bits)
    auto mk = A.mark();
    const float* Xp = k ? ms[k - 1].head.X : X;
    float* hn = A.alloc<float>(Nl * n * d);
    e.ctx.k().rmsnorm_fwd(Xp, Nl * n, d, P + t.hnorm, (float)c.rms_norm_eps, hn, A.alloc<float>(Nl * n));
    float* dhn = A.alloc<float>(Nl * n * d);
    linear_bwd(e.ctx, dX, hn, Nl * n, d, W{P + t.h_proj, e.Pb ? e.Pb + t.h_proj : nullptr}, d, dhn, false,
               G + t.h_proj);
    float* dep = A.alloc<float>(Nl * d);  // sum over the streams, in stream order
    cx.k().sum_heads(dX, Nl, n, n * d, d, d, dep, d);
    float* den = A.alloc<float>(Nl * d);
    linear_bwd(e.ctx, dep, m.en, Nl, d, W{P + t.e_proj, e.Pb ? e.Pb + t.e_proj : nullptr}, d, den, false,
               G + t.e_proj);
    float* de = A.alloc<float>(Nl * d);
    e.ctx.k().rmsnorm_bwd(den, m.e, Nl, d, P + t.enorm, m.e_rstd, de, G + t.enorm);
    embed_backward(cx, G + layout.embed, m.ids, de, Nl, 1, d);
    e.ctx.k().rmsnorm_bwd(dhn, Xp, Nl * n, d, P + t.hnorm, m.h_rstd, dprev, G + t.hnorm);
    A.release(mk);
    if (grad_ready) grad_ready(Lm + k);
  }
  head_backward(e, hm, dX);
  if (grad_ready) grad_ready(kGradGroupHead);
  if (dprev) cx.k().add(dX, dprev, Nl * n * d);
  layers_backward(dX);
  return out;
}

void Model::v4_last_logits(const int32_t* ids, int64_t T, float* logits) {
  TREX_CHECK(cfg.is_v4() && T > 0, "v4_last_logits: a DeepSeek-V4 model and T > 0");
  refuse_on_device("DeepSeek-V4's uncached forward of one row (generation's reference)");
  const ModelConfig& c = cfg;
  const V4Config& v = c.v4;
  const int64_t d = c.hidden_size, n = v.hc_mult, V = c.vocab_size;
  for (int64_t i = 0; i < T; ++i)
    TREX_USER_CHECK(ids[i] >= 0 && ids[i] < V, "token ids must be in [0, vocab_size)", "token id ", ids[i],
                    " is outside the vocabulary (", V, ")");
  acts.reset();
  StackArena& A = acts;
  v4_tables(T);
  const Batch b{1, T, ids, nullptr, nullptr, nullptr};
  const float* rcos[2] = {v4_cos_[0].data(), v4_cos_[1].data()};
  const float* rsin[2] = {v4_sin_[0].data(), v4_sin_[1].data()};
  Env e{c, layout, b, Ctx{prec, &acts, prof, be_}, P(), nullptr, Pb(), buffers.data(), rcos, rsin, &load_,
        kern::HcShape{T, (int)n, d, (int)v.hc_sinkhorn_iters, (float)v.hc_eps, (float)c.rms_norm_eps},
        opt.aux_loss_alpha, 0.f, std::vector<int32_t*>(layout.layers.size(), nullptr)};
  e.sh = seq_shard(T, 0, 1);  // one row, every token here (no tensor parallelism)
  e.dispatcher = &moe_dispatcher();
  float* X = embed_streams(e.ctx, P() + layout.embed, ids, T, n, d);
  hash_routes(e, layout, buffers.data(), ids);
  std::vector<V4LayerSaved> sv(c.num_hidden_layers);
  double aux = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) X = layer_forward(e, l, X, sv[l], &aux);
  // Head on the last token only: hc_head collapse, final norm, LM head (bf16 inputs in bf16 mode,
  // as the training loss computes it).
  const kern::HcShape h1{1, (int)n, d, (int)v.hc_sinkhorn_iters, (float)v.hc_eps, (float)c.rms_norm_eps};
  float* y = A.alloc<float>(d);
  float* mix = A.alloc<float>(n);
  float rstd = 0;
  kern::hc_head_fwd(h1, X + (T - 1) * n * d, P() + layout.hc_head_fn, P() + layout.hc_head_base,
                    P() + layout.hc_head_scale, y, mix, &rstd);
  float* hf = A.alloc<float>(d);
  e.ctx.k().rmsnorm_fwd(y, 1, d, P() + layout.final_norm, (float)c.rms_norm_eps, hf, nullptr);
  if (prec == kern::Prec::BF16) {
    bf16* hb = A.alloc<bf16>(d);
    to_bf16(hf, hb, d);
    e.ctx.k().gemm(kern::Prec::BF16, kern::Prec::BF16, false, true, 1, V, d, 1.f, hb, d, Pb() + layout.head, d, 0.f, logits, V);
  } else {
    e.ctx.k().gemm(kern::Prec::F32, kern::Prec::F32, false, true, 1, V, d, 1.f, hf, d, P() + layout.head, d, 0.f, logits, V);
  }
}

void Model::v4_device_tables(const float* cos[2], const float* sin[2]) const {
  const size_t sz = v4_cos_[0].size();
  for (int k = 0; k < 2; ++k) {
    cos[k] = on_device() ? drope_.get() + 2 * k * sz : v4_cos_[k].data();
    sin[k] = on_device() ? drope_.get() + (2 * k + 1) * sz : v4_sin_[k].data();
  }
}

void Model::v4_rope_tables(int64_t T, const float* cos[2], const float* sin[2]) {
  v4_tables(T);
  for (int k = 0; k < 2; ++k) cos[k] = v4_cos_[k].data(), sin[k] = v4_sin_[k].data();
}

void Model::init_mtp_random(uint64_t seed) {
  // HF-style init (hf_init) of the mtp.* tensors only.
  Rng rng(seed);
  for_each_init_target([&](const ParamEntry& en, float* w) { hf_init(en, w, rng, cfg.initializer_range); },
                       [](const std::string& name) { return name.rfind("mtp.", 0) == 0; });
  for (const BufferEntry& bf : layout.buffers)
    if (bf.name.rfind("mtp.", 0) == 0) std::fill(buffers.begin() + bf.offset, buffers.begin() + bf.offset + bf.size, 0.f);
  refresh_bf16();
}

}  // namespace trex::model
