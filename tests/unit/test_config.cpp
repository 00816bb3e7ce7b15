// Model config parsing: valid configs load; every unsupported or inconsistent value is a
// UserError that names the source and the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "core/error.h"
#include "model/config.h"
#include "model/params.h"

using namespace trex;
using nlohmann::json;

namespace {

json base() {
  return {{"vocab_size", 101}, {"hidden_size", 40}, {"num_hidden_layers", 3}, {"num_attention_heads", 5},
          {"q_lora_rank", 24}, {"kv_lora_rank", 18}, {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4},
          {"v_head_dim", 7}, {"intermediate_size", 52}, {"moe_intermediate_size", 11}, {"n_routed_experts", 9},
          {"n_shared_experts", 1}, {"num_experts_per_tok", 3}, {"first_k_dense_replace", 1}, {"n_group", 3},
          {"topk_group", 2}, {"topk_method", "noaux_tc"}, {"scoring_func", "sigmoid"}};
}

std::string error_of(const json& j) {
  try {
    model::parse_config(j, "cfg.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, ValidLoadsAndCountsParams) {
  model::ModelConfig c = model::parse_config(base(), "cfg.json");
  EXPECT_EQ(c.qk_head_dim(), 10);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(2));
  model::ParamLayout L = model::build_layout(c);
  int64_t n = 0;
  for (auto& e : L.entries) n += e.shape.numel();
  EXPECT_EQ(n, c.num_params());
  EXPECT_LT(c.num_active_params(), c.num_params());
}

TEST(Config, NullQLoraAndRopeParameters) {
  json j = base();
  j["q_lora_rank"] = nullptr;
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 5000.0}, {"factor", 4.0},
                          {"original_max_position_embeddings", 16}, {"mscale_all_dim", 1.0}};
  model::ModelConfig c = model::parse_config(j, "cfg.json");
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_TRUE(c.rope_scaling.yarn);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5000.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 16);
}

TEST(Config, BadValuesNameTheField) {
  struct Bad {
    const char* key;
    json value;
    const char* expect;
  };
  std::vector<Bad> bad = {
      {"hidden_size", 0, "hidden_size"},
      {"hidden_size", "big", "hidden_size"},
      {"n_group", 2, "n_group"},                 // 9 experts not divisible by 2
      {"topk_group", 4, "topk_group"},
      {"num_experts_per_tok", 7, "num_experts_per_tok"},  // only 2 groups x 3 selectable
      {"scoring_func", "tanh", "scoring_func"},
      {"topk_method", "best", "topk_method"},
      {"qk_rope_head_dim", 5, "qk_rope_head_dim"},
      {"num_key_value_heads", 1, "num_key_value_heads"},
      {"hidden_act", "gelu", "hidden_act"},
      {"attention_bias", true, "attention_bias"},
      {"moe_layer_freq", 2, "moe_layer_freq"},
      {"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}, "dynamic"},
  };
  for (const Bad& b : bad) {
    json j = base();
    j[b.key] = b.value;
    std::string err = error_of(j);
    EXPECT_NE(err.find(b.expect), std::string::npos) << b.key << " -> '" << err << "'";
    EXPECT_NE(err.find("cfg.json"), std::string::npos) << err;
  }
  json j = base();
  j.erase("kv_lora_rank");
  EXPECT_NE(error_of(j).find("kv_lora_rank"), std::string::npos);
  json one_per_group = base();
  one_per_group["n_routed_experts"] = 3;
  one_per_group["num_experts_per_tok"] = 2;
  EXPECT_NE(error_of(one_per_group).find("top-2"), std::string::npos);
}

}  // namespace
