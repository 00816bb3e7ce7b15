// Start-up checks of a training run (issue 9): what would fail an hour in is refused before the
// first step, with the field to change.
//   - memory: an estimate of what this rank holds (below), times the ranks on this machine,
//     against the memory available now (MemAvailable, at most the cgroup limit); over it, the
//     run is refused; train.memory_check = false skips the check.
//   - run directory: created and probed with a write (checkpoint.run_dir).
// Data files are read before the model is built (train/loop.cpp), so an unreadable one already
// fails before any allocation.
//
// Memory estimate per rank (bytes; P parameters, R ranks in all, T tokens per micro-batch):
//   weights     4 P (f32 master) + 2 P in bf16 mode (the shadow the matmuls read); P counts what
//               the rank holds: with expert parallel its ep rank's routed experts only, with
//               pipeline parallel its stage's tensors only (the largest stage's)
//   grads       4 P (f32; the same P); ZeRO-2 (parallel.zero_stage = 2, more than one rank): the
//               rank's shard (half the moments' bytes; twice that with grad_accum > 1, the
//               accumulator) + 4 (the largest layer's P + 4 buckets), at most 4 P
//   optimizer   8 P / R (AdamW moments, ZeRO-1 shard over every rank; pipeline parallel: the
//               largest stage's tensors over that stage's R / pp ranks)
//   activations the peak of the activation arena (Model::peak_activation_bytes) for one micro-batch
//               of batch_size x seq_len tokens: activation_peak_bytes (train/activation_estimate.h)
//   buffers     data parallel: the planner's (plan/memory.h) copies of the in-flight buckets
//               (ZeRO-2: of the 2 buckets it keeps in flight)
//   runtime     kRuntimeBytes (core/host_memory.h): libraries, threads, per-thread scratch, heap
// It is checked against measured peak RSS in RELIABILITY.md.
#pragma once
#include <cstdint>
#include <string>
#include "core/host_memory.h"
#include "plan/memory.h"
#include "train/activation_estimate.h"
#include "train/run_config.h"

namespace trex::train {

struct MemoryEstimate {
  double weights = 0, grads = 0, optimizer = 0, activations = 0;
  double buffers = 0;  // data parallel: the MPI library's copies of the in-flight gradient buckets
  double runtime = kRuntimeBytes;
  double total() const { return weights + grads + optimizer + activations + buffers + runtime; }
};

MemoryEstimate estimate_train_memory(const RunConfig& rc, int ranks);

// The model's training options from the run config's [train] section: what trex train builds the
// model with, and so what the estimate counts.
model::TrainOptions train_options(const RunConfig& rc);


// The memory per device this check counts for a planner layout run on trex's own engine
// (`trex plan --cluster cpu-this`: plan::ClusterSpec::engine_memory, installed by the CLI): the
// run of a.config with batch_size = mbs, seq_len = seq, grad_accum = gbs / (mbs dp), bf16, the
// layout's dp, tp (with sequence_parallel, as the planner assumes), cp, ep, pp and ZeRO stage, MTP
// and the indexer loss trained where the layout says so, and its recompute as trex's: none, full,
// selective = recompute_modules ["moe"] (the default), mlp = ["moe_act", "shared_experts"] (the
// routed and shared experts' SwiGLU outputs), selective+mlp = all three. Every pipeline rank gets
// the estimate's figures (the largest stage's). False, out untouched, for a layout the engine does
// not run: no parsed config, DualPipe, vp > 1, etp > 1, a precision other than bf16, ZeRO 0 or 3.
bool layout_memory(const plan::ArchModel& a, const plan::Layout& l, plan::RankMemory& out);

// The selective recompute modules the memory refusal names first: the first of the model's module
// sets, fastest first, whose estimate times local_ranks fits in `have` bytes, as the TOML value of
// train.recompute_modules, skipping the set the run already uses; "" when none fits. The sets: no MoE replay
// (["moe_act", "moe_out", "shared_experts"], DeepSeek-V4 with "mhc" and "mla_up_proj"), then the
// MoE blocks replayed (["moe"], V4 with the same two).
std::string fitting_recompute_modules(const RunConfig& rc, int ranks, int local_ranks, double have);

// Refuses (UserError) a run whose estimate, times the ranks that share this machine
// (local_ranks: mpirun's ranks on this node), exceeds available_memory_bytes(), naming the parts
// and what to change. Returns the estimate (of one rank).
MemoryEstimate check_memory(const RunConfig& rc, int ranks, int local_ranks = 1);

// Creates `dir` and writes a probe file into it; UserError naming checkpoint.run_dir otherwise.
void check_run_dir_writable(const std::string& dir);

}  // namespace trex::train
