// Configs the PyTorch dumps do not cover (no nope dims, no rope dims, no shared experts, top-1,
// all-dense, single head, T = 1, group_limited_greedy): the step runs, the loss is finite, and
// the gradient agrees with a central finite difference of the loss along a random direction.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include "core/parallel.h"
#include "core/rng.h"
#include "model/model.h"
#include "tests/unit/fd_check.h"

using namespace trex;
using nlohmann::json;

namespace {

json base() {
  return {{"vocab_size", 53}, {"hidden_size", 30}, {"num_hidden_layers", 2}, {"num_attention_heads", 3},
          {"q_lora_rank", 14}, {"kv_lora_rank", 10}, {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4},
          {"v_head_dim", 5}, {"intermediate_size", 34}, {"moe_intermediate_size", 9}, {"n_routed_experts", 6},
          {"n_shared_experts", 1}, {"num_experts_per_tok", 2}, {"first_k_dense_replace", 1}, {"n_group", 3},
          {"topk_group", 2}, {"initializer_range", 0.3}, {"max_position_embeddings", 8}};
}

using trex::testing::loss_at;

void check_config(const json& j, int64_t B, int64_t T, double aux = 0.0) {
  init_threads();
  model::ModelConfig cfg = model::parse_config(j, "test config");
  model::Model m(cfg, kern::Prec::F32, {aux});
  m.init_random(42);
  Rng r(9);
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (auto& x : ids) x = r.next_u64() % cfg.vocab_size;
  for (auto& x : tg) x = r.next_u64() % cfg.vocab_size;
  if (B * T > 1) tg[1] = -100;
  model::Batch b{B, T, ids.data(), tg.data(), nullptr, nullptr};
  m.zero_grads();
  model::LossParts lp = m.forward_backward(b, 1.f);
  ASSERT_TRUE(std::isfinite(lp.loss));
  const int64_t n = m.layout.total;
  std::vector<float> p0(m.P(), m.P() + n), g(m.G(), m.G() + n);
  // One random direction inside each parameter tensor: every tensor's gradient is checked on
  // its own, so a wrong small gradient (router, norms) cannot hide behind the big ones.
  const double t = 1e-2;
  for (const model::ParamEntry& e : m.layout.entries) {
    std::vector<float> v(n, 0.f);
    double gv = 0, vv = 0;
    for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) vv += (v[i] = (float)r.normal()) * v[i];
    for (int64_t i = e.offset; i < e.offset + e.shape.numel(); ++i) {
      v[i] = (float)(v[i] / std::sqrt(vv));
      gv += (double)g[i] * v[i];
    }
    double fd = (loss_at(m, b, p0, v, t) - loss_at(m, b, p0, v, -t)) / (2 * t);
    EXPECT_NEAR(fd, gv, 3e-2 * std::abs(gv) + 1e-3) << e.name << " in " << j.dump();
  }
}

TEST(ModelConfigs, Baseline) { check_config(base(), 2, 7); }
TEST(ModelConfigs, NoNopeDims) {
  json j = base();
  j["qk_nope_head_dim"] = 0;
  check_config(j, 2, 5);
}
TEST(ModelConfigs, NoRopeDimsWithYarnScale) {
  json j = base();
  j["qk_rope_head_dim"] = 0;
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 3.0}, {"mscale_all_dim", 0.5}, {"original_max_position_embeddings", 4}};
  check_config(j, 1, 6);
}
TEST(ModelConfigs, NoSharedTop1Softmax) {
  json j = base();
  j["n_shared_experts"] = 0;
  j["num_experts_per_tok"] = 1;
  j["scoring_func"] = "softmax";
  j["norm_topk_prob"] = false;
  check_config(j, 3, 4, 0.02);
}
TEST(ModelConfigs, AllDenseSingleHeadNoQLora) {
  json j = base();
  j["n_routed_experts"] = 0;
  j["num_attention_heads"] = 1;
  j["q_lora_rank"] = nullptr;
  check_config(j, 2, 9);
}
TEST(ModelConfigs, GroupLimitedGreedyHalfSplitRope) {
  json j = base();
  j["topk_method"] = "group_limited_greedy";
  j["rope_interleave"] = false;
  check_config(j, 2, 6, 0.01);
}
TEST(ModelConfigs, PositionsBeyondMaxPositionEmbeddings) { check_config(base(), 1, 19); }
TEST(ModelConfigs, SingleToken) {
  model::ModelConfig cfg = model::parse_config(base(), "test config");
  model::Model m(cfg, kern::Prec::F32);
  m.init_random(1);
  int32_t id = 3, tg = -100;
  model::LossParts lp = m.forward_backward({1, 1, &id, &tg, nullptr, nullptr}, 1.f);
  EXPECT_EQ(lp.n_valid, 0);
  EXPECT_EQ(lp.loss, 0.0);
}
TEST(ModelConfigs, OutOfVocabularyIdIsAUserError) {
  model::ModelConfig cfg = model::parse_config(base(), "test config");
  model::Model m(cfg, kern::Prec::F32);
  int32_t id = 53, tg = 1;
  EXPECT_THROW(m.forward({1, 1, &id, &tg, nullptr, nullptr}), UserError);
}

}  // namespace
