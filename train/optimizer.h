// AdamW over the model's parameter slab, exactly as torch.optim.AdamW (decoupled weight
// decay, bias-corrected moments in f32), with global grad-norm clipping as
// torch.nn.utils.clip_grad_norm_ and weight decay only on matrices (not norms or biases).
#pragma once
#include "core/arena.h"
#include "model/model.h"

namespace trex::train {

struct AdamWConfig {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float clip_grad_norm = 1.0f;  // <= 0 disables clipping
};

class AdamW {
 public:
  AdamW(const model::Model& m, AdamWConfig cfg);
  // Clips, updates the f32 master weights and the bf16 shadow; returns the pre-clip grad norm.
  // A non-finite norm (NaN / Inf in any gradient) changes nothing: no update, no moment update,
  // the step counter stays (the caller counts it as a skipped step).
  double step(model::Model& m, float lr);
  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }  // when resuming from a checkpoint
  AdamWConfig cfg;
  Arena m1, m2;  // first and second moments, f32 [layout.total]

 private:
  int64_t t_ = 0;
};

// Global L2 norm of all parameter gradients (each tensor once, deterministic).
double grad_norm(const model::Model& m);

}  // namespace trex::train
