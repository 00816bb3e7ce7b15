// DeepSeek-V2 / V2-Lite / V2.5 config.json (model_type "deepseek_v2"; transformers'
// DeepseekV2Config names and defaults). V2 is the V3 architecture with a softmax router and no
// e_score_correction_bias, so it is read into the same ModelConfig and runs through the same
// modules. How V2 maps onto them (transformers 5.25 modeling_deepseek_v2.py):
// - router: scores = softmax(logits) always; greedy = top-k of the scores; group_limited_greedy =
//   the topk_group groups with the largest single score, then top-k inside them; combine weights
//   = the selected scores x routed_scaling_factor, never normalized (transformers ignores
//   norm_topk_prob; DeepSeek's release code normalizes instead of scaling when it is true and
//   top_k > 1, so that is refused rather than guessed at);
// - RoPE: complex pairs (2i, 2i+1) of q_pe / k_pe rotated in place. V3's interleaved layout
//   rotates the same pairs and writes them de-interleaved, for q and k alike; q.k is the same, so
//   V2 runs trex's rope_interleave = true path;
// - YaRN and the softmax scale (yarn_apply_mscale) are V3's;
// - every layer from first_k_dense_replace on is MoE (moe_layer_freq is not read by transformers;
//   values other than 1 are refused, as for V3).
// A key left out takes DeepseekV2Config's default; num_experts_per_tok (default None) is required,
// and so are n_group / topk_group for group_limited_greedy.
#include <set>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "model/config.h"
#include "model/config_reader.h"

namespace trex::model {

using nlohmann::json;
using namespace cfgread;

namespace {

// DeepseekV2Config's defaults (transformers 5.25) for the keys trex reads; None defaults are left out.
const json& v2_defaults() {
  static const json d = {{"vocab_size", 102400},
                         {"hidden_size", 4096},
                         {"intermediate_size", 11008},
                         {"num_hidden_layers", 32},
                         {"num_attention_heads", 32},
                         {"max_position_embeddings", 2048},
                         {"initializer_range", 0.02},
                         {"rms_norm_eps", 1e-6},
                         {"tie_word_embeddings", false},
                         {"rope_theta", 10000.0},
                         {"first_k_dense_replace", 0},
                         {"kv_lora_rank", 512},
                         {"q_lora_rank", 1536},
                         {"n_routed_experts", 64},
                         {"n_shared_experts", 2},
                         {"qk_nope_head_dim", 128},
                         {"qk_rope_head_dim", 64},
                         {"routed_scaling_factor", 1.0},
                         {"topk_method", "greedy"},
                         {"norm_topk_prob", false},
                         {"v_head_dim", 128},
                         {"moe_intermediate_size", 1407}};
  return d;
}

}  // namespace

ModelConfig parse_config_v2(const json& j, const std::string& where, std::set<std::string>* used) {
  Reader r{j, where, used};
  // What V2 cannot express, or where transformers and DeepSeek's release code disagree.
  const std::string sf = r.str("scoring_func", "softmax");
  TREX_USER_CHECK(sf == "softmax", "set scoring_func = \"softmax\" (or remove it)", where, ": scoring_func '", sf,
                  "' is not supported for model_type deepseek_v2 (its router is softmax, in transformers and in "
                  "DeepSeek's release code)");
  const std::string tm = r.str("topk_method", "greedy");
  TREX_USER_CHECK(tm == "greedy" || tm == "group_limited_greedy",
                  "allowed for deepseek_v2: greedy, group_limited_greedy", where, ": topk_method '", tm,
                  "' is not supported for model_type deepseek_v2");
  // With one expert per token both scale (the release normalizes only when top_k > 1).
  const bool norm = r.boolean("norm_topk_prob", false);
  TREX_USER_CHECK(!norm || (r.has("num_experts_per_tok") && r.i64("num_experts_per_tok", 0) == 1),
                  "set norm_topk_prob = false (every V2 release does)", where,
                  ": norm_topk_prob = true is not supported for model_type deepseek_v2 with more than one expert per "
                  "token: transformers ignores it (weights = scores x routed_scaling_factor) while DeepSeek's release "
                  "code normalizes the weights and does not scale them; the two disagree");
  TREX_USER_CHECK(!r.boolean("mlp_bias", false), "set mlp_bias = false", where,
                  ": mlp_bias = true is not supported (DeepSeek-V2 releases have no MLP biases)");
  TREX_USER_CHECK(!r.boolean("attention_bias", false), "set attention_bias = false", where,
                  ": attention_bias = true is not supported (DeepSeek-V2 releases have no attention biases)");
  TREX_USER_CHECK(r.boolean("rope_interleave", true), "remove rope_interleave", where,
                  ": rope_interleave = false is not supported for model_type deepseek_v2 (V2 always rotates "
                  "interleaved pairs; transformers ignores the key)");
  r.has("head_dim");     // transformers overwrites it with qk_rope_head_dim
  r.has("qk_head_dim");  // written by save_pretrained: qk_nope_head_dim + qk_rope_head_dim
  json k = j;
  // q_lora_rank null or 0 (a TOML [model] table has no null): plain q_proj, as in V2-Lite. Left
  // out, it is transformers' default 1536.
  if (k.contains("q_lora_rank") && k["q_lora_rank"].is_number_integer() && k["q_lora_rank"].get<int64_t>() == 0)
    k["q_lora_rank"] = nullptr;
  for (auto& [key, v] : v2_defaults().items())
    if (!k.contains(key)) k[key] = v;  // an explicit null stays
  k["model_type"] = "deepseek_v3";
  k["scoring_func"] = "softmax";
  k["norm_topk_prob"] = false;
  if (tm == "greedy") {  // transformers never reads the groups for greedy
    k.erase("n_group");
    k.erase("topk_group");
    if (used) used->insert({"n_group", "topk_group"});
  } else {
    TREX_USER_CHECK(r.has("n_group") && r.has("topk_group"), "set n_group and topk_group", where,
                    ": topk_method group_limited_greedy needs n_group and topk_group");
  }
  Reader{k, where}.i64("n_routed_experts", 0, true, 1);  // transformers has no dense-only V2
  ModelConfig c = parse_config(k, where, used);
  c.model_type = "deepseek_v2";
  c.scoring_func = ScoringFunc::Softmax;  // also when every layer is dense and the MoE keys went unread
  c.topk_method = tm == "greedy" ? TopkMethod::Greedy : TopkMethod::GroupLimitedGreedy;
  c.norm_topk_prob = false;
  return c;
}

std::string config_to_json_v2(const ModelConfig& c) {
  // The keys transformers' save_pretrained writes for DeepseekV2ForCausalLM (with its defaults
  // for those trex does not keep), plus DeepSeek's release keys scoring_func / moe_layer_freq.
  nlohmann::ordered_json j;
  mla_moe_config_keys(j, c, "DeepseekV2ForCausalLM", "deepseek_v2");
  j["head_dim"] = c.qk_rope_head_dim;
  j["topk_method"] = topk_method_name(c.topk_method);
  const bool groups = c.topk_method == TopkMethod::GroupLimitedGreedy;
  j["n_group"] = groups ? nlohmann::ordered_json(c.n_group) : nlohmann::ordered_json(nullptr);
  j["topk_group"] = groups ? nlohmann::ordered_json(c.topk_group) : nlohmann::ordered_json(nullptr);
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = 1;
  j["norm_topk_prob"] = false;
  j["scoring_func"] = "softmax";
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_parameters"] = rope_parameters_json(c);
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["initializer_range"] = c.initializer_range;
  return j.dump(2);
}

}  // namespace trex::model
