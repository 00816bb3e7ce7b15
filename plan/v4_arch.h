// DeepSeek-V4 architecture as the planner needs it -- UNTIL THE V4 CONFIG PARSER LANDS (issue 3).
// model/ cannot parse deepseek_v4 configs yet, so the planner carries this small description of
// its own, with the figures' sources noted next to the built-ins in v4_arch.cpp. When model/
// gains a V4 ModelConfig, replace v4_flash()/v4_pro()/v4_from_json() with that parser.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json_fwd.hpp>
#include "plan/arch.h"

namespace trex::plan {

struct V4Arch {
  std::string name, source;
  int64_t vocab = 129280, hidden = 0, layers = 0;
  int64_t heads = 0, head_dim = 512, rope_dim = 64;  // one shared KV head (K = V), MQA
  int64_t q_lora = 0, o_groups = 0, o_lora = 0;      // low-rank query, grouped low-rank output
  int64_t n_routed = 0, n_shared = 1, topk = 0, moe_inter = 0;
  int64_t hash_layers = 3;                            // first layers route by a token->expert table
  int64_t window = 128;                               // sliding window of every layer
  std::vector<int64_t> compress_ratios;               // per layer: 0 window only, 4 CSA, 128 HCA
  int64_t index_heads = 64, index_dim = 128, index_topk = 512;  // CSA lightning indexer
  int64_t hc_mult = 4, hc_sinkhorn_iters = 20;        // manifold-constrained hyper-connections
  int64_t mtp = 1;                                    // num_nextn_predict_layers
  double published_total = 0, published_active = 0;   // for the sanity test (0 = unknown)
};

V4Arch v4_flash();  // DeepSeek-V4-Flash, 284B total / 13B active
V4Arch v4_pro();    // DeepSeek-V4-Pro, 1.6T total / 49B active
// A Hugging Face deepseek_v4 config.json (keys of transformers' DeepseekV4Config; missing keys
// take that class's defaults, which are V4-Flash's).
V4Arch v4_from_json(const nlohmann::json& j, const std::string& where);
ArchModel arch_from_v4(const V4Arch& v);

}  // namespace trex::plan
