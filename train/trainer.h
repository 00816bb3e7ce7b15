// The training step: forward + backward over the micro-batches of one global batch (gradient
// accumulation), optimizer step, aux-loss-free router-bias update, metrics.
#pragma once
#include <vector>
#include "core/profile.h"
#include "model/model.h"
#include "train/optimizer.h"

namespace trex::train {

class DataParallel;  // train/dist.h

struct StepStats {
  double loss = 0, ce = 0, aux = 0, mtp = 0, grad_norm = 0, ms = 0;  // mtp: V4 MTP CE (loss adds weight x mtp)
  // DeepSeek-V3.2 indexer loss (train.indexer_loss_weight > 0): summed over layers (loss adds
  // weight x indexer), and the mean over layers and queries of the attention mass in the top-k.
  double indexer = 0, indexer_recall = 0;
  bool skipped = false;  // the loss or the gradient norm was NaN / Inf: no update was made
  int64_t tokens = 0, n_valid = 0;         // data parallel: over all ranks
  std::vector<double> load_max_over_mean;  // per MoE layer: busiest expert's load / mean load
  std::vector<std::vector<int64_t>> expert_loads;  // per MoE layer [E]: tokens routed to each expert
  double comm_ms = 0;  // data parallel: time this rank was blocked in communication (exposed)
  double cp_comm_ms = 0;  // of comm_ms: in the context-parallel collectives (DataParallel::cp_wait_s)
};

// One optimizer step over `micro` (each micro-batch's gradient weighted by its share of valid
// targets, so the result equals one big batch's mean loss). A step whose loss or gradient norm is
// not finite is skipped: weights, AdamW moments and router biases stay as they were
// (StepStats::skipped). inject_nan (a debug / test hook) puts a NaN into the gradients first.
StepStats trainer_step(model::Model& m, AdamW& opt, const std::vector<model::Batch>& micro, float lr, float gamma,
                       Profiler* prof = nullptr, bool inject_nan = false);

// Data parallel (train/dist.h): `micro` are this rank's micro-batches; together with the other
// ranks' they form the global batch. The result equals the single-rank step on all ranks'
// micro-batches (rank 0's, then rank 1's, ... of each accumulation index): micro-batch weights
// are shares of the global target count, gradients are summed over ranks, the loss parts, the
// gradient norm and the expert loads (router-bias update) are global, and a skipped step is
// skipped on every rank. inject_nan: a NaN in rank 0's gradient shard.
StepStats trainer_step(DataParallel& dp, const std::vector<model::Batch>& micro, float lr, float gamma,
                       Profiler* prof = nullptr, bool inject_nan = false);

}  // namespace trex::train
