// AdamW over the model's parameter slab, exactly as torch.optim.AdamW (decoupled weight
// decay, bias-corrected moments in f32), with global grad-norm clipping as
// torch.nn.utils.clip_grad_norm_ and weight decay only on matrices (not norms or biases).
//
// The optimizer owns a set of slab ranges: all of it on one rank, or, under data parallelism
// with ZeRO-1 (train/dist.h), this rank's shard of every gradient bucket. Its moments cover the
// owned ranges only, packed in the order given ("state" index); each owned element keeps the
// settings of the parameter it belongs to (weight decay, frozen), and elements between
// parameters (alignment gaps, bucket padding) are never updated.
#pragma once
#include <span>
#include <vector>
#include "core/arena.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace trex::train {

struct AdamWConfig {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float clip_grad_norm = 1.0f;  // <= 0 disables clipping
};

// Slab elements [begin, end).
struct SlabRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// The part of one parameter (layout.entries[entry]) that the optimizer owns: slab elements
// [off, off + n) whose moments sit at [state, state + n).
struct AdamWPiece {
  int64_t off = 0, n = 0, state = 0;
  int entry = 0;
  bool decay = false, frozen = false;
};

class AdamW {
 public:
  // Every parameter of the model; moments [layout.total] indexed like the slab.
  AdamW(const model::Model& m, AdamWConfig cfg);
  // ZeRO-1: only `owned` (disjoint slab ranges, each within the slab or its padding); moments
  // [sum of owned sizes], range after range.
  AdamW(const model::Model& m, AdamWConfig cfg, std::span<const SlabRange> owned);

  // Clips, updates the f32 master weights and the bf16 shadow; returns the pre-clip grad norm.
  // A non-finite norm (NaN / Inf in any gradient) changes nothing: no update, no moment update,
  // the step counter stays (the caller counts it as a skipped step). Whole-slab optimizers only.
  double step(model::Model& m, float lr);
  // The update of the owned pieces given the global pre-clip gradient norm (data parallel: summed
  // over ranks by the caller). Returns false, changing nothing, when the norm is not finite.
  bool apply(model::Model& m, float lr, double norm);

  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }  // when resuming from a checkpoint
  bool owns_all() const { return owns_all_; }
  int64_t state_elems() const { return state_elems_; }
  const std::vector<SlabRange>& owned() const { return owned_; }
  const std::vector<AdamWPiece>& pieces() const { return pieces_; }  // in slab-range order
  // The host copies of the moments (checkpoints, ZeRO gathers). A model on a device backend
  // (model::Model::on_device) is updated with copies in the backend's memory: state_to_host()
  // brings them back before the host reads M1() / M2(); host_state_changed() after the host wrote
  // them (a resume) sends them again at the next update.
  float* M1() const { return reinterpret_cast<float*>(m1.base()); }
  float* M2() const { return reinterpret_cast<float*>(m2.base()); }
  void state_to_host();
  void host_state_changed() { dev_stale_ = true; }

  AdamWConfig cfg;
  Arena m1, m2;  // first and second moments, f32 [state_elems()]

 private:
  kern::DeviceBuffer<float> dm1_, dm2_;  // on a device backend
  bool dev_stale_ = true;
  void init(const model::Model& m, std::span<const SlabRange> owned);
  int64_t t_ = 0;
  bool owns_all_ = false;
  int64_t state_elems_ = 0;
  std::vector<SlabRange> owned_;
  std::vector<AdamWPiece> pieces_;
};

// Global L2 norm of all parameter gradients (each tensor once, deterministic).
double grad_norm(const model::Model& m);

}  // namespace trex::train
