// Parameter layout of a DeepSeek-V3-family model: every Hugging Face tensor name maps to a
// contiguous range of one flat f32 slab. The same offsets index the gradient slab, the bf16
// shadow used by bf16 GEMMs, and the AdamW moment slabs. Experts live in one [E, ...] slab per
// layer (gate and up stacked per expert: [E, 2F, d]; down: [E, d, F]) so that expert-parallel
// sharding is a slice and a grouped GEMM sees one weight tensor.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>
#include "core/tensor.h"
#include "model/config.h"

namespace trex::model {

struct ParamEntry {
  std::string name;  // Hugging Face checkpoint name
  int64_t offset;    // elements into the slab
  Shape shape;
  bool decay;        // weight decay applies (matrices yes, norms no)
};

// Offsets (elements) of one decoder layer's tensors; -1 where the layer has none.
struct LayerParams {
  int64_t in_norm = -1, post_norm = -1;
  int64_t q = -1, q_a = -1, q_a_norm = -1, q_b = -1;  // q when q_lora_rank is null, else q_a/q_b
  int64_t kv_a = -1, kv_a_norm = -1, kv_b = -1, o = -1;
  int64_t mlp_gu = -1, mlp_down = -1;                   // dense MLP: [2F, d], [d, F]
  int64_t router = -1, exp_gu = -1, exp_down = -1;      // MoE: [E, d], [E, 2Fm, d], [E, d, Fm]
  int64_t sh_gu = -1, sh_down = -1;                     // shared experts: [2Fs, d], [d, Fs]
  int64_t bias = -1;                                    // e_score_correction_bias, into buffers
};

struct BufferEntry {
  std::string name;
  int64_t offset;
  int64_t size;
};

struct ParamLayout {
  std::vector<ParamEntry> entries;
  std::unordered_map<std::string, size_t> index;  // name -> entries[i]
  int64_t total = 0;                               // elements in the slab
  int64_t embed = -1, final_norm = -1, head = -1;  // head == embed when tied
  std::vector<LayerParams> layers;
  std::vector<BufferEntry> buffers;  // non-trained state saved in checkpoints (router biases)
  int64_t buffers_total = 0;

  const ParamEntry* find(const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? nullptr : &entries[it->second];
  }
};

ParamLayout build_layout(const ModelConfig& c);

}  // namespace trex::model
