// RMSNorm's per-element formulas (kernels/rmsnorm.h): the row reductions (sum x^2, sum g xhat)
// are each caller's own (a loop on the CPU, a block reduction on a GPU); what is done with them
// is written once here.
#pragma once
#include "kernels/hd/hd.h"

namespace trex::kern::hd {

// sum_j x^2 over a row of d -> rstd = 1 / sqrt(ss / d + eps)
template <class T>
TREX_HD T rms_rstd(T ss, long long d, T eps) {
  return T(1) / std::sqrt(ss / static_cast<T>(d) + eps);
}

// y = w * (x * rstd)
template <class T>
TREX_HD T rms_y(T x, T w, T rstd) {
  return w * (x * rstd);
}

// With m = mean_j(dy w xhat) of the row: dx = rstd (dy w - xhat m); the dw term is dy xhat.
template <class T>
TREX_HD T rms_dx(T dy, T x, T w, T rstd, T m) {
  return rstd * (dy * w - (x * rstd) * m);
}

}  // namespace trex::kern::hd
