// Scalar reference for RMSNorm (the canonical definition; HF DeepseekV3RMSNorm in fp32):
//   rstd[n] = 1 / sqrt(sum_j x[n,j]^2 / d + eps)
//   y[n,j]  = w[j] * (x[n,j] * rstd[n])
// Backward, with xhat = x * rstd and g = dy * w:
//   dx[n,j] = rstd[n] * (g[n,j] - xhat[n,j] * mean_j(g[n,:] * xhat[n,:]))   (OVERWRITES)
//   dw[j]  += sum_n dy[n,j] * xhat[n,j]                                      (ACCUMULATES)
#pragma once
#include <cmath>
#include <cstdint>
#include "kernels/hd/rmsnorm.h"

namespace trex::kern::ref {

// x: [N, d]  w: [d] -> y: [N, d]  rstd: [N] (may be null)
template <class T>
void rmsnorm_fwd(const T* x, int64_t N, int64_t d, const T* w, T eps, T* y, T* rstd) {
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * d;
    T* yr = y + n * d;
    T ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += xr[j] * xr[j];
    T r = hd::rms_rstd(ss, d, eps);
    if (rstd) rstd[n] = r;
    for (int64_t j = 0; j < d; ++j) yr[j] = hd::rms_y(xr[j], w[j], r);
  }
}

// dy, x: [N, d]  w: [d]  rstd: [N] -> dx: [N, d] (overwritten)  dw: [d] (+=)
template <class T>
void rmsnorm_bwd(const T* dy, const T* x, int64_t N, int64_t d, const T* w, const T* rstd, T* dx, T* dw) {
  for (int64_t n = 0; n < N; ++n) {
    const T* dyr = dy + n * d;
    const T* xr = x + n * d;
    T* dxr = dx + n * d;
    const T r = rstd[n];
    T s = 0;  // sum_j g * xhat
    for (int64_t j = 0; j < d; ++j) s += dyr[j] * w[j] * (xr[j] * r);
    const T m = s / static_cast<T>(d);
    for (int64_t j = 0; j < d; ++j) {
      dxr[j] = hd::rms_dx(dyr[j], xr[j], w[j], r, m);
      dw[j] += dyr[j] * (xr[j] * r);
    }
  }
}

}  // namespace trex::kern::ref
