// Memory per device of a layout: parameters, gradients, optimizer state (each sharded per the
// ZeRO stage), activations of the micro-batches a pipeline rank holds in flight, and transient
// communication buffers. Formulas (docs/PLAN.md lists the saved tensors of each layer kind):
//   params    = 2 B x (dense/tp [/dp under ZeRO-3] + experts/(ep*etp) [/edp under ZeRO-3])
//   grads     = grad_bytes x (same split; /dp and /edp from ZeRO-2)
//   optimizer = (4 B f32 master + 2 x moment_bytes) x (same split; /dp and /edp from ZeRO-1)
//   activations (one micro-batch of mbs*seq/tp tokens; tp > 1 assumes sequence parallelism):
//     none       sum over the stage's layers of every saved tensor
//     selective  without the tensors recomputed in backward (norm outputs, MLA up-projections,
//                SwiGLU outputs, V4 compressor/indexer projections)
//     full       the layer inputs only, plus one layer's full set as the recompute working set
//     +mlp       (recompute=mlp, selective+mlp) also without the dense MLP's fc1 / SwiGLU outputs
//                and the routed SwiGLU output (SavedTensor::mlp)
//   held in flight: 1F1B rank r min(pp - r, m) micro-batches; DualPipe (pp + 1) chunk's worth;
//   the last stage adds one micro-batch of f32 logits [tokens, vocab].
// A spec whose devices run trex (cpu-this, ClusterSpec::engine_memory installed): every rank's
// parameters, gradients, optimizer state, activations and buffers are what trex train's start-up
// memory check counts for the same run (train/preflight.h; its activations are the engine's
// arena replayed on sizes, its parameters those of the engine's own tensors), so a plan that fits
// is a run the check admits; the formulas above stay for layouts the engine does not run.
#pragma once
#include <vector>
#include "plan/arch.h"
#include "plan/layout.h"
#include "plan/spec.h"

namespace trex::plan {

// Saved bytes per token of one layer (before the tp split) under a recompute mode; cached_bytes > 0
// (a low-precision recipe, PrecisionModel::cached_bytes) stores GEMM/SwiGLU inputs in that many
// bytes (fp8 block: 1 + 4/128).
// elem_bytes > 0: every saved element takes that many bytes instead of its bf16-run size
// (ClusterSpec::activation_bytes: trex's CPU engine keeps activations in f32).
// mlp: recompute=mlp also drops the tensors marked SavedTensor::mlp (not under full recompute).
double saved_bytes_per_token(const LayerCost& l, Recompute r, double cached_bytes, double expert_load = 1.0,
                             double elem_bytes = 0, bool mlp = false);

struct RankMemory {
  int64_t rank = 0;           // pipeline rank
  int64_t layers = 0;         // decoder layers held (two chunks under DualPipe)
  bool embed = false, head = false;
  double dense_params = 0, expert_params = 0;  // parameter counts held (before ZeRO-3)
  double params = 0, grads = 0, optimizer = 0, activations = 0, buffers = 0;  // bytes
  double inflight = 0;        // micro-batches of activations held
  double total() const { return params + grads + optimizer + activations + buffers; }
};

struct MemoryReport {
  std::vector<RankMemory> ranks;  // one per pipeline rank
  int64_t worst = 0;              // rank with the largest total
  double usable = 0;              // device memory minus the runtime reserve
  bool fits = false;
  bool engine = false;            // the figures of the engine's start-up check (ClusterSpec::engine_memory)
  // Activation bytes per token of one MoE layer (or the first layer) under none / selective /
  // full recompute, for the report.
  double act_per_token_layer[3] = {0, 0, 0};
  const RankMemory& peak() const { return ranks[worst]; }
};

MemoryReport plan_memory(const ArchModel& a, const ClusterSpec& s, const Layout& l);

}  // namespace trex::plan
