// Whether a model splits over a parallel layout: the sizes that must divide the model's shapes
// (attention heads, DeepSeek-V4 output groups and the dense MLP width over tp, routed experts over
// ep, layers over pp stages). The topology itself (ranks, groups) is parallel/dims.h.
#pragma once
#include <vector>
#include "model/config.h"

namespace trex::model {

struct Split {
  int tp = 1, ep = 1, pp = 1;
  std::vector<int> pp_layers = {};  // optional: layers per stage, size pp, summing to num_hidden_layers
};

// Throws trex::UserError naming the field(s), the values and what to do when:
// num_attention_heads % tp != 0, V4 o_groups % tp != 0, the dense MLP width
// intermediate_size % tp != 0 (models with dense layers), n_routed_experts % ep != 0 (or ep > 1
// without routed experts), num_hidden_layers < pp, or pp_layers has the wrong size, a negative /
// empty-middle entry, or a sum other than num_hidden_layers.
void check_split(const ModelConfig& cfg, const Split& s);

}  // namespace trex::model
