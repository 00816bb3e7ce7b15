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

namespace trex::kern::ref {

template <class T>
T swiglu_sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// gu: [N, 2F] -> h: [N, F]
template <class T>
void swiglu_fwd(const T* gu, int64_t N, int64_t F, T limit, T* h) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < F; ++j) {
      T g = gu[n * 2 * F + j], u = gu[n * 2 * F + F + j];
      if (limit > 0) {
        if (g > limit) g = limit;
        if (u > limit) u = limit;
        if (u < -limit) u = -limit;
      }
      h[n * F + j] = g * swiglu_sigmoid(g) * u;
    }
}

// dh: [N, F]  gu: [N, 2F] -> dgu: [N, 2F] (overwritten)
template <class T>
void swiglu_bwd(const T* dh, const T* gu, int64_t N, int64_t F, T limit, T* dgu) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < F; ++j) {
      const T g_in = gu[n * 2 * F + j], u_in = gu[n * 2 * F + F + j];
      T g = g_in, u = u_in;
      bool pass_g = true, pass_u = true;
      if (limit > 0) {
        pass_g = g_in <= limit;
        pass_u = u_in >= -limit && u_in <= limit;
        if (g > limit) g = limit;
        if (u > limit) u = limit;
        if (u < -limit) u = -limit;
      }
      const T s = swiglu_sigmoid(g), d = dh[n * F + j];
      dgu[n * 2 * F + j] = pass_g ? d * u * s * (T(1) + g * (T(1) - s)) : T(0);
      dgu[n * 2 * F + F + j] = pass_u ? d * g * s : T(0);
    }
}

}  // namespace trex::kern::ref
