// A trex run config (TOML) with sections [model] [data] [train] [optim] [parallel] [checkpoint]
// [log]. [model] holds Hugging Face config.json keys inline, or only `path` to a checkpoint
// directory. `--set section.key=value` overrides any key. Unknown sections and keys (with the
// nearest known key), wrong types and out-of-range values are errors that name the file, the key
// and what is allowed. One table in run_config.cpp drives the parser and docs/CONFIG.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "kernels/gemm.h"
#include "model/config.h"
#include "parallel/dims.h"
#include "train/data.h"
#include "train/schedule.h"

namespace trex::train {

struct DataConfig {
  std::string mode = "cpt";             // cpt | sft
  std::vector<std::string> train, eval;  // files (.jsonl or text)
  double eval_fraction = 0.0;            // held-out share of train when eval is empty
  int64_t seq_len = 512;
  std::string chat_template = "deepseek";
  bool train_on_prompt = false;
  OverflowPolicy overflow = OverflowPolicy::Truncate;
  std::string tokenizer;  // tokenizer.json (default: <model.path>/tokenizer.json)
  std::string eos_token;  // end-of-document token (default: the tokenizer's usual one)
  // Pre-tokenized, memory-mapped documents (train/token_cache.h): a directory, "auto"
  // ($TREX_CACHE_DIR/tokens, else $XDG_CACHE_HOME/trex/tokens, else ~/.cache/trex/tokens) or "none".
  std::string cache_dir = "auto";
};

struct TrainConfig {
  int64_t batch_size = 1, grad_accum = 1, steps = 10, threads = 0, eval_every = 0, eval_batches = 4;
  uint64_t seed = 1234;
  kern::Prec precision = kern::Prec::BF16;
  std::string device = "cpu";  // "cpu" | "cuda" | "cuda:N" (train/device.h)
  float bias_update_gamma = 0.001f;
  double aux_loss_alpha = 0.0;
  double mtp_loss_weight = 0.0;  // DeepSeek-V4: > 0 trains the config's MTP blocks (loss += weight x MTP CE)
  model::Recompute recompute = model::Recompute::None;  // "none" | "full" | "selective" (model/config.h)
  unsigned recompute_modules = model::kRecomputeMoe;    // selective: model::RecomputeModule bits ("moe", "moe_act")
  // DeepSeek-V3.2 / V4 (CSA): > 0 trains the lightning indexer with its KL loss (loss += weight x indexer loss)
  double indexer_loss_weight = 0.0;
  model::IndexerStage indexer_stage = model::IndexerStage::Sparse;  // "sparse" | "dense_warmup"
  bool indexer_recall = false;  // report indexer_loss / indexer_recall with weight 0 too (forward only)
  int64_t max_skipped_steps = 3;  // stop after this many steps in a row with a NaN / Inf loss or gradient
  bool memory_check = true;       // refuse a run whose memory estimate exceeds the machine (train/preflight.h)
  // SIGTERM / SIGINT: finish the step, save a checkpoint, exit with kExitStopped (train/stop_signal.h).
  bool exit_signal_save = true;
};

struct OptimConfig {
  LrSchedule schedule;  // lr, min_lr, warmup_steps, decay_fraction, kind
  float weight_decay = 0.1f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, clip_grad_norm = 1.0f;
};

// Data, tensor, pipeline and expert parallel over MPI ranks (mpirun -np N trex train ...;
// docs/PARALLEL.md): N = dp x tp x pp; tp splits the attention heads and dense MLPs; pp splits
// the layers into stages run by a 1F1B schedule; ep divides dp, the routed experts are split over
// ep ranks.
struct ParallelConfig {
  int64_t dp = 0;  // data-parallel size; 0 = auto: the number of ranks / (tp x cp x pp)
  int64_t tp = 1, pp = 1, ep = 1;
  // Context-parallel size: each of cp ranks holds 2 of the 2 cp chunks of every sequence
  // (model/context_parallel.h). Needs data.seq_len divisible by 2 cp; DeepSeek-V3 / V3.2 / V2
  // and V4 models, with tp too (the V3.2 / V4 indexer loss and recall are refused with tp, as without cp).
  int64_t cp = 1;
  std::vector<int64_t> pp_layers;  // optional: decoder layers per stage (size pp; even split if empty)
  int64_t bucket_size = 4 << 20;  // slab elements per gradient bucket (0: one bucket)
  bool overlap = true;            // reduce-scatter each bucket as soon as the backward completes it
  bool overlap_params = true;     // with overlap: the parameter all-gather runs on into the next forward
  // With tp > 1: norms, MoE layers, embedding and head on each tp rank's shard of the tokens
  // (Megatron's sequence parallel; model/model.h TensorParallel). Needs data.seq_len >= tp.
  bool sequence_parallel = false;
  int64_t zero_stage = 1;         // 1: sharded optimizer state; 2: gradients sharded too (with pp: per stage)
  // More than one rank: no finished training step for this many seconds ends the whole job with
  // an error (a stuck or stopped rank would leave the others waiting in a collective). 0 = off.
  double watchdog_s = 600;
  // More than one rank: a peer rank whose heartbeat (parallel/heartbeat.h) is silent for this many
  // seconds is dead or cut off, and the whole job ends. > 0 and < watchdog_s (unless that is 0):
  // a dead peer is told from a slow step well before the watchdog's longer bound.
  double peer_timeout_s = 30;
};

struct CheckpointConfig {
  // The run directory (checkpoints/step-NNNNNNNN/, metrics.jsonl, config.resolved.json); the old
  // key checkpoint.dir is an alias that logs a deprecation warning.
  std::string run_dir = "runs/default";
  int64_t every = 0;  // 0: only at the end
  int64_t keep = 3;
  std::string resume = "none";  // none | auto | <checkpoint dir>
};

struct LogConfig {
  int64_t every = 1;
  std::string progress = "auto";  // auto | bar | lines
  int64_t spike_window = 100;     // losses in the loss-spike window (train/loss_spikes.h)
  double spike_z = 4.0;           // a loss above window mean + spike_z x std is a spike; 0 = off
  std::string trace;              // Chrome trace (core/trace.h) of the first trace_steps steps; "" = off
  int64_t trace_steps = 5;
  bool expert_loads = false;      // metrics.jsonl: tokens routed to each expert, per MoE layer and step
};

struct RunConfig {
  model::ModelConfig model;
  std::string model_path;  // checkpoint directory when [model].path is set
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  LogConfig log;
  nlohmann::json raw;  // the merged config as read (saved next to checkpoints)
};

// The parallel layout of a run launched on world_size ranks (parallel.dp = 0: world_size / tp),
// validated against the world size and the model (parallel/dims.h): throws trex::UserError.
parallel::ParallelDims resolve_parallel(const RunConfig& rc, int world_size);

// overrides: "section.key=value" or "section.table.key=value" (value parsed as JSON when it parses,
// else as a TOML table, array or single-quoted string, else taken as a string).
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {});
RunConfig parse_run_config(nlohmann::json j, const std::string& where, const std::vector<std::string>& overrides = {});
kern::Prec parse_precision(const std::string& s, const std::string& where);
// docs/CONFIG.md: every section and key with its type, default and meaning, from the table the
// parser reads (`trex config reference` prints it).
std::string run_config_reference();

// model::RecomputeModule bits as the TOML value of train.recompute_modules: ["moe", "mhc"].
std::string recompute_modules_toml(unsigned bits);

}  // namespace trex::train
