// Cached decoding (model/v4_decode.h, model/generate.h) against the full recompute: at every step,
// for prompts fed in chunks of odd sizes and then one token at a time, the logits equal those of
// the whole row's forward (DeepSeek-V4: Model::v4_last_logits, the training layers; V3.2: a fresh
// decoder fed the whole row at once), fp32, 1e-5 relative. V4 configs cover every attention kind
// and odd compress rates and windows; lengths are multiples of no rate but 1. Batched decoding (several
// sequences per feed, at different lengths) equals decoding each alone bit for bit, and generate_batch equals
// generate() per prompt, greedy and sampled. (Under TREX_ISA=ref the cached logits are
// bit-identical to the recompute; the vector kernels' blocking leaves up to 5e-6.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include "core/parallel.h"
#include "core/rng.h"
#include "model/generate.h"
#include "model/model.h"
#include "tests/tiny_configs.h"

using namespace trex;
using nlohmann::json;

namespace {

// max |a - b| / max |b| over the logits.
double rel_diff(const float* a, const float* b, int64_t V) {
  double num = 0, den = 0;
  for (int64_t v = 0; v < V; ++v) {
    num = std::max(num, (double)std::abs(a[v] - b[v]));
    den = std::max(den, (double)std::abs(b[v]));
  }
  return num / std::max(den, 1e-30);
}

std::vector<json> v4_configs() {
  std::vector<json> out;
  out.push_back(trex::testing::tiny_v4());  // CSA 3, HCA 7, sliding; window 5; YaRN
  json j = trex::testing::tiny_v4();        // CSA 5, HCA 3, window 7, top-3, one stream, 5 layers
  j["num_hidden_layers"] = 5;
  j["compress_rates"] = {{"compressed_sparse_attention", 5}, {"heavily_compressed_attention", 3}};
  j["layer_types"] = {"heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention",
                      "compressed_sparse_attention", "heavily_compressed_attention"};
  j["mlp_layer_types"] = {"hash_moe", "moe", "moe", "hash_moe", "moe"};
  j["sliding_window"] = 7;
  j["index_topk"] = 3;
  j["hc_mult"] = 1;
  j.erase("rope_parameters");
  out.push_back(j);
  json k = trex::testing::tiny_v4();  // rates 2 and 1, window 1 (only the token itself), top-1
  k["compress_rates"] = {{"compressed_sparse_attention", 2}, {"heavily_compressed_attention", 1}};
  k["sliding_window"] = 1;
  k["index_topk"] = 1;
  k["hc_mult"] = 2;
  out.push_back(k);
  return out;
}

std::vector<int32_t> tokens(int64_t T, int64_t V, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> ids(T);
  for (auto& v : ids) v = (int32_t)(r.next_u64() % V);
  return ids;
}

// Chunks of odd sizes, then single tokens, up to T.
std::vector<int64_t> schedule(int64_t T) {
  std::vector<int64_t> s;
  int64_t at = 0;
  for (int64_t c : {5, 1, 3, 7, 1, 1, 9}) {
    if (at + c > T) break;
    s.push_back(c);
    at += c;
  }
  for (; at < T; ++at) s.push_back(1);
  return s;
}

std::unique_ptr<model::Model> make_v4(const json& j, kern::Prec prec, uint64_t seed) {
  auto m = std::make_unique<model::Model>(model::parse_config(j, "v4 decode test config"), prec);
  m->init_random(seed);
  trex::testing::perturb_vectors(*m, seed + 1);
  return m;
}

TEST(V4Decode, CachedLogitsEqualFullRecomputeAtEveryStep) {
  init_threads();
  int cfg_i = 0;
  for (const json& j : v4_configs()) {
    auto mp = make_v4(j, kern::Prec::F32, 30 + cfg_i);
    model::Model& m = *mp;
    const int64_t T = 41, V = m.cfg.vocab_size;
    const std::vector<int32_t> ids = tokens(T, V, 50 + cfg_i);
    model::Decoder dec(m, T);
    std::vector<float> ref(V);
    int64_t at = 0;
    double worst = 0;
    for (int64_t n : schedule(T)) {
      const std::vector<float> got = dec.feed(ids.data() + at, n);
      at += n;
      m.v4_last_logits(ids.data(), at, ref.data());
      const double e = rel_diff(got.data(), ref.data(), V);
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-5) << "config " << cfg_i << " at " << at << " tokens (chunk " << n << ")";
    }
    EXPECT_EQ(dec.len(), T);
    std::printf("[v4 decode] config %d: worst relative logit difference %.2e over %lld tokens\n", cfg_i, worst,
                (long long)T);
    ++cfg_i;
  }
}

// bf16: the cached path rounds where the training forward rounds (the matmul inputs); the sums
// of differently sized matmuls may differ in the last bits, so a looser bound.
TEST(V4Decode, CachedLogitsCloseInBf16) {
  init_threads();
  const json j = trex::testing::tiny_v4();
  auto mp = make_v4(j, kern::Prec::BF16, 3);
    model::Model& m = *mp;
  const int64_t T = 23, V = m.cfg.vocab_size;
  const std::vector<int32_t> ids = tokens(T, V, 4);
  model::Decoder dec(m, T);
  std::vector<float> ref(V);
  int64_t at = 0;
  for (int64_t n : schedule(T)) {
    const std::vector<float> got = dec.feed(ids.data() + at, n);
    at += n;
    m.v4_last_logits(ids.data(), at, ref.data());
    EXPECT_LE(rel_diff(got.data(), ref.data(), V), 2e-2) << "at " << at;
  }
}

// Several sequences in one feed, at different lengths and chunk sizes, some idle in a step: each
// sequence's logits equal those of its own decoder.
TEST(V4Decode, BatchedFeedEqualsOneAtATime) {
  init_threads();
  int cfg_i = 0;
  for (const json& j : v4_configs()) {
    auto mp = make_v4(j, kern::Prec::F32, 60 + cfg_i);
    model::Model& m = *mp;
    const int64_t V = m.cfg.vocab_size, B = 3, T = 30;
    std::vector<std::vector<int32_t>> ids;
    for (int64_t b = 0; b < B; ++b) ids.push_back(tokens(T, V, 70 + b));
    model::Decoder batch(m, T, B);
    std::vector<model::Decoder> alone;
    alone.reserve(B);
    for (int64_t b = 0; b < B; ++b) alone.emplace_back(m, T);
    // step s: sequence b feeds chunk[b][s] tokens (0: idle)
    const std::vector<std::vector<int64_t>> chunk = {{4, 1, 0, 1, 3, 1, 1, 0, 1}, {11, 0, 1, 1, 1, 2, 0, 1, 1},
                                                     {1, 1, 1, 5, 0, 1, 7, 1, 1}};
    std::vector<int64_t> at(B, 0);
    for (size_t s = 0; s < chunk[0].size(); ++s) {
      std::vector<model::DecoderPart> parts;
      for (int64_t b = B - 1; b >= 0; --b)  // not in sequence order
        if (chunk[b][s]) parts.push_back({b, ids[b].data() + at[b], chunk[b][s]});
      const std::vector<float> got = batch.feed_batch(parts);
      for (size_t k = 0; k < parts.size(); ++k) {
        const int64_t b = parts[k].seq;
        const std::vector<float>& one = alone[b].feed(ids[b].data() + at[b], chunk[b][s]);
        at[b] += chunk[b][s];
        // Bit for bit (model::Ctx::rows_invariant): not within a bound.
        EXPECT_EQ(0, std::memcmp(got.data() + k * V, one.data(), V * sizeof(float)))
            << "config " << cfg_i << " step " << s << " sequence " << b << ": relative difference "
            << rel_diff(got.data() + k * V, one.data(), V);
        EXPECT_EQ(batch.len(b), at[b]);
      }
    }
    ++cfg_i;
  }
}

TEST(V4Decode, GenerateBatchEqualsGenerate) {
  init_threads();
  auto mp = make_v4(trex::testing::tiny_v4(), kern::Prec::F32, 5);
    model::Model& m = *mp;
  const int64_t V = m.cfg.vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {tokens(9, V, 1), tokens(2, V, 2), tokens(17, V, 3),
                                                     tokens(5, V, 4)};
  const std::vector<int64_t> limits = {12, 20, 3, 9};
  auto decode = [](const std::vector<int32_t>& t) {
    std::string s;
    for (int32_t v : t) s += (char)('a' + v % 26);
    return s;
  };
  for (float temp : {0.f, 0.8f}) {
    model::SampleParams sp;
    sp.temperature = temp;
    sp.top_p = 0.9f;
    sp.seed = 11;
    sp.stop = {"q"};
    const std::vector<int32_t> eos = {7};
    model::Decoder dec(m, 40, 4);
    const std::vector<model::GenerateResult> got = model::generate_batch(dec, prompts, sp, limits, decode, eos);
    for (size_t k = 0; k < prompts.size(); ++k) {
      model::SampleParams one = sp;
      one.max_tokens = limits[k];
      model::Decoder d1(m, 40);
      const model::GenerateResult r = model::generate(d1, prompts[k], one, decode, eos);
      EXPECT_EQ(got[k].tokens, r.tokens) << "prompt " << k << " temperature " << temp;
      EXPECT_EQ(got[k].text, r.text);
      EXPECT_EQ(got[k].finish, r.finish);
    }
  }
}

// DeepSeek-V3.2 (MLA + the indexer's cached keys): every cached step's logits equal a fresh
// decoder's fed the whole row at once.
TEST(V4Decode, V32CachedLogitsEqualFullRecomputeAtEveryStep) {
  init_threads();
  json j = {{"model_type", "deepseek_v32"}, {"vocab_size", 41}, {"hidden_size", 30}, {"num_hidden_layers", 3},
            {"num_attention_heads", 3}, {"num_key_value_heads", 3}, {"q_lora_rank", 14}, {"kv_lora_rank", 10},
            {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4}, {"v_head_dim", 5}, {"intermediate_size", 34},
            {"moe_intermediate_size", 9}, {"n_routed_experts", 6}, {"n_shared_experts", 1},
            {"num_experts_per_tok", 2}, {"first_k_dense_replace", 1}, {"n_group", 2}, {"topk_group", 1},
            {"initializer_range", 0.3}, {"index_n_heads", 5}, {"index_head_dim", 7}, {"index_topk", 4},
            {"max_position_embeddings", 64}};
  model::Model m(model::parse_config(j, "v32 decode test config"), kern::Prec::F32);
  m.init_random(21);
  const int64_t T = 29, V = m.cfg.vocab_size;
  const std::vector<int32_t> ids = tokens(T, V, 8);
  model::Decoder dec(m, T);
  int64_t at = 0;
  for (int64_t n : schedule(T)) {
    const std::vector<float> got = dec.feed(ids.data() + at, n);
    at += n;
    model::Decoder full(m, at);
    const std::vector<float> ref = full.feed(ids.data(), at);
    EXPECT_LE(rel_diff(got.data(), ref.data(), V), 1e-5) << "at " << at << " tokens (chunk " << n << ")";
  }
}

}  // namespace
