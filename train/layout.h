// A parallel run's layout on the model: the checks that the model splits as asked, the
// composition root that builds the process groups and sets them on the model, and what each rank
// holds of the model (expert, pipeline and tensor-parallel memory sharding).
#pragma once
#include <memory>
#include "model/config.h"
#include "model/params.h"
#include "parallel/dims.h"
#include "train/dist.h"

namespace trex::train {

// Throws trex::UserError naming the field(s), the values and what to do when the layout does not
// fit the world size (ParallelDims::validate_world) or the model does not split over it
// (model::check_split: heads, V4 output groups, dense width, experts, layers per stage).
void validate_layout(const parallel::ParallelDims& dims, int world_size, const model::ModelConfig& cfg);

// The parallel state of one rank of a run laid out by dims (world.size() == dims.world()): the
// process groups, expert and tensor parallelism and the pipeline stage set on m, and the
// DataParallel over every rank (null when the world is one rank: the caller runs the one-rank
// AdamW). Collective. An expert-sharded m must hold the experts of this rank's ep rank
// (expert_shard_of), a stage-sharded m the layers of its pp rank (stage_shard_of), a tp-sharded
// m the slice of its tp rank (tp_shard_of).
struct ParallelRun {
  parallel::ProcessGroups groups;
  std::unique_ptr<parallel::Communicator> expert_replicas;  // expert-sharded: ranks holding the same experts
  std::unique_ptr<parallel::Communicator> stage, shared;    // stage-sharded: this stage; first + last stage
  std::unique_ptr<parallel::Communicator> tp_slice;         // tp-sharded: ranks holding the same slice
  std::unique_ptr<parallel::Communicator> device;           // a model on a device: its memory's communicator
  std::unique_ptr<DataParallel> dp;
};
// The routed experts rank `rank` of a run laid out by dims holds (expert-parallel memory
// sharding): its ep rank's experts, the expert region aligned for the data-parallel buckets;
// every expert (not sharded) when ep = 1.
model::ExpertShard expert_shard_of(const parallel::ParallelDims& dims, int rank, const model::ModelConfig& cfg);
// The pipeline stage rank `rank` holds (pipeline memory sharding): its stage's layers, regions
// aligned for the data-parallel buckets; the whole model (not sharded) when pp = 1.
model::StageShard stage_shard_of(const parallel::ParallelDims& dims, int rank, const model::ModelConfig& cfg);
// The tensor-parallel slice rank `rank` holds (tensor-parallel memory sharding): its tp rank's
// heads and dense-MLP columns, the region aligned for the data-parallel buckets; whole when tp = 1.
model::TpShard tp_shard_of(const parallel::ParallelDims& dims, int rank);
ParallelRun make_parallel_run(parallel::Communicator& world, const parallel::ParallelDims& dims, model::Model& m,
                              AdamWConfig ocfg, DpOptions o = {});


}  // namespace trex::train
