// SwiGLU of one (gate, up) pair, forward and backward, with DeepSeek-V4's optional clamp
// (kernels/swiglu.h states the semantics; kernels/ref/swiglu.h and kernels/cuda/ use these).
#pragma once
#include "kernels/hd/hd.h"

namespace trex::kern::hd {

template <class T>
TREX_HD T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// limit > 0: gate = min(gate, limit), up = clamp(up, -limit, limit) (NaN stays NaN).
template <class T>
TREX_HD void swiglu_clamp(T& g, T& u, T limit) {
  if (limit > 0) {
    if (g > limit) g = limit;
    if (u > limit) u = limit;
    if (u < -limit) u = -limit;
  }
}

// h = silu(g) * u after the clamp.
template <class T>
TREX_HD T swiglu_fwd(T g, T u, T limit) {
  swiglu_clamp(g, u, limit);
  return g * sigmoid(g) * u;
}

// dh -> (dg, du) for inputs (g_in, u_in); zero where the clamp cut the value (torch.clamp's
// gradient passes inside the bounds, bounds included; NaN gets zero).
template <class T>
TREX_HD void swiglu_bwd(T dh, T g_in, T u_in, T limit, T& dg, T& du) {
  T g = g_in, u = u_in;
  bool pass_g = true, pass_u = true;
  if (limit > 0) {
    pass_g = g_in <= limit;
    pass_u = u_in >= -limit && u_in <= limit;
  }
  swiglu_clamp(g, u, limit);
  const T s = sigmoid(g);
  dg = pass_g ? dh * u * s * (T(1) + g * (T(1) - s)) : T(0);
  du = pass_u ? dh * g * s : T(0);
}

}  // namespace trex::kern::hd
