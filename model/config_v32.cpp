// DeepSeek-V3.2 config.json (model_type "deepseek_v32"; transformers' DeepseekV32Config names and
// defaults). V3.2 is DeepSeek-V3 (MLA + DeepSeekMoE with the sigmoid noaux_tc router) whose
// attention sees, per query, only the index_topk tokens a lightning indexer picks (DSA). It is
// read into the V3 fields plus ModelConfig::v32 and runs through the V3 modules; the indexer and
// the masked attention are model/v32_indexer.cpp. What transformers 5.25
// (modeling_deepseek_v32.py) computes:
// - router: always sigmoid scores + e_score_correction_bias, noaux_tc groups (the config has no
//   scoring_func / topk_method keys);
// - MLA RoPE: always the interleaved pairs (apply_rotary_pos_emb_interleave), as V3's
//   rope_interleave = true;
// - the indexer reads the q LoRA latent, so q_lora_rank must be set;
// - the MLP of layer l is MoE iff mlp_layer_types[l] == "sparse" (default: first_k_dense_replace
//   dense layers, then sparse); trex builds that pattern only; an MTP layer (index
//   num_hidden_layers + k, which the list does not cover) is MoE iff its index >=
//   first_k_dense_replace, as in DeepSeek's V3 MTP;
// - layer_types: every layer "indexed_attention".
// A key left out takes DeepseekV32Config's default (num_key_value_heads 128 included: transformers
// needs it equal to num_attention_heads, as trex does).
#include <set>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "model/config.h"
#include "model/config_reader.h"

namespace trex::model {

using nlohmann::json;
using namespace cfgread;

namespace {

// DeepseekV32Config's defaults (transformers 5.25) for the keys trex reads.
const json& v32_defaults() {
  static const json d = {{"vocab_size", 129280},
                         {"hidden_size", 7168},
                         {"intermediate_size", 18432},
                         {"moe_intermediate_size", 2048},
                         {"num_hidden_layers", 61},
                         {"num_attention_heads", 128},
                         {"num_key_value_heads", 128},
                         {"n_shared_experts", 1},
                         {"n_routed_experts", 256},
                         {"routed_scaling_factor", 2.5},
                         {"kv_lora_rank", 512},
                         {"q_lora_rank", 1536},
                         {"qk_rope_head_dim", 64},
                         {"v_head_dim", 128},
                         {"qk_nope_head_dim", 128},
                         {"n_group", 8},
                         {"topk_group", 4},
                         {"num_experts_per_tok", 8},
                         {"norm_topk_prob", true},
                         {"max_position_embeddings", 163840},
                         {"initializer_range", 0.02},
                         {"rms_norm_eps", 1e-6},
                         {"tie_word_embeddings", false},
                         {"rope_theta", 10000.0},
                         {"first_k_dense_replace", 3}};
  return d;
}

}  // namespace

ModelConfig parse_config_v32(const json& j, const std::string& where, std::set<std::string>* used) {
  Reader r{j, where, used};
  // What V3.2 cannot express or trex does not compute as transformers does.
  const std::string sf = r.str("scoring_func", "sigmoid"), tm = r.str("topk_method", "noaux_tc");
  TREX_USER_CHECK(sf == "sigmoid", "remove scoring_func", where, ": scoring_func '", sf,
                  "' is not supported for model_type deepseek_v32 (its router is always sigmoid + noaux_tc)");
  TREX_USER_CHECK(tm == "noaux_tc", "remove topk_method", where, ": topk_method '", tm,
                  "' is not supported for model_type deepseek_v32 (its router is always sigmoid + noaux_tc)");
  TREX_USER_CHECK(!r.boolean("mlp_bias", false), "set mlp_bias = false", where,
                  ": mlp_bias = true is not supported (DeepSeek-V3.2 has no MLP biases)");
  TREX_USER_CHECK(r.boolean("rope_interleave", true), "remove rope_interleave", where,
                  ": rope_interleave = false is not supported for model_type deepseek_v32 (transformers always "
                  "rotates MLA's interleaved pairs)");
  const int64_t L = r.i64("num_hidden_layers", 61, false, 1);
  if (r.has("layer_types")) {
    TREX_USER_CHECK(j["layer_types"].is_array() && (int64_t)j["layer_types"].size() == L, kFixHint, where,
                    ": layer_types must be a list of num_hidden_layers (", L, ") entries");
    for (const json& t : j["layer_types"])
      TREX_USER_CHECK(t == "indexed_attention", "set every layer_types entry to \"indexed_attention\"", where,
                      ": layer_types entry ", shown(t),
                      " is not supported for model_type deepseek_v32 (every layer is DSA)");
  }
  // mlp_layer_types (when given) decides the MLPs and first_k_dense_replace goes unread, as in
  // transformers; trex builds leading dense layers, then MoE ones.
  int64_t fkd = -1;
  if (r.has("mlp_layer_types")) {
    const json& m = j["mlp_layer_types"];
    TREX_USER_CHECK(m.is_array() && (int64_t)m.size() == L, kFixHint, where,
                    ": mlp_layer_types must be a list of num_hidden_layers (", L, ") entries");
    fkd = 0;
    while (fkd < L && m[fkd] == "dense") ++fkd;
    for (int64_t l = fkd; l < L; ++l)
      TREX_USER_CHECK(m[l] == "sparse", "list the dense layers first, then the sparse ones (or remove mlp_layer_types)",
                      where, ": mlp_layer_types[", l, "] = ", shown(m[l]), " is not supported for model_type ",
                      "deepseek_v32: trex builds leading dense layers, then MoE (\"sparse\") layers");
  }
  r.has("head_dim");     // transformers overwrites it with qk_rope_head_dim
  r.has("qk_head_dim");  // written by save_pretrained: qk_nope_head_dim + qk_rope_head_dim
  r.has("output_router_logits");
  json k = j;
  TREX_USER_CHECK(!(k.contains("q_lora_rank") && (k["q_lora_rank"].is_null() ||
                                                  (k["q_lora_rank"].is_number_integer() &&
                                                   k["q_lora_rank"].get<int64_t>() == 0))),
                  "set q_lora_rank (DeepSeek-V3.2 has 1536)", where,
                  ": q_lora_rank null is not supported for model_type deepseek_v32 (its indexer projects the q LoRA "
                  "latent; transformers builds no plain q_proj)");
  // A first_k_dense_replace beyond the list (every listed layer dense) agrees with it and still
  // decides the MTP layers (num_hidden_layers + k), which the list does not cover.
  if (fkd >= 0) {
    const json& given = k.contains("first_k_dense_replace") ? k["first_k_dense_replace"] : json();
    const bool beyond = fkd == L && given.is_number_integer() && given.get<int64_t>() > L;
    if (!beyond) k["first_k_dense_replace"] = fkd;
    if (used) used->insert("first_k_dense_replace");
  }
  for (auto& [key, v] : v32_defaults().items())
    if (!k.contains(key)) k[key] = v;  // an explicit null stays
  k["model_type"] = "deepseek_v3";
  k["scoring_func"] = "sigmoid";
  k["topk_method"] = "noaux_tc";
  Reader{k, where}.i64("n_routed_experts", 0, true, 1);  // transformers has no dense-only V3.2
  ModelConfig c = parse_config(k, where, used);
  c.model_type = "deepseek_v32";
  V32Config& x = c.v32;
  x.index_n_heads = r.i64("index_n_heads", 64, false, 1);
  x.index_head_dim = r.i64("index_head_dim", 128, false, 1);
  x.index_topk = r.i64("index_topk", 2048, false, 1);
  TREX_USER_CHECK(x.index_head_dim >= c.qk_rope_head_dim, kFixHint, where, ": index_head_dim (", x.index_head_dim,
                  ") must be >= qk_rope_head_dim (", c.qk_rope_head_dim, "): the indexer ropes its first ",
                  "qk_rope_head_dim dims");
  return c;
}

std::string config_to_json_v32(const ModelConfig& c) {
  // The keys transformers' save_pretrained writes for DeepseekV32ForCausalLM.
  nlohmann::ordered_json j;
  mla_moe_config_keys(j, c, "DeepseekV32ForCausalLM", "deepseek_v32");
  j["head_dim"] = c.qk_rope_head_dim;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_parameters"] = rope_parameters_json(c);
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["index_topk"] = c.v32.index_topk;
  j["index_head_dim"] = c.v32.index_head_dim;
  j["index_n_heads"] = c.v32.index_n_heads;
  nlohmann::ordered_json mt = nlohmann::ordered_json::array(), lt = nlohmann::ordered_json::array();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    mt.push_back(c.is_moe_layer(l) ? "sparse" : "dense");
    lt.push_back("indexed_attention");
  }
  j["mlp_layer_types"] = mt;
  j["layer_types"] = lt;
  j["initializer_range"] = c.initializer_range;
  // Not a key of transformers' config, but DeepSeek-V3.2's release config.json has it: without it
  // a checkpoint of a run that trains MTP blocks would not load them back (resume).
  if (c.num_nextn_predict_layers > 0) j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  return j.dump(2);
}

}  // namespace trex::model
