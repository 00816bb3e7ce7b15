// AdamW as torch.optim.AdamW (non-fused, foreach=False, amsgrad=False, maximize=False), one
// tensor at a time, and the sum of squares used for global gradient-norm clipping.
// Gradients: none (this is the optimizer; p, m, v are updated in place).
#pragma once
#include <cstdint>
#include "core/dtype.h"

namespace trex::kern {

// Hyperparameters are double like the Python floats torch computes its scalars from (1 - lr*wd,
// 1 - beta^t, lr / bias_c1 are formed in double and rounded to f32 once, as torch does).
struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;            // 1-based: the step being taken (torch's state["step"] after += 1)
  float grad_scale = 1.f;  // g = grad * grad_scale (the clipping factor; f32 like torch's clip_coef)
};

// One AdamW step on n elements (f32 math, torch's order of operations):
//   g = grad * grad_scale
//   p *= 1 - lr*wd
//   m = lerp(m, g, 1 - beta1)                  (= beta1*m + (1-beta1)*g)
//   v = v*beta2 + (1-beta2)*g*g
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p += -(lr / (1 - beta1^t)) * m / denom
// p, g, m, v: [n] f32  ->  p, m, v updated in place; p_bf16: [n] bf16 copy of the new p
// (round to nearest even), or nullptr to skip.
void adamw_step(const AdamWParams& hp, float* p, const float* g, float* m, float* v, int64_t n,
                bf16* p_bf16 = nullptr);

// x: [n] -> sum of x^2 accumulated in double. Deterministic: fixed-size blocks summed in a fixed
// order, so the result does not depend on the thread count.
double sum_squares(const float* x, int64_t n);

// The sum over segments i < n of sum_squares(base + offsets[i], sizes[i]), added in segment order
// (offsets and sizes: host arrays). One call for a model's gradient norm, so that a device backend
// returns it with one wait instead of one per tensor.
double sum_squares_segments(const float* base, const int64_t* offsets, const int64_t* sizes, int n);

}  // namespace trex::kern
