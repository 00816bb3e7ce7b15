// One AdamW element update in torch's order of operations (kernels/adamw.h). The per-step
// scalars are formed once on the host (kernels/ref/adamw.h: AdamWScalars) and passed in.
#pragma once
#include "kernels/hd/hd.h"

namespace trex::kern::hd {

template <class T>
struct AdamWConsts {
  T decay, lerp_w, b2, c2, neg_step, bc2_sqrt, eps, gscale;
  bool lerp_small;  // torch's lerp: |w| < 0.5 -> m + w (g - m), else g - (g - m)(1 - w)
};

// p, m, v updated in place from the gradient g.
template <class T>
TREX_HD void adamw_update(const AdamWConsts<T>& s, T& p, T g, T& m, T& v) {
  const T gi = g * s.gscale;
  T pi = p * s.decay;
  const T mi = s.lerp_small ? m + s.lerp_w * (gi - m) : gi - (gi - m) * (T(1) - s.lerp_w);
  const T vi = v * s.b2 + s.c2 * gi * gi;
  const T denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
  p = pi + s.neg_step * mi / denom;
  m = mi;
  v = vi;
}

}  // namespace trex::kern::hd
