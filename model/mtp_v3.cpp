#include "model/mtp_v3.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "kernels/lm_head_ce.h"

namespace trex::model {

namespace {

W weight(const MtpV3In& in, int64_t off) { return W{in.P + off, in.Pb ? in.Pb + off : nullptr}; }

}  // namespace

int64_t v3_layer_of(const std::string& name) {
  const std::string pre = "model.layers.";
  if (name.rfind(pre, 0) != 0) return -1;
  const char* p = name.c_str() + pre.size();
  char* end = nullptr;
  const long long l = std::strtoll(p, &end, 10);
  return end != p && *end == '.' ? (int64_t)l : -1;
}

bool v3_mtp_embed_alias(const std::string& name, int64_t num_hidden_layers) {
  const int64_t l = v3_layer_of(name);
  return l >= num_hidden_layers && name == "model.layers." + std::to_string(l) + ".embed_tokens.weight";
}

double mtp_v3_forward(const MtpV3In& in, const float* h0, std::vector<MtpV3Saved>& s, const MtpLayerFwd& layer) {
  const ModelConfig& c = *in.cfg;
  const ParamLayout& L = *in.layout;
  const Batch& b = *in.b;
  const int64_t D = c.v3_mtp_layers, T = b.T, N = b.B * b.T, Nl = in.Nl, n0 = in.n0;
  const int64_t d = c.hidden_size, V = c.vocab_size;
  const float eps = (float)c.rms_norm_eps;
  StackArena& A = *in.ctx.ws;
  s.assign(D, MtpV3Saved{});
  double mtp = 0;
  const float* h_prev = h0;
  for (int64_t k = 0; k < D; ++k) {
    const V3MtpParams& t = L.mtp3[k];
    const int64_t l = c.num_hidden_layers + k, shift = k + 1;
    MtpV3Saved& m = s[k];
    // Token i's (shift)-th next token and its target (none past the row or the document), made on
    // the host and sent to the backend.
    StackArena& H = in.ctx.host_ws();
    int32_t* ids = H.alloc<int32_t>(Nl);
    int32_t* tgs = H.alloc<int32_t>(Nl);
    m.n_valid = 0;
    auto shifted = [&](int64_t i, int32_t& id, int32_t& tg) {
      const int64_t ti = i % T, j = i + shift;
      const bool ok = ti + shift < T && (!b.seg || b.seg[j] == b.seg[i]);
      id = ok ? b.input_ids[j] : b.input_ids[i], tg = ok ? b.targets[j] : -100;
    };
    for (int64_t i = 0; i < N; ++i) {
      int32_t id, tg;
      shifted(i, id, tg);
      m.n_valid += tg != -100;
      if (!in.flat && i >= n0 && i < n0 + Nl) ids[i - n0] = id, tgs[i - n0] = tg;
    }
    if (in.flat)
      for (int64_t i = 0; i < Nl; ++i) shifted(in.flat[n0 + i], ids[i], tgs[i]);
    m.ids = in.ctx.device(ids, Nl);
    m.tg = in.ctx.device(tgs, Nl);
    // x = eh_proj([enorm(e) | hnorm(h_prev)])   e, h_prev: [Nl, d]  cat: [Nl, 2d]  x: [Nl, d]
    m.e = A.alloc<float>(Nl * d);
    in.ctx.k().gather_rows(in.P + L.embed, m.ids, Nl, d, m.e);
    float* en = A.alloc<float>(Nl * d);
    float* hn = A.alloc<float>(Nl * d);
    m.e_rstd = A.alloc<float>(Nl);
    m.h_rstd = A.alloc<float>(Nl);
    m.h_prev = h_prev;
    in.ctx.k().rmsnorm_fwd(m.e, Nl, d, in.P + t.enorm, eps, en, m.e_rstd);
    in.ctx.k().rmsnorm_fwd(h_prev, Nl, d, in.P + t.hnorm, eps, hn, m.h_rstd);
    m.cat = A.alloc<float>(Nl * 2 * d);
    const int64_t f = sizeof(float);
    in.ctx.k().copy_rows(m.cat, 2 * d * f, en, d * f, d * f, Nl);
    in.ctx.k().copy_rows(m.cat + d, 2 * d * f, hn, d * f, d * f, Nl);
    float* x = A.alloc<float>(Nl * d);
    linear_fwd(in.ctx, m.cat, Nl, 2 * d, weight(in, t.eh_proj), d, x);
    m.h = layer(l, x);
    // shared_head: norm, then the head fused with the CE (and its gradients when training).
    m.rstdf = A.alloc<float>(Nl);
    m.dhf = in.backward ? A.alloc<float>(Nl * d) : nullptr;
    // The normed rows, their bf16 copy and the head's workspace: released once the head has run.
    const auto head_mark = A.mark();
    float* hf = A.alloc<float>(Nl * d);
    in.ctx.k().rmsnorm_fwd(m.h, Nl, d, in.P + t.head_norm, eps, hf, m.rstdf);
    kern::CeArgs ce{};
    ce.prec = in.ctx.prec;
    ce.N = Nl, ce.d = d, ce.V = V;
    ce.h = hf;
    ce.W = in.P + t.head;
    if (in.ctx.prec == kern::Prec::BF16) {
      bf16* hb = A.alloc<bf16>(Nl * d);
      in.ctx.k().to_bf16(hf, d, Nl, d, hb);
      ce.h_b = hb;
      ce.W_b = in.Pb + t.head;
    }
    ce.labels = m.tg;
    ce.grad_scale = m.n_valid ? in.grad_scale * (float)in.weight / (float)D / (float)m.n_valid : 0.f;
    ce.dh = m.dhf;
    ce.dW = in.backward ? in.G + t.head : nullptr;
    ce.workspace = A.alloc<float>(kern::lm_head_ce_workspace_floats(ce));
    double sum;
    {
      ProfScope ps(in.ctx.prof, in.backward ? "mtp.head_ce.fwd+bwd" : "mtp.head_ce.fwd");
      sum = in.ctx.k().lm_head_ce(ce, nullptr);
    }
    A.release(head_mark);
    mtp += (m.n_valid ? sum / (double)m.n_valid : 0.0) / (double)D;
    h_prev = m.h;
  }
  return mtp;
}

void mtp_v3_backward(const MtpV3In& in, std::vector<MtpV3Saved>& s, const MtpLayerBwd& layer, float* dh0,
                     const std::function<void(int64_t)>& grad_ready) {
  const ModelConfig& c = *in.cfg;
  const ParamLayout& L = *in.layout;
  const int64_t D = (int64_t)s.size(), Nl = in.Nl, d = c.hidden_size;
  StackArena& A = *in.ctx.ws;
  float* dh = A.alloc<float>(Nl * d);                 // gradient of h_k
  float* dprev = A.alloc<float>(Nl * d);              // gradient of h_k from depth k + 1
  in.ctx.k().zero(dprev, Nl * d * sizeof(float));
  const int64_t f = sizeof(float);
  for (int64_t k = D - 1; k >= 0; --k) {
    const V3MtpParams& t = L.mtp3[k];
    MtpV3Saved& m = s[k];
    const auto mk = A.mark();
    in.ctx.k().rmsnorm_bwd(m.dhf, m.h, Nl, d, in.P + t.head_norm, m.rstdf, dh, in.G + t.head_norm);
    in.ctx.k().add(dh, dprev, Nl * d);
    layer(c.num_hidden_layers + k, dh);  // dh: now the gradient of x
    float* dcat = A.alloc<float>(Nl * 2 * d);
    linear_bwd(in.ctx, dh, m.cat, Nl, 2 * d, weight(in, t.eh_proj), d, dcat, false, in.G + t.eh_proj);
    float* den = A.alloc<float>(Nl * d);
    float* dhn = A.alloc<float>(Nl * d);
    in.ctx.k().copy_rows(den, d * f, dcat, 2 * d * f, d * f, Nl);
    in.ctx.k().copy_rows(dhn, d * f, dcat + d, 2 * d * f, d * f, Nl);
    float* de = A.alloc<float>(Nl * d);
    in.ctx.k().rmsnorm_bwd(den, m.e, Nl, d, in.P + t.enorm, m.e_rstd, de, in.G + t.enorm);
    in.ctx.k().scatter_add_rows(de, m.ids, Nl, d, in.G + L.embed);  // in row order
    in.ctx.k().rmsnorm_bwd(dhn, m.h_prev, Nl, d, in.P + t.hnorm, m.h_rstd, dprev, in.G + t.hnorm);
    A.release(mk);
    if (grad_ready) grad_ready(c.num_hidden_layers + k);
  }
  in.ctx.k().add(dh0, dprev, Nl * d);
}

void init_mtp_v3_random(Model& m, uint64_t seed) {
  const int64_t Lm = m.cfg.num_hidden_layers;
  auto is_mtp = [Lm](const std::string& n) { return v3_layer_of(n) >= Lm; };
  Rng rng(seed);
  const float r = (float)m.cfg.initializer_range;
  m.for_each_init_target(
      [&](const ParamEntry& e, float* w) {
        const int64_t n = e.shape.numel();
        for (int64_t i = 0; i < n; ++i) w[i] = e.shape.ndim == 1 ? 1.f : (float)(rng.normal() * r);
      },
      is_mtp);
  const ParamLayout& L = m.layout;
  for (const V3MtpParams& t : L.mtp3)
    if (t.head >= 0 && L.head >= 0 && t.head != L.head)  // (tied: the same tensor)
      std::memcpy(m.P() + t.head, m.P() + L.head, m.cfg.vocab_size * m.cfg.hidden_size * 4);
  for (const BufferEntry& bf : L.buffers)
    if (is_mtp(bf.name)) std::fill(m.buffers.begin() + bf.offset, m.buffers.begin() + bf.offset + bf.size, 0.f);
  m.refresh_bf16();
}

}  // namespace trex::model
