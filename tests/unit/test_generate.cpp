// Generation with a KV cache against the training forward: the log-likelihood of a sequence
// computed token by token (and with a prefilled chunk) through the cache equals the training
// path's loss; greedy generation is deterministic and respects eos, stop strings and limits.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include "core/parallel.h"
#include "core/rng.h"
#include "model/generate.h"

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
