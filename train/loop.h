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

namespace trex::parallel {
class Communicator;
}

namespace trex::train {

struct TokenizerFns {
  EncodeFn encode;
  int32_t eos_id = 0;
  int32_t pad_id = 0;
  std::string file;  // the tokenizer.json the ids come from (its bytes key the token cache)
};

struct TrainResult {
  int64_t steps = 0;
  int64_t skipped_steps = 0;  // steps with a NaN / Inf loss or gradient (no update made)
  double first_loss = 0, last_loss = 0, last_eval_loss = -1;
  std::string last_checkpoint;
  bool data_from_cache = false;  // the training documents came from the token cache
  DataStats data;
  int dp = 1;                     // data-parallel size of the run
  double step_ms = 0, comm_ms = 0;  // summed over steps (this rank): step time, exposed communication
  int64_t loss_spikes = 0;          // steps flagged by the loss-spike window (train/loss_spikes.h)
  double memory_estimate = 0;       // bytes per rank, train/preflight.h
  double peak_rss = 0;              // bytes, this process at the end of the run
  int stop_signal = 0;              // SIGTERM / SIGINT that stopped the run after a checkpoint (0: ran to the end)
};

// world: the MPI ranks of a data-parallel run (every rank calls run_training; rank 0 logs and
// writes checkpoints), or nullptr for one process. See train/dist.h. local_ranks: the ranks that
// share this machine's memory (the start-up memory check counts each of them).
TrainResult run_training(const RunConfig& rc, const TokenizerFns& tok, parallel::Communicator* world = nullptr,
                         int local_ranks = 1);

}  // namespace trex::train
