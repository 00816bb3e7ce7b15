#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/rmsnorm.h"
#include "model/linear.h"
#include "model/mla.h"
#include "model/mlp.h"
#include "model/moe.h"
#include "model/v32_indexer.h"

namespace trex::model {

Decoder::Decoder(Model& m, int64_t max_len) : m_(m), max_len_(max_len) {
  TREX_USER_CHECK(max_len > 0, "use a positive length", "generation length ", max_len, " must be > 0");
  const ModelConfig& c = m.cfg;
  logits_.resize(c.vocab_size);
  if (c.is_v4()) return;  // no KV cache yet: feed() recomputes the whole row (Model::v4_last_logits)
  const int64_t H = c.num_attention_heads;
  K_.assign(c.num_hidden_layers, std::vector<float>(max_len * H * c.qk_head_dim()));
  V_.assign(c.num_hidden_layers, std::vector<float>(max_len * H * c.v_head_dim));
  if (c.is_v32()) IK_.assign(c.num_hidden_layers, std::vector<float>(max_len * c.v32.index_head_dim));
}

const std::vector<float>& Decoder::feed(const int32_t* ids, int64_t n) {
  const ModelConfig& c = m_.cfg;
  const ParamLayout& L = m_.layout;
  TREX_CHECK(n > 0, "feed needs at least one token");
  TREX_USER_CHECK(len_ + n <= max_len_, "raise the generation length limit", "prompt + generation of ", len_ + n,
                  " tokens exceeds the decoder's ", max_len_);
  if (c.is_v4()) {
    ids_.resize(len_);
    ids_.insert(ids_.end(), ids, ids + n);
    m_.v4_last_logits(ids_.data(), len_ + n, logits_.data());
    len_ += n;
    return logits_;
  }
  for (int64_t i = 0; i < n; ++i)
    TREX_USER_CHECK(ids[i] >= 0 && ids[i] < c.vocab_size, "token ids must be in [0, vocab_size)", "token id ", ids[i],
                    " is outside the vocabulary (", c.vocab_size, ")");
  const int64_t d = c.hidden_size, H = c.num_attention_heads, dqk = c.qk_head_dim(), dv = c.v_head_dim;
  StackArena& A = m_.acts;
  A.reset();
  Ctx ctx{m_.prec, &A, nullptr, &m_.backend()};
  const float* P = m_.P();
  const bf16* Pb = m_.Pb();
  const float eps = (float)c.rms_norm_eps;

  const RopeTable& rope = m_.rope_table(len_ + n);
  int32_t* pos = A.alloc<int32_t>(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = (int32_t)(len_ + i);

  float* x = A.alloc<float>(n * d);
  for (int64_t i = 0; i < n; ++i) std::memcpy(x + i * d, P + L.embed + (int64_t)ids[i] * d, d * sizeof(float));
  float* h = A.alloc<float>(n * d);
  float* t = A.alloc<float>(n * d);
  float* o = A.alloc<float>(n * H * dv);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerParams& lp = L.layers[l];
    auto mk = A.mark();
    ctx.k().rmsnorm_fwd(x, n, d, P + lp.in_norm, eps, h, nullptr);
    AttnIn ai{&c, &lp, P, Pb, nullptr, &rope, pos, nullptr, 1, n};
    MlaSaved s;
    mla_project(ctx, ai, h, s);
    float* Kc = K_[l].data();
    float* Vc = V_[l].data();
    std::memcpy(Kc + len_ * H * dqk, s.K, n * H * dqk * sizeof(float));
    std::memcpy(Vc + len_ * H * dv, s.V, n * H * dv * sizeof(float));
    // DeepSeek-V3.2: the indexer's keys join their cache; each new token's keys are the indexer's
    // top-k of the positions <= its own (as the training forward selects them).
    const bool sparse = c.is_v32();
    int32_t* cnt = nullptr;
    int32_t* sel = nullptr;
    int64_t kt = 0;
    if (sparse) {
      const int64_t nI = c.v32.index_n_heads, dI = c.v32.index_head_dim;
      float* IKc = IK_[l].data();
      v32_index_keys(ctx, ai, h, n, pos, IKc + len_ * dI);
      float* iq = A.alloc<float>(n * nI * dI);
      float* wts = A.alloc<float>(n * nI);
      v32_index_queries(ctx, ai, h, s.qan, n, pos, iq, wts);
      const kern::IndexerShape ish = v32_index_shape(c, n, len_ + n);
      kt = ish.topk;
      cnt = A.alloc<int32_t>(n);
      sel = A.alloc<int32_t>(n * kt);
      float* work = A.alloc<float>(std::max<size_t>(kern::indexer_workspace_floats(ish), 1));
      kern::indexer_topk(ish, iq, IKc, wts, pos, cnt, sel, nullptr, work);
    }
    // Attention of the new tokens over the cache (causal: token i sees positions <= len + i; V3.2:
    // the selected ones of them).
    const float scale = rope.softmax_scale;
    parallel_dynamic(n * H, [&](int64_t job) {
      const int64_t i = job / H, hh = job % H, upto = sparse ? cnt[i] : len_ + i + 1;
      auto key = [&](int64_t j) -> int64_t { return sparse ? sel[i * kt + j] : j; };
      const float* q = s.Q + (i * H + hh) * dqk;
      std::vector<float> w(upto);
      float mx = -INFINITY;
      for (int64_t j = 0; j < upto; ++j) {
        const float* k = Kc + (key(j) * H + hh) * dqk;
        float acc = 0;
        for (int64_t e = 0; e < dqk; ++e) acc += q[e] * k[e];
        w[j] = acc * scale;
        mx = std::max(mx, w[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < upto; ++j) sum += (w[j] = std::exp(w[j] - mx));
      float* out = o + (i * H + hh) * dv;
      std::fill(out, out + dv, 0.f);
      for (int64_t j = 0; j < upto; ++j) {
        const float p = (float)(w[j] / sum);
        const float* v = Vc + (key(j) * H + hh) * dv;
        for (int64_t e = 0; e < dv; ++e) out[e] += p * v[e];
      }
    });
    linear_fwd(ctx, o, n, H * dv, {P + lp.o, Pb ? Pb + lp.o : nullptr}, d, t);
    for (int64_t i = 0; i < n * d; ++i) x[i] += t[i];
    ctx.k().rmsnorm_fwd(x, n, d, P + lp.post_norm, eps, h, nullptr);
    if (c.is_moe_layer(l)) {
      MoeIn mi{&c, &lp, P, Pb, nullptr, lp.bias >= 0 ? m_.buffers.data() + lp.bias : nullptr, 1, n, 0.0, 1.f};
      mi.dispatcher = &m_.moe_dispatcher();
      MoeSaved ms;
      moe_forward(ctx, mi, h, t, ms, nullptr);
    } else {
      MlpW w = mlp_weights(P, Pb, nullptr, lp.mlp_gu, lp.mlp_down, d, c.intermediate_size);
      MlpSaved ms;
      mlp_forward(ctx, w, h, n, t, 0.f, ms);
    }
    for (int64_t i = 0; i < n * d; ++i) x[i] += t[i];
    A.release(mk);
  }
  // Last token: final norm and the LM head.
  ctx.k().rmsnorm_fwd(x + (n - 1) * d, 1, d, P + L.final_norm, eps, h, nullptr);
  linear_fwd(ctx, h, 1, d, {P + L.head, Pb ? Pb + L.head : nullptr}, c.vocab_size, logits_.data());
  len_ += n;
  return logits_;
}

GenerateResult generate(Decoder& dec, const std::vector<int32_t>& prompt, const SampleParams& sp,
                        const std::function<std::string(const std::vector<int32_t>&)>& decode,
                        const std::vector<int32_t>& eos_ids) {
  TREX_USER_CHECK(!prompt.empty(), "give a non-empty prompt", "generation needs at least one prompt token");
  TREX_USER_CHECK(sp.temperature >= 0 && sp.top_p > 0 && sp.top_p <= 1, "temperature >= 0, 0 < top_p <= 1",
                  "bad sampling parameters: temperature ", sp.temperature, ", top_p ", sp.top_p);
  dec.reset();
  Rng rng(sp.seed);
  GenerateResult r;
  r.finish = "length";
  const std::vector<float>* logits = &dec.feed(prompt.data(), prompt.size());
  const int64_t V = logits->size();
  std::vector<int32_t> idx(V);
  std::vector<double> prob(V);
  for (int64_t s = 0; s < sp.max_tokens && dec.len() < dec.max_len(); ++s) {
    const std::vector<float>& lg = *logits;
    for (int64_t v = 0; v < V; ++v)
      TREX_USER_CHECK(std::isfinite(lg[v]), "check the checkpoint's weights (values too large overflow); try "
                      "--precision fp32",
                      "generation: the logits at position ", dec.len() - 1, " hold ", lg[v], " (token ", v,
                      "): the model's output is not a number, nothing sensible can be sampled");
    int32_t next = 0;
    if (sp.temperature == 0.f) {
      next = (int32_t)(std::max_element(lg.begin(), lg.end()) - lg.begin());
    } else {
      const float mx = *std::max_element(lg.begin(), lg.end());
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += (prob[v] = std::exp((lg[v] - mx) / sp.temperature));
      std::iota(idx.begin(), idx.end(), 0);
      std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
      double keep = 0;
      int64_t k = 0;
      while (k < V && keep < sp.top_p * sum) keep += prob[idx[k++]];
      double u = rng.uniform() * keep;
      next = idx[k - 1];
      for (int64_t i = 0; i < k; ++i) {
        if ((u -= prob[idx[i]]) <= 0) {
          next = idx[i];
          break;
        }
      }
    }
    if (std::find(eos_ids.begin(), eos_ids.end(), next) != eos_ids.end()) {
      r.finish = "eos";
      break;
    }
    r.tokens.push_back(next);
    if (!sp.stop.empty()) {
      std::string text = decode(r.tokens);
      for (const std::string& st : sp.stop) {
        size_t at = text.find(st);
        if (at != std::string::npos) {
          r.text = text.substr(0, at);
          r.finish = "stop";
          return r;
        }
      }
    }
    if (dec.len() >= dec.max_len()) break;
    logits = &dec.feed(&next, 1);
  }
  r.text = decode(r.tokens);
  return r;
}

int64_t generation_budget(const ModelConfig& c, int64_t prompt_len, int64_t max_tokens, bool* capped) {
  TREX_USER_CHECK(max_tokens >= 1, "use --max-tokens >= 1", "--max-tokens ", max_tokens, " must be >= 1");
  const int64_t limit = c.max_position_embeddings;
  TREX_USER_CHECK(prompt_len < limit, "shorten the prompt", "the prompt has ", prompt_len,
                  " tokens; the model's max_position_embeddings is ", limit, ", which leaves no room to generate");
  *capped = prompt_len + max_tokens > limit;
  return *capped ? limit - prompt_len : max_tokens;
}

}  // namespace trex::model
