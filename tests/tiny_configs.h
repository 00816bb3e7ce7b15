// Tiny DeepSeek-V3 / V2 / V3.2 / V4 model configs with odd sizes, shared by the unit and the MPI tests
// (Hugging Face config.json fields as JSON; model::parse_config reads them), and the
// perturbation that moves a model off its constant-initialized tensors.
#pragma once
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "model/model.h"

namespace trex::testing {

// hidden 40, 3 heads, 5 experts top-2, a dense first layer.
inline nlohmann::json tiny_v3() {
  return {{"model_type", "deepseek_v3"}, {"vocab_size", 67}, {"hidden_size", 40}, {"num_hidden_layers", 3},
          {"num_attention_heads", 3}, {"q_lora_rank", 13}, {"kv_lora_rank", 11}, {"qk_nope_head_dim", 6},
          {"qk_rope_head_dim", 4}, {"v_head_dim", 7}, {"intermediate_size", 50}, {"moe_intermediate_size", 9},
          {"n_routed_experts", 5}, {"n_shared_experts", 1}, {"num_experts_per_tok", 2}, {"first_k_dense_replace", 1},
          {"topk_method", "noaux_tc"}, {"scoring_func", "sigmoid"}, {"norm_topk_prob", true},
          {"routed_scaling_factor", 2.5}, {"initializer_range", 0.1}, {"max_position_embeddings", 64}};
}

// DeepSeek-V2 (V2-Lite's plain q_proj, V2's group-limited softmax router): hidden 40, 3 heads,
// 6 experts in 3 groups (2 kept), top-2, 2 shared experts, scaled weights, a dense first layer.
inline nlohmann::json tiny_v2() {
  return {{"model_type", "deepseek_v2"}, {"vocab_size", 67}, {"hidden_size", 40}, {"num_hidden_layers", 3},
          {"num_attention_heads", 3}, {"q_lora_rank", nullptr}, {"kv_lora_rank", 11}, {"qk_nope_head_dim", 6},
          {"qk_rope_head_dim", 4}, {"v_head_dim", 7}, {"intermediate_size", 50}, {"moe_intermediate_size", 9},
          {"n_routed_experts", 6}, {"n_shared_experts", 2}, {"num_experts_per_tok", 2}, {"first_k_dense_replace", 1},
          {"topk_method", "group_limited_greedy"}, {"n_group", 3}, {"topk_group", 2},
          {"routed_scaling_factor", 1.5}, {"initializer_range", 0.1}, {"max_position_embeddings", 64}};
}

// tiny_v3 with n DeepSeek-V3 MTP layers (model/mtp_v3.h), trained with mtp_loss_weight > 0.
inline nlohmann::json tiny_v3_mtp(int n = 1) {
  nlohmann::json j = tiny_v3();
  j["num_nextn_predict_layers"] = n;
  return j;
}

// DeepSeek-V3.2: q LoRA 13, 3 heads, 6 experts in 2 groups (1 kept), top-2, a dense first layer,
// an indexer of 5 heads of 8 (rope 4) picking 5 tokens per query.
inline nlohmann::json tiny_v32() {
  return {{"model_type", "deepseek_v32"}, {"vocab_size", 67}, {"hidden_size", 40}, {"num_hidden_layers", 3},
          {"num_attention_heads", 3}, {"num_key_value_heads", 3}, {"q_lora_rank", 13}, {"kv_lora_rank", 11},
          {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4}, {"v_head_dim", 7}, {"intermediate_size", 50},
          {"moe_intermediate_size", 9}, {"n_routed_experts", 6}, {"n_shared_experts", 1},
          {"num_experts_per_tok", 2}, {"first_k_dense_replace", 1}, {"n_group", 2}, {"topk_group", 1},
          {"routed_scaling_factor", 2.5}, {"index_n_heads", 5}, {"index_head_dim", 8}, {"index_topk", 5},
          {"initializer_range", 0.1}, {"max_position_embeddings", 64}};
}

// hidden 22, 3 heads of 10 in 3 output groups, CSA (rate 3) / HCA (rate 7) / sliding (window 5)
// layers, hash routing in the first, hc_mult 3, one MTP block.
inline nlohmann::json tiny_v4() {
  return {{"model_type", "deepseek_v4"}, {"vocab_size", 61}, {"hidden_size", 22}, {"num_hidden_layers", 3},
          {"num_attention_heads", 3}, {"head_dim", 10}, {"partial_rotary_factor", 0.4}, {"q_lora_rank", 9},
          {"o_groups", 3}, {"o_lora_rank", 5}, {"moe_intermediate_size", 7}, {"n_routed_experts", 5},
          {"num_experts_per_tok", 2}, {"n_shared_experts", 1}, {"sliding_window", 5},
          {"compress_rates", {{"compressed_sparse_attention", 3}, {"heavily_compressed_attention", 7}}},
          {"layer_types", {"compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"}},
          {"mlp_layer_types", {"hash_moe", "moe", "moe"}}, {"index_n_heads", 5}, {"index_head_dim", 6},
          {"index_topk", 2}, {"hc_mult", 3}, {"hc_sinkhorn_iters", 5}, {"swiglu_limit", 0.9},
          {"compress_rope_theta", 5000.0}, {"initializer_range", 0.3}, {"num_nextn_predict_layers", 1},
          {"rope_parameters", {{"rope_type", "yarn"}, {"factor", 3.0}, {"original_max_position_embeddings", 8}}},
          {"max_position_embeddings", 64}};
}

// Non-constant values for the tensors Hugging Face initializes to constants (the 1-d tensors:
// norm weights, sinks, hyper-connection bases and scales) and the compressors' position biases,
// so that their gradients are exercised: each element += 0.3 x normal. Refreshes the bf16 shadow.
inline void perturb_vectors(model::Model& m, uint64_t seed) {
  // In the whole model's order, so a model holding an expert shard, a pipeline stage or a tp slice
  // draws the same numbers for the tensors it holds.
  Rng r(seed);
  std::vector<float> v, part;
  for (const model::ParamEntry& w : model::build_layout(m.cfg).entries) {
    if (w.shape.ndim != 1 && w.name.find("position_bias") == std::string::npos) continue;
    const model::ParamEntry* e = m.layout.find(w.name);
    v.resize((size_t)w.shape.numel());
    for (float& x : v) x = (float)(0.3 * r.normal());
    if (!e) continue;  // another stage's tensor
    part.resize((size_t)e->shape.numel());
    e->take_from_whole(v.data(), part.data());  // a tp slice of V4's sinks: its heads' values
    for (size_t i = 0; i < part.size(); ++i) m.P()[e->offset + (int64_t)i] += part[i];
  }
  m.refresh_bf16();
}

}  // namespace trex::testing
