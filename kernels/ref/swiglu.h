// Scalar reference for SwiGLU (the canonical definition). Per row n and column j < F, with
// g = gu[n, j], u = gu[n, F + j]:
//   limit > 0:  g <- min(g, limit), u <- clamp(u, -limit, limit)   (NaN stays NaN)
//   s = sigmoid(g) = 1 / (1 + exp(-g)),  h = g * s * u
// Backward (dgu OVERWRITES):
//   dgu[n, j]     = dh * u * s * (1 + g * (1 - s))   (0 when limit > 0 and not g_in <= limit)
//   dgu[n, F + j] = dh * g * s                        (0 when limit > 0 and not -limit <= u_in <= limit)
#pragma once
#include <cmath>
#include <cstdint>
#include "kernels/hd/swiglu.h"

namespace trex::kern::ref {

// gu: [N, 2F] -> h: [N, F]
template <class T>
void swiglu_fwd(const T* gu, int64_t N, int64_t F, T limit, T* h) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < F; ++j) h[n * F + j] = hd::swiglu_fwd(gu[n * 2 * F + j], gu[n * 2 * F + F + j], limit);
}

// dh: [N, F]  gu: [N, 2F] -> dgu: [N, 2F] (overwritten)
template <class T>
void swiglu_bwd(const T* dh, const T* gu, int64_t N, int64_t F, T limit, T* dgu) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < F; ++j)
      hd::swiglu_bwd(dh[n * F + j], gu[n * 2 * F + j], gu[n * 2 * F + F + j], limit, dgu[n * 2 * F + j],
                     dgu[n * 2 * F + F + j]);
}

}  // namespace trex::kern::ref
