// Generation with a KV cache against the training forward: the log-likelihood of a sequence
// computed token by token (and with a prefilled chunk) through the cache equals the training
// path's loss; greedy generation is deterministic and respects eos, stop strings and limits.
// DeepSeek-V3 / V3.2 batched decoding (several sequences' new tokens through one forward, at
// different lengths, some idle in a step) equals decoding each alone (logits 1e-5 relative), and
// generate_batch gives each prompt what generate() gives it alone, greedy and sampled.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include "core/parallel.h"
#include "core/rng.h"
#include "model/generate.h"
#include "tests/unit/forwarding_backend.h"

using namespace trex;
using namespace trex::model;

namespace {

ModelConfig config(bool yarn, bool v32 = false) {
  nlohmann::json j = {{"vocab_size", 41}, {"hidden_size", 30}, {"num_hidden_layers", 3}, {"num_attention_heads", 3},
                      {"q_lora_rank", 14}, {"kv_lora_rank", 10}, {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4},
                      {"v_head_dim", 5}, {"intermediate_size", 34}, {"moe_intermediate_size", 9},
                      {"n_routed_experts", 6}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2},
                      {"first_k_dense_replace", 1}, {"n_group", 2}, {"topk_group", 1}, {"initializer_range", 0.3},
                      {"max_position_embeddings", 8}};
  if (yarn)
    j["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 4},
                         {"mscale_all_dim", 1.0}};
  if (v32) {  // DeepSeek-V3.2: 4 of up to 13 keys per query, picked by the indexer
    j.update({{"model_type", "deepseek_v32"}, {"num_key_value_heads", 3}, {"index_n_heads", 5},
              {"index_head_dim", 7}, {"index_topk", 4}, {"max_position_embeddings", 16}});
    if (yarn) j["rope_scaling"]["mscale"] = 0.7;  // an attention factor != 1 on the indexer's rope dims too
  }
  return parse_config(j, "generate test config");
}

double log_softmax_at(const std::vector<float>& lg, int32_t t) {
  double mx = *std::max_element(lg.begin(), lg.end()), s = 0;
  for (float v : lg) s += std::exp(v - mx);
  return lg[t] - mx - std::log(s);
}

TEST(Generate, CachedDecodingMatchesTheTrainingForward) {
  init_threads();
  for (int variant = 0; variant < 4; ++variant) {
    const bool yarn = variant % 2, v32 = variant >= 2;
    Model m(config(yarn, v32), kern::Prec::F32);
    m.init_random(21);
    Rng r(4);
    const int64_t T = 13;
    std::vector<int32_t> ids(T), tg(T, -100);
    for (auto& v : ids) v = r.next_u64() % 41;
    for (int64_t i = 0; i + 1 < T; ++i) tg[i] = ids[i + 1];
    const double ref = m.forward({1, T, ids.data(), tg.data(), nullptr, nullptr}).ce * (T - 1);
    for (int64_t prefill : {1, 5}) {
      Decoder dec(m, T);
      double nll = -log_softmax_at(dec.feed(ids.data(), prefill), ids[prefill]);
      for (int64_t i = prefill; i + 1 < T; ++i) nll -= log_softmax_at(dec.feed(&ids[i], 1), ids[i + 1]);
      // the prefill chunk's inner positions are scored by re-running them one by one
      Decoder one(m, T);
      for (int64_t i = 0; i + 1 < prefill; ++i) nll -= log_softmax_at(one.feed(&ids[i], 1), ids[i + 1]);
      EXPECT_NEAR(nll, ref, 1e-4 * ref) << "prefill " << prefill << " yarn " << yarn << " v32 " << v32;
    }
  }
}

TEST(Generate, GreedyIsDeterministicAndStops) {
  Model m(config(false), kern::Prec::F32);
  m.init_random(8);
  auto decode = [](const std::vector<int32_t>& t) {
    std::string s;
    for (int32_t v : t) s += (char)('a' + v % 26);
    return s;
  };
  Decoder dec(m, 64);
  SampleParams sp;
  sp.max_tokens = 10;
  GenerateResult a = generate(dec, {1, 2, 3}, sp, decode, {});
  GenerateResult b = generate(dec, {1, 2, 3}, sp, decode, {});
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens.size(), 10u);
  EXPECT_EQ(a.finish, "length");
  GenerateResult e = generate(dec, {1, 2, 3}, sp, decode, {a.tokens[2]});
  EXPECT_EQ(e.finish, "eos");
  EXPECT_LE(e.tokens.size(), 2u);
  sp.stop = {decode({a.tokens[4]})};
  GenerateResult s = generate(dec, {1, 2, 3}, sp, decode, {});
  EXPECT_EQ(s.finish, "stop");
  sp.stop.clear();
  sp.temperature = 0.8f;
  sp.top_p = 0.9f;
  sp.seed = 3;
  GenerateResult t1 = generate(dec, {1, 2, 3}, sp, decode, {}), t2 = generate(dec, {1, 2, 3}, sp, decode, {});
  EXPECT_EQ(t1.tokens, t2.tokens);  // same seed, same sample
  Decoder small(m, 4);
  EXPECT_THROW(small.feed(std::vector<int32_t>(5, 1).data(), 5), UserError);
}

}  // namespace

namespace {

std::vector<int32_t> some_tokens(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = (int32_t)(r.next_u64() % 41);
  return v;
}
// max |a - b| / max |b|
double rel_diff(const float* a, const float* b, int64_t V) {
  double num = 0, den = 0;
  for (int64_t v = 0; v < V; ++v) {
    num = std::max(num, (double)std::abs(a[v] - b[v]));
    den = std::max(den, (double)std::abs(b[v]));
  }
  return num / std::max(den, 1e-30);
}

// The CPU backend, counting the RMSNorm calls: one forward makes the same number whatever the
// number of sequences it carries.
class CountNorms final : public trex::testing::ForwardingBackend {
 public:
  int norms = 0;
  const char* name() const override { return "count-norms"; }
  std::string describe() const override { return "cpu, counting rmsnorm_fwd calls"; }
  bool host_addressable() const override { return true; }
  void rmsnorm_fwd(const float* x, int64_t N, int64_t d, const float* w, float eps, float* y, float* r) override {
    ++norms;
    ForwardingBackend::rmsnorm_fwd(x, N, d, w, eps, y, r);
  }
};

}  // namespace

TEST(Generate, BatchedFeedEqualsOneAtATime) {
  init_threads();
  for (const bool v32 : {false, true}) {
    Model m(config(false, v32), kern::Prec::F32);
    m.init_random(33);
    // The batched decoder's own copy of the model, on a backend that counts its norms.
    CountNorms counter;
    Model mb(config(false, v32), kern::Prec::F32);
    mb.init_random(33);
    mb.use_backend(counter);
    int one_forward = -1;  // the norms of a feed of one sequence
    {
      Decoder probe(mb, 4);
      const std::vector<int32_t> t = some_tokens(2, 9);
      counter.norms = 0;
      probe.feed(t.data(), 2);
      one_forward = counter.norms;
    }
    const int64_t V = m.cfg.vocab_size, B = 3, T = 30;
    std::vector<std::vector<int32_t>> ids;
    for (int64_t b = 0; b < B; ++b) ids.push_back(some_tokens(T, 70 + b));
    Decoder batch(mb, T, B);
    std::vector<Decoder> alone;
    alone.reserve(B);
    for (int64_t b = 0; b < B; ++b) alone.emplace_back(m, T);
    // step s: sequence b feeds chunk[b][s] tokens (0: idle)
    const std::vector<std::vector<int64_t>> chunk = {{4, 1, 0, 1, 3, 1, 1, 0, 1}, {11, 0, 1, 1, 1, 2, 0, 1, 1},
                                                     {1, 1, 1, 5, 0, 1, 7, 1, 1}};
    std::vector<int64_t> at(B, 0);
    for (size_t st = 0; st < chunk[0].size(); ++st) {
      std::vector<DecoderPart> parts;
      for (int64_t b = B - 1; b >= 0; --b)  // not in sequence order
        if (chunk[b][st]) parts.push_back({b, ids[b].data() + at[b], chunk[b][st]});
      counter.norms = 0;
      const std::vector<float> got = batch.feed_batch(parts);
      ASSERT_EQ((int64_t)got.size(), (int64_t)parts.size() * V);
      // One forward for all the parts (V3.2's indexer norms its keys per sequence).
      if (!v32) {
        EXPECT_EQ(counter.norms, one_forward) << "step " << st << ": " << parts.size() << " sequences";
      }
      for (size_t k = 0; k < parts.size(); ++k) {
        const int64_t b = parts[k].seq;
        const std::vector<float>& one = alone[b].feed(ids[b].data() + at[b], chunk[b][st]);
        at[b] += chunk[b][st];
        // Bit for bit (model::Ctx::rows_invariant): not within a bound.
        EXPECT_EQ(0, std::memcmp(got.data() + k * V, one.data(), V * sizeof(float)))
            << "v32 " << v32 << " step " << st << " sequence " << b << ": relative difference "
            << rel_diff(got.data() + k * V, one.data(), V);
        EXPECT_EQ(batch.len(b), at[b]);
      }
    }
  }
}

TEST(Generate, GenerateBatchEqualsGenerate) {
  init_threads();
  auto decode = [](const std::vector<int32_t>& t) {
    std::string s;
    for (int32_t v : t) s += (char)('a' + v % 26);
    return s;
  };
  for (const bool v32 : {false, true}) {
    Model m(config(false, v32), kern::Prec::F32);
    m.init_random(5);
    const std::vector<std::vector<int32_t>> prompts = {some_tokens(9, 1), some_tokens(2, 2), some_tokens(7, 3),
                                                       some_tokens(5, 4)};
    const std::vector<int64_t> limits = {12, 20, 3, 9};
    for (float temp : {0.f, 0.8f}) {
      SampleParams sp;
      sp.temperature = temp;
      sp.top_p = 0.9f;
      sp.seed = 11;
      sp.stop = {"q"};
      const std::vector<int32_t> eos = {7};
      Decoder dec(m, 40, 4);
      const std::vector<GenerateResult> got = generate_batch(dec, prompts, sp, limits, decode, eos);
      for (size_t k = 0; k < prompts.size(); ++k) {
        SampleParams one = sp;
        one.max_tokens = limits[k];
        Decoder d1(m, 40);
        const GenerateResult r = generate(d1, prompts[k], one, decode, eos);
        EXPECT_EQ(got[k].tokens, r.tokens) << "v32 " << v32 << " prompt " << k << " temperature " << temp;
        EXPECT_EQ(got[k].text, r.text);
        EXPECT_EQ(got[k].finish, r.finish);
      }
    }
  }
}

