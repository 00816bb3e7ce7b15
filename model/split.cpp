// model::check_split: whether a model splits over a parallel layout. See split.h.
#include "model/split.h"

#include "core/error.h"

namespace trex::model {

void check_split(const ModelConfig& cfg, const Split& s) {
  const int tp = s.tp, ep = s.ep, pp = s.pp;
  const std::vector<int>& pp_layers = s.pp_layers;
  TREX_CHECK(tp >= 1 && ep >= 1 && pp >= 1, "check_split: sizes tp ", tp, ", ep ", ep, ", pp ", pp, " must be >= 1");
  TREX_USER_CHECK(
      cfg.num_attention_heads % tp == 0,
      "tensor parallelism splits whole attention heads: choose parallel.tp among the divisors of the head count",
      "parallel.tp = ", tp, " does not divide model num_attention_heads = ", cfg.num_attention_heads);
  if (cfg.is_v4())
    TREX_USER_CHECK(cfg.v4.o_groups % tp == 0,
                    "DeepSeek-V4 splits whole output groups over tp ranks: choose parallel.tp among the divisors of "
                    "o_groups",
                    "parallel.tp = ", tp, " does not divide model o_groups = ", cfg.v4.o_groups);
  if (cfg.has_dense_mlp() && cfg.intermediate_size > 0)
    TREX_USER_CHECK(cfg.intermediate_size % tp == 0,
                    "the dense MLP is split column-wise over tp ranks: choose parallel.tp among the divisors of "
                    "intermediate_size",
                    "parallel.tp = ", tp, " does not divide model intermediate_size = ", cfg.intermediate_size);
  if (ep > 1)
    TREX_USER_CHECK(cfg.n_routed_experts > 0, "set parallel.ep = 1 for a model without routed experts",
                    "parallel.ep = ", ep, " but the model has no routed experts (n_routed_experts = 0)");
  if (cfg.n_routed_experts > 0)
    TREX_USER_CHECK(cfg.n_routed_experts % ep == 0,
                    "each ep rank holds the same number of experts: choose parallel.ep among the divisors of "
                    "n_routed_experts",
                    "parallel.ep = ", ep, " does not divide model n_routed_experts = ", cfg.n_routed_experts);
  TREX_USER_CHECK(cfg.num_hidden_layers >= pp, "lower parallel.pp to at most the number of layers",
                  "parallel.pp = ", pp, " exceeds model num_hidden_layers = ", cfg.num_hidden_layers,
                  " (every pipeline stage needs a layer)");
  if (!pp_layers.empty()) {
    TREX_USER_CHECK(static_cast<int>(pp_layers.size()) == pp, "give one layer count per pipeline stage",
                    "parallel.pp_layers has ", pp_layers.size(), " entries but parallel.pp = ", pp);
    int64_t sum = 0;
    for (int s = 0; s < pp; ++s) {
      const bool edge = s == 0 || s == pp - 1;
      TREX_USER_CHECK(pp_layers[s] >= (edge && pp > 1 ? 0 : 1),
                      "every middle stage holds at least one layer (the first and last may hold 0)",
                      "parallel.pp_layers[", s, "] = ", pp_layers[s], " is not allowed for stage ", s, " of ", pp);
      sum += pp_layers[s];
    }
    TREX_USER_CHECK(sum == cfg.num_hidden_layers, "make the per-stage layer counts add up to the model's layers",
                    "parallel.pp_layers sum to ", sum, " but model num_hidden_layers = ", cfg.num_hidden_layers);
  }
}

}  // namespace trex::model
