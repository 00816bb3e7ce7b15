// Training checkpoints: RUN_DIR/checkpoints/step-NNNNNNNN/ holds the model in Hugging Face
// layout (config.json + model.safetensors, f32 master weights, router biases), the AdamW moments
// (optimizer.safetensors, under the parameter names with "exp_avg." / "exp_avg_sq." prefixes),
// and trainer_state.json (step, optimizer step, data position, RNG state, anything else the
// caller adds), the tokenizer the run used (tokenizer.json and tokenizer_config.json, so that
// `trex generate --model` and `trex or eval --model` find it), and manifest.json: the size and
// CRC-32 of every other file (io/checksum.h). A checkpoint is written into a temporary directory,
// every file fsynced, then renamed into place and the parent fsynced (io/atomic_file.h): a crash
// at any moment leaves either the previous complete checkpoint or the new complete one as the
// newest, never a half one. The last `keep` checkpoints are kept. Loading verifies the manifest
// and names a damaged file; `--resume auto` takes the newest checkpoint that verifies.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "model/checkpoint.h"
#include "model/model.h"
#include "train/optimizer.h"

namespace trex::train {

// A file copied into every checkpoint under `name` (the run's tokenizer.json and its config).
struct CarriedFile {
  std::string src, name;
};

struct TrainState {
  int64_t step = 0;          // optimizer steps done
  int64_t data_position = 0; // where the data loader resumes
  uint64_t rng_state = 0;    // data-order / sampling RNG
  nlohmann::json extra;      // free-form (schedule, metrics state)
  std::vector<CarriedFile> carry{};  // written with the checkpoint, not read back by load_checkpoint
};

// "step-00000042": the directory name of the checkpoint of a step.
std::string checkpoint_name(int64_t step);
// RUN_DIR/checkpoints/step-NNNNNNNN: where the checkpoint of `step` lives.
std::string checkpoint_path(const std::string& run_dir, int64_t step);

// Writes a checkpoint for state.step; returns its directory. Removes checkpoints beyond `keep`.
// opt must own the whole slab (one rank; data parallel: train/dist.h gathers the shards first).
std::string save_checkpoint(const std::string& run_dir, const model::Model& m, const AdamW& opt,
                            const TrainState& state, int keep = 3);
// The same with the moments given as whole-slab arrays m1, m2 [layout.total] indexed like the
// slab, and the optimizer's step count.
std::string save_checkpoint(const std::string& run_dir, const model::Model& m, const float* m1, const float* m2,
                            int64_t optimizer_step, const TrainState& state, int keep = 3);
// The same from a whole model's weights (assembled from expert-parallel shards: train/dist.h).
std::string save_checkpoint(const std::string& run_dir, const model::WeightsView& w, const float* m1, const float* m2,
                            int64_t optimizer_step, const TrainState& state, int keep = 3);
// The newest complete checkpoint directory under run_dir, if any (not verified).
std::optional<std::string> latest_checkpoint(const std::string& run_dir);

// The newest complete checkpoint whose files match its manifest (--resume auto); `skipped` gets
// one line per newer checkpoint passed over, naming the damaged file and why.
struct ResumePick {
  std::optional<std::string> dir;
  std::vector<std::string> skipped;
};
ResumePick newest_verified_checkpoint(const std::string& run_dir);
// Checks every file of a checkpoint against its manifest; UserError naming the damaged file.
void verify_checkpoint(const std::string& dir);

// Loads weights, router biases, optimizer moments and state; the model config must match. A
// sharded (ZeRO-1) opt keeps the moments of the ranges it owns: checkpoints do not depend on the
// layout of the run that wrote them. verify: check the manifest first (verify_checkpoint); false
// when the caller has just done so.
TrainState load_checkpoint(const std::string& dir, model::Model& m, AdamW& opt, bool verify = true);

}  // namespace trex::train
