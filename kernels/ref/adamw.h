// Scalar reference for AdamW (the canonical definition; torch.optim.AdamW _single_tensor_adam
// with decoupled weight decay) and for the sum of squares. The f32 scalars are formed in double
// and rounded once, as torch does with its Python-float hyperparameters.
#pragma once
#include <cmath>
#include <cstdint>
#include "core/dtype.h"
#include "kernels/adamw.h"
#include "kernels/hd/adamw.h"

namespace trex::kern::ref {

// The per-step scalars, in the element type T.
template <class T>
struct AdamWScalars {
  T decay, lerp_w, b2, c2, neg_step, bc2_sqrt, eps, gscale;
  bool lerp_small;  // torch's lerp: |w| < 0.5 -> m + w*(g - m), else g - (g - m)*(1 - w)
  explicit AdamWScalars(const AdamWParams& hp) {
    const double t = static_cast<double>(hp.step);
    decay = static_cast<T>(1.0 - hp.lr * hp.weight_decay);
    lerp_w = static_cast<T>(1.0 - hp.beta1);
    lerp_small = std::abs(static_cast<float>(1.0 - hp.beta1)) < 0.5f;  // torch tests the f32 weight
    b2 = static_cast<T>(hp.beta2);
    c2 = static_cast<T>(1.0 - hp.beta2);
    neg_step = static_cast<T>(-(hp.lr / (1.0 - std::pow(hp.beta1, t))));
    bc2_sqrt = static_cast<T>(std::sqrt(1.0 - std::pow(hp.beta2, t)));
    eps = static_cast<T>(hp.eps);
    gscale = static_cast<T>(hp.grad_scale);
  }
  hd::AdamWConsts<T> consts() const { return {decay, lerp_w, b2, c2, neg_step, bc2_sqrt, eps, gscale, lerp_small}; }
};

// p, g, m, v: [n] (in place)  p_bf16: [n] or null (only for T = float)
template <class T>
void adamw_step(const AdamWParams& hp, T* p, const T* g, T* m, T* v, int64_t n, bf16* p_bf16 = nullptr) {
  const AdamWScalars<T> s(hp);
  const hd::AdamWConsts<T> c = s.consts();
  for (int64_t i = 0; i < n; ++i) {
    hd::adamw_update(c, p[i], g[i], m[i], v[i]);
    if (p_bf16) p_bf16[i] = f32_to_bf16(static_cast<float>(p[i]));
  }
}

// x: [n] -> sum x^2 in double, sequential.
template <class T>
double sum_squares(const T* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

}  // namespace trex::kern::ref
