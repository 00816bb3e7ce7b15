// A trex run config (TOML): [model] holds Hugging Face config.json keys (or `path` to a
// checkpoint directory / config.json); [train] the run shape. Unknown keys are errors that name
// the key and the allowed ones. (The full CPT/SFT config of issue 4 extends this file.)
#pragma once
#include <cstdint>
#include <string>
#include "kernels/gemm.h"
#include "model/config.h"

namespace trex::train {

struct RunConfig {
  model::ModelConfig model;
  std::string model_path;  // checkpoint directory when [model].path is set
  int64_t batch_size = 1, seq_len = 128, threads = 0, steps = 10;
  uint64_t seed = 1234;
  kern::Prec precision = kern::Prec::BF16;
  float lr = 1e-4f, weight_decay = 0.1f, clip_grad_norm = 1.0f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float bias_update_gamma = 0.001f;
  double aux_loss_alpha = 0.0;
};

RunConfig load_run_config(const std::string& path);
kern::Prec parse_precision(const std::string& s, const std::string& where);

}  // namespace trex::train
