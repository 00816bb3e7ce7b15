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

Decoder::Decoder(Model& m, int64_t max_len, int64_t batch) : m_(m), max_len_(max_len) {
  TREX_USER_CHECK(max_len > 0, "use a positive length", "generation length ", max_len, " must be > 0");
  TREX_USER_CHECK(batch > 0, "use a positive batch", "decoder batch ", batch, " must be > 0");
  const ModelConfig& c = m.cfg;
  seqs_.resize(batch);
  if (c.is_v4()) return;  // the V4 cache grows as tokens come (model/v4_decode.h)
  const int64_t H = c.num_attention_heads;
  for (Seq& sq : seqs_) {
    sq.K.assign(c.num_hidden_layers, std::vector<float>(max_len * H * c.qk_head_dim()));
    sq.V.assign(c.num_hidden_layers, std::vector<float>(max_len * H * c.v_head_dim));
    if (c.is_v32()) sq.IK.assign(c.num_hidden_layers, std::vector<float>(max_len * c.v32.index_head_dim));
  }
}

void Decoder::reset() {
  for (Seq& sq : seqs_) {
    sq.len = 0;
    sq.v4.reset();
  }
}

const std::vector<float>& Decoder::feed(const int32_t* ids, int64_t n) { return feed_batch({{0, ids, n}}); }

const std::vector<float>& Decoder::feed_batch(const std::vector<DecoderPart>& parts) {
  const ModelConfig& c = m_.cfg;
  TREX_CHECK(!parts.empty(), "feed_batch needs at least one part");
  std::vector<char> seen(seqs_.size(), 0);
  for (const DecoderPart& p : parts) {
    TREX_CHECK(p.seq >= 0 && p.seq < batch() && !seen[p.seq], "feed_batch: sequence ", p.seq, " out of range or twice");
    seen[p.seq] = 1;
    TREX_CHECK(p.n > 0, "feed needs at least one token");
    const int64_t len = seqs_[p.seq].len;
    TREX_USER_CHECK(len + p.n <= max_len_, "raise the generation length limit", "prompt + generation of ", len + p.n,
                    " tokens exceeds the decoder's ", max_len_);
  }
  logits_.resize(parts.size() * c.vocab_size);
  if (c.is_v4()) {
    std::vector<V4Feed> f;
    for (const DecoderPart& p : parts) f.push_back({&seqs_[p.seq].v4, p.ids, p.n});
    v4_decode_feed(m_, f, logits_.data());
    for (const DecoderPart& p : parts) seqs_[p.seq].len += p.n;
    return logits_;
  }
  feed_v3(parts, logits_.data());
  return logits_;
}

// Every part's new tokens go through one forward as the rows of one batch: the projections,
// norms, MoE and MLP see all N rows at once; the cache writes, the V3.2 indexer and the attention
// run per part over that part's own sequence; the LM head over each part's last row.
void Decoder::feed_v3(const std::vector<DecoderPart>& parts, float* logits) {
  const ModelConfig& c = m_.cfg;
  const ParamLayout& L = m_.layout;
  const int64_t K = (int64_t)parts.size();
  std::vector<int64_t> off(K + 1, 0);  // part k: rows [off[k], off[k + 1])
  for (int64_t k = 0; k < K; ++k) {
    const DecoderPart& pt = parts[k];
    for (int64_t i = 0; i < pt.n; ++i)
      TREX_USER_CHECK(pt.ids[i] >= 0 && pt.ids[i] < c.vocab_size, "token ids must be in [0, vocab_size)", "token id ",
                      pt.ids[i], " is outside the vocabulary (", c.vocab_size, ")");
    off[k + 1] = off[k] + pt.n;
  }
  const int64_t N = off[K];
  const int64_t d = c.hidden_size, H = c.num_attention_heads, dqk = c.qk_head_dim(), dv = c.v_head_dim;
  StackArena& A = m_.acts;
  A.reset();
  Ctx ctx{m_.prec, &A, nullptr, &m_.backend()};
  ctx.rows_invariant = true;  // a part gets what it gets alone
  const float* P = m_.P();
  const bf16* Pb = m_.Pb();
  const float eps = (float)c.rms_norm_eps;

  const RopeTable& rope = m_.rope_table(max_len_);  // built once for the whole decoder, not per step
  int32_t* pos = A.alloc<int32_t>(N);
  std::vector<int64_t> row_part(N);  // the part each row belongs to
  for (int64_t k = 0; k < K; ++k)
    for (int64_t i = 0; i < parts[k].n; ++i) {
      pos[off[k] + i] = (int32_t)(seqs_[parts[k].seq].len + i);
      row_part[off[k] + i] = k;
    }

  float* x = A.alloc<float>(N * d);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t i = 0; i < parts[k].n; ++i)
      std::memcpy(x + (off[k] + i) * d, P + L.embed + (int64_t)parts[k].ids[i] * d, d * sizeof(float));
  float* h = A.alloc<float>(N * d);
  float* t = A.alloc<float>(N * d);
  float* o = A.alloc<float>(N * H * dv);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerParams& lp = L.layers[l];
    auto mk = A.mark();
    ctx.k().rmsnorm_fwd(x, N, d, P + lp.in_norm, eps, h, nullptr);
    AttnIn ai{&c, &lp, P, Pb, nullptr, &rope, pos, nullptr, 1, N};
    MlaSaved s;
    mla_project(ctx, ai, h, s);
    for (int64_t k = 0; k < K; ++k) {
      Seq& sq = seqs_[parts[k].seq];
      const int64_t n = parts[k].n, r0 = off[k];
      std::memcpy(sq.K[l].data() + sq.len * H * dqk, s.K + r0 * H * dqk, n * H * dqk * sizeof(float));
      std::memcpy(sq.V[l].data() + sq.len * H * dv, s.V + r0 * H * dv, n * H * dv * sizeof(float));
    }
    // DeepSeek-V3.2: the indexer's keys join their cache; each new token's keys are the indexer's
    // top-k of the positions <= its own in its sequence (as the training forward selects them).
    const bool sparse = c.is_v32();
    std::vector<int32_t*> cnt(K, nullptr), sel(K, nullptr);
    std::vector<int64_t> kt(K, 0);
    if (sparse) {
      const int64_t nI = c.v32.index_n_heads, dI = c.v32.index_head_dim;
      for (int64_t k = 0; k < K; ++k) {
        Seq& sq = seqs_[parts[k].seq];
        const int64_t n = parts[k].n, r0 = off[k];
        float* IKc = sq.IK[l].data();
        v32_index_keys(ctx, ai, h + r0 * d, n, pos + r0, IKc + sq.len * dI);
        float* iq = A.alloc<float>(n * nI * dI);
        float* wts = A.alloc<float>(n * nI);
        v32_index_queries(ctx, ai, h + r0 * d, s.qan ? s.qan + r0 * c.q_lora_rank : nullptr, n, pos + r0, iq, wts);
        const kern::IndexerShape ish = v32_index_shape(c, n, sq.len + n);
        kt[k] = ish.topk;
        cnt[k] = A.alloc<int32_t>(n);
        sel[k] = A.alloc<int32_t>(n * kt[k]);
        float* work = A.alloc<float>(std::max<size_t>(kern::indexer_workspace_floats(ish), 1));
        kern::indexer_topk(ish, iq, IKc, wts, pos + r0, cnt[k], sel[k], nullptr, work);
      }
    }
    // Attention of the new tokens over their sequence's cache (causal: token i sees positions
    // <= len + i; V3.2: the selected ones of them).
    const float scale = rope.softmax_scale;
    parallel_dynamic(N * H, [&](int64_t job) {
      const int64_t row = job / H, hh = job % H, k = row_part[row], i = row - off[k];
      const Seq& sq = seqs_[parts[k].seq];
      const float* Kc = sq.K[l].data();
      const float* Vc = sq.V[l].data();
      const int64_t upto = sparse ? cnt[k][i] : sq.len + i + 1;
      auto key = [&](int64_t j) -> int64_t { return sparse ? sel[k][i * kt[k] + j] : j; };
      const float* q = s.Q + (row * H + hh) * dqk;
      std::vector<float> w(upto);
      float mx = -INFINITY;
      for (int64_t j = 0; j < upto; ++j) {
        const float* kk = Kc + (key(j) * H + hh) * dqk;
        float acc = 0;
        for (int64_t e = 0; e < dqk; ++e) acc += q[e] * kk[e];
        w[j] = acc * scale;
        mx = std::max(mx, w[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < upto; ++j) sum += (w[j] = std::exp(w[j] - mx));
      float* out = o + (row * H + hh) * dv;
      std::fill(out, out + dv, 0.f);
      for (int64_t j = 0; j < upto; ++j) {
        const float p = (float)(w[j] / sum);
        const float* v = Vc + (key(j) * H + hh) * dv;
        for (int64_t e = 0; e < dv; ++e) out[e] += p * v[e];
      }
    });
    linear_fwd(ctx, o, N, H * dv, {P + lp.o, Pb ? Pb + lp.o : nullptr}, d, t);
    for (int64_t i = 0; i < N * d; ++i) x[i] += t[i];
    ctx.k().rmsnorm_fwd(x, N, d, P + lp.post_norm, eps, h, nullptr);
    if (c.is_moe_layer(l)) {
      MoeIn mi{&c, &lp, P, Pb, nullptr, lp.bias >= 0 ? m_.buffers.data() + lp.bias : nullptr, 1, N, 0.0, 1.f};
      mi.dispatcher = &m_.moe_dispatcher();
      MoeSaved ms;
      moe_forward(ctx, mi, h, t, ms, nullptr);
    } else {
      MlpW w = mlp_weights(P, Pb, nullptr, lp.mlp_gu, lp.mlp_down, d, c.intermediate_size);
      MlpSaved ms;
      mlp_forward(ctx, w, h, N, t, 0.f, ms);
    }
    for (int64_t i = 0; i < N * d; ++i) x[i] += t[i];
    A.release(mk);
  }
  // Each part's last token: final norm and the LM head, over the K rows together.
  float* last = A.alloc<float>(K * d);
  for (int64_t k = 0; k < K; ++k) std::memcpy(last + k * d, x + (off[k + 1] - 1) * d, d * sizeof(float));
  ctx.k().rmsnorm_fwd(last, K, d, P + L.final_norm, eps, h, nullptr);
  linear_fwd(ctx, h, K, d, {P + L.head, Pb ? Pb + L.head : nullptr}, c.vocab_size, logits);
  for (const DecoderPart& pt : parts) seqs_[pt.seq].len += pt.n;
}

namespace {

// The next token from logits lg [V]: greedy, or temperature / top-p sampling with rng. idx, prob:
// scratch [V]. pos: the position the logits belong to (for the error).
int32_t pick(const float* lg, int64_t V, const SampleParams& sp, Rng& rng, std::vector<int32_t>& idx,
             std::vector<double>& prob, int64_t pos) {
  for (int64_t v = 0; v < V; ++v)
    TREX_USER_CHECK(std::isfinite(lg[v]), "check the checkpoint's weights (values too large overflow); try "
                    "--precision fp32",
                    "generation: the logits at position ", pos, " hold ", lg[v], " (token ", v,
                    "): the model's output is not a number, nothing sensible can be sampled");
  if (sp.temperature == 0.f) return (int32_t)(std::max_element(lg, lg + V) - lg);
  const float mx = *std::max_element(lg, lg + V);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += (prob[v] = std::exp((lg[v] - mx) / sp.temperature));
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
  double keep = 0;
  int64_t k = 0;
  while (k < V && keep < sp.top_p * sum) keep += prob[idx[k++]];
  double u = rng.uniform() * keep;
  int32_t next = idx[k - 1];
  for (int64_t i = 0; i < k; ++i) {
    if ((u -= prob[idx[i]]) <= 0) {
      next = idx[i];
      break;
    }
  }
  return next;
}

}  // namespace

GenerateResult generate(Decoder& dec, const std::vector<int32_t>& prompt, const SampleParams& sp,
                        const std::function<std::string(const std::vector<int32_t>&)>& decode,
                        const std::vector<int32_t>& eos_ids) {
  return generate_batch(dec, {prompt}, sp, {sp.max_tokens}, decode, eos_ids)[0];
}

std::vector<GenerateResult> generate_batch(Decoder& dec, const std::vector<std::vector<int32_t>>& prompts,
                                           const SampleParams& sp, const std::vector<int64_t>& max_tokens,
                                           const std::function<std::string(const std::vector<int32_t>&)>& decode,
                                           const std::vector<int32_t>& eos_ids) {
  const int64_t B = (int64_t)prompts.size();
  TREX_CHECK(B >= 1 && B <= dec.batch() && (int64_t)max_tokens.size() == B, "generate_batch: ", B,
             " prompts for a decoder of ", dec.batch(), " sequences and ", max_tokens.size(), " limits");
  for (const std::vector<int32_t>& p : prompts)
    TREX_USER_CHECK(!p.empty(), "give a non-empty prompt", "generation needs at least one prompt token");
  TREX_USER_CHECK(sp.temperature >= 0 && sp.top_p > 0 && sp.top_p <= 1, "temperature >= 0, 0 < top_p <= 1",
                  "bad sampling parameters: temperature ", sp.temperature, ", top_p ", sp.top_p);
  dec.reset();
  std::vector<Rng> rng(B, Rng(sp.seed));
  std::vector<GenerateResult> r(B);
  std::vector<int32_t> next(B);
  std::vector<DecoderPart> parts;
  for (int64_t k = 0; k < B; ++k) {
    r[k].finish = "length";
    parts.push_back({k, prompts[k].data(), (int64_t)prompts[k].size()});
  }
  std::vector<int32_t> idx;
  std::vector<double> prob;
  std::vector<char> done(B, 0);
  while (!parts.empty()) {
    const std::vector<float>& lg = dec.feed_batch(parts);
    const int64_t V = (int64_t)lg.size() / (int64_t)parts.size();
    idx.resize(V);
    prob.resize(V);
    std::vector<DecoderPart> fed = std::move(parts);
    parts.clear();
    for (size_t j = 0; j < fed.size(); ++j) {
      const int64_t k = fed[j].seq;
      GenerateResult& g = r[k];
      // As one prompt alone: stop at the token limit or a full decoder, at eos, at a stop string.
      if ((int64_t)g.tokens.size() >= max_tokens[k] || dec.len(k) >= dec.max_len()) continue;
      next[k] = pick(lg.data() + j * V, V, sp, rng[k], idx, prob, dec.len(k) - 1);
      if (std::find(eos_ids.begin(), eos_ids.end(), next[k]) != eos_ids.end()) {
        g.finish = "eos";
        continue;
      }
      g.tokens.push_back(next[k]);
      if (!sp.stop.empty()) {
        std::string text = decode(g.tokens);
        bool stopped = false;
        for (const std::string& st : sp.stop) {
          size_t at = text.find(st);
          if (at != std::string::npos) {
            g.text = text.substr(0, at);
            g.finish = "stop";
            done[k] = stopped = true;
            break;
          }
        }
        if (stopped) continue;
      }
      if ((int64_t)g.tokens.size() >= max_tokens[k] || dec.len(k) >= dec.max_len()) continue;
      parts.push_back({k, &next[k], 1});
    }
  }
  for (int64_t k = 0; k < B; ++k)
    if (!done[k]) r[k].text = decode(r[k].tokens);
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
