// Hugging Face checkpoints of DeepseekV3ForCausalLM: config.json + model.safetensors (or
// shards + model.safetensors.index.json), tensors under their checkpoint names. Loading checks
// every expected tensor's presence, shape and dtype and names the file and tensor on error.
// FP8 checkpoints (DeepSeek-V3/R1 e4m3 + 128x128 scale_inv blocks, per config.json's
// quantization_config) are dequantized on load (io/quant.h).
#pragma once
#include <string>
#include "model/model.h"

namespace trex::model {

// Reads weights (and router biases) from a checkpoint directory into the model.
void load_hf_weights(Model& m, const std::string& dir);
// Writes config.json and model.safetensors (sharded above max_shard_bytes) into dir.
// dtype F32 or BF16 for the weights; router biases are always F32 as in DeepSeek's releases.
void save_hf_checkpoint(const Model& m, const std::string& dir, DType dtype = DType::F32,
                        uint64_t max_shard_bytes = 5ull << 30);
// Gradients (same names) as one safetensors file, f32.
void save_gradients(const Model& m, const std::string& path);
// The config as a Hugging Face config.json object (string).
std::string config_to_json(const ModelConfig& c);

}  // namespace trex::model
