// What each rank of a parallel layout holds of the model (expert, pipeline and tensor-parallel
// memory sharding). See layout.h.
#include "train/layout.h"

namespace trex::train {

model::ExpertShard expert_shard_of(const parallel::ParallelDims& dims, int rank, const model::ModelConfig& cfg) {
  model::ExpertShard s;
  if (dims.ep <= 1) return s;
  const int64_t E = cfg.n_routed_experts;
  s.count = dims.experts_per_rank(E);
  s.first = dims.first_expert(E, dims.coord(rank).ep);
  s.region_align = 16 * (int64_t)dims.world();
  return s;
}

model::StageShard stage_shard_of(const parallel::ParallelDims& dims, int rank, const model::ModelConfig& cfg) {
  model::StageShard s;
  if (dims.pp <= 1) return s;
  const int p = dims.coord(rank).pp;
  const int64_t L = cfg.num_hidden_layers;
  s.l0 = dims.stage_first_layer(L, p);
  s.l1 = s.l0 + dims.stage_layers(L)[(size_t)p];
  s.first = p == 0;
  s.last = p == dims.pp - 1;
  s.region_align = 16 * (int64_t)dims.world();
  return s;
}

model::TpShard tp_shard_of(const parallel::ParallelDims& dims, int rank) {
  model::TpShard s;
  if (dims.tp <= 1) return s;
  s.rank = dims.coord(rank).tp;
  s.size = dims.tp;
  s.region_align = 16 * (int64_t)dims.world();
  return s;
}

}  // namespace trex::train
