// A tiny DeepSeek-V3-shaped MoE with its one-rank AdamW, for the checkpoint tests
// (test_checkpoint_disk_full.cpp, test_durable.cpp): a seed gives the weights, step() one fixed
// training step, so two trainees that made the same steps hold the same state.
#pragma once
#include <cstdint>
#include <vector>
#include <nlohmann/json.hpp>
#include "model/config.h"
#include "model/model.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace trex::test {

inline model::ModelConfig tiny_trainee_config() {
  nlohmann::json j = {{"vocab_size", 97}, {"hidden_size", 40}, {"num_hidden_layers", 2},
                      {"num_attention_heads", 2}, {"q_lora_rank", 14}, {"kv_lora_rank", 10},
                      {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4}, {"v_head_dim", 6},
                      {"intermediate_size", 36}, {"moe_intermediate_size", 12}, {"n_routed_experts", 3},
                      {"n_shared_experts", 1}, {"num_experts_per_tok", 2}, {"first_k_dense_replace", 1}};
  return model::parse_config(j, "tiny trainee config");
}

struct Trainee {
  model::Model m;
  train::AdamW opt;
  explicit Trainee(uint64_t seed)
      : m(tiny_trainee_config(), kern::Prec::F32), opt(m, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f}) {
    m.init_random(seed);
  }
  void step() {
    std::vector<int32_t> ids(14), tg(14);
    for (int i = 0; i < 14; ++i) ids[i] = (i * 7) % 97, tg[i] = (i * 11 + 3) % 97;
    train::trainer_step(m, opt, {{2, 7, ids.data(), tg.data(), nullptr, nullptr}}, 1e-3f, 1e-3f);
  }
};

}  // namespace trex::test
