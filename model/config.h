// Model configuration of the DeepSeek-V3 family, read from a Hugging Face config.json (or the
// [model] table of a trex TOML file, which holds the same keys). Every value trex cannot compute
// exactly is rejected at load time with the field name and what is supported.
#pragma once
#include <cstdint>
#include <string>
#include <nlohmann/json_fwd.hpp>

namespace trex::model {

enum class ScoringFunc { Sigmoid, Softmax };
enum class TopkMethod { NoauxTc, Greedy, GroupLimitedGreedy };

struct RopeScaling {
  bool yarn = false;  // false: plain RoPE
  double factor = 1.0, beta_fast = 32.0, beta_slow = 1.0, mscale = 1.0, mscale_all_dim = 0.0;
  int64_t original_max_position_embeddings = 4096;
  bool truncate = true;
};

struct ModelConfig {
  std::string model_type = "deepseek_v3";
  int64_t vocab_size = 0, hidden_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // 0 = null (plain q_proj)
  int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  int64_t intermediate_size = 0, moe_intermediate_size = 0;
  int64_t n_routed_experts = 0, n_shared_experts = 0, num_experts_per_tok = 0;
  int64_t first_k_dense_replace = 0, n_group = 1, topk_group = 1;
  TopkMethod topk_method = TopkMethod::NoauxTc;
  ScoringFunc scoring_func = ScoringFunc::Sigmoid;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool rope_interleave = true;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 4096;
  double initializer_range = 0.02;
  int64_t num_nextn_predict_layers = 0;  // MTP weights in V3 checkpoints are skipped on load

  // Derived.
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool is_moe_layer(int64_t l) const { return n_routed_experts > 0 && l >= first_k_dense_replace; }
  int64_t shared_intermediate() const { return moe_intermediate_size * n_shared_experts; }

  // Parameter counts (all, and active per token: top-k routed experts + shared).
  int64_t num_params() const;
  int64_t num_active_params() const;
  // Training FLOPs per token for a sequence of T tokens: 6 x active matmul params (embedding
  // lookup excluded, LM head included) + the causal attention term 6 * H * (dqk + dv) * T / 2 * L.
  double train_flops_per_token(int64_t T) const;
};

// Parses a config object; `where` names the source (file path) in error messages.
ModelConfig parse_config(const nlohmann::json& j, const std::string& where);
ModelConfig load_config_json(const std::string& path);
std::string scoring_name(ScoringFunc);
std::string topk_method_name(TopkMethod);

}  // namespace trex::model
