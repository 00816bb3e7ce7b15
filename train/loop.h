// The post-training run behind `trex train --config FILE`: data (CPT or SFT by data.mode) ->
// packed sequences -> optimizer steps with gradient accumulation, LR schedule, periodic eval on a
// held-out split, checkpoints every N steps and at the end, `resume` from the newest complete
// checkpoint, metrics.jsonl and a live view. The step itself is train/trainer.cpp:
// trainer_step().
#pragma once
#include <cstdint>
#include <string>
#include "train/data.h"
#include "train/run_config.h"

namespace trex::train {

struct TokenizerFns {
  EncodeFn encode;
  int32_t eos_id = 0;
  int32_t pad_id = 0;
};

struct TrainResult {
  int64_t steps = 0;
  int64_t skipped_steps = 0;  // steps with a NaN / Inf loss or gradient (no update made)
  double first_loss = 0, last_loss = 0, last_eval_loss = -1;
  std::string last_checkpoint;
  DataStats data;
};

TrainResult run_training(const RunConfig& rc, const TokenizerFns& tok);

}  // namespace trex::train
