// Scalar reference of LayerNorm (torch.nn.LayerNorm with weight and bias), forward and backward,
// in any floating type (double for the finite-difference checks of the op harness).
//   y[n, :] = (x[n, :] - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps), var biased
//   backward, with xh = (x - mean) * rstd and g = dy * w:
//     dx = rstd * (g - mean(g) - xh * mean(g * xh)),  dw += sum_n dy * xh,  db += sum_n dy
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace trex::kern::ref {

// x: [N, d]  w, b: [d] -> y: [N, d]
template <class T>
void layernorm_fwd(const T* x, int64_t N, int64_t d, const T* w, const T* b, double eps, T* y) {
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * d;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mean += (double)xr[i];
    mean /= (double)d;
    for (int64_t i = 0; i < d; ++i) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
    const double rstd = 1.0 / std::sqrt(var / (double)d + eps);
    for (int64_t i = 0; i < d; ++i) y[n * d + i] = (T)(((double)xr[i] - mean) * rstd * (double)w[i] + (double)b[i]);
  }
}

// dy, x: [N, d]  w: [d] -> dx: [N, d] (overwritten), dw, db: [d] (accumulated, rows in order)
template <class T>
void layernorm_bwd(const T* dy, const T* x, int64_t N, int64_t d, const T* w, double eps, T* dx, T* dw, T* db) {
  std::vector<double> sw(d, 0.0), sb(d, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * d;
    const T* g = dy + n * d;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mean += (double)xr[i];
    mean /= (double)d;
    for (int64_t i = 0; i < d; ++i) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
    const double rstd = 1.0 / std::sqrt(var / (double)d + eps);
    double mg = 0, mgx = 0;
    for (int64_t i = 0; i < d; ++i) {
      const double xh = ((double)xr[i] - mean) * rstd, gw = (double)g[i] * (double)w[i];
      mg += gw, mgx += gw * xh;
      sw[i] += (double)g[i] * xh, sb[i] += (double)g[i];
    }
    mg /= (double)d, mgx /= (double)d;
    for (int64_t i = 0; i < d; ++i) {
      const double xh = ((double)xr[i] - mean) * rstd, gw = (double)g[i] * (double)w[i];
      dx[n * d + i] = (T)(rstd * (gw - mg - xh * mgx));
    }
  }
  for (int64_t i = 0; i < d; ++i) dw[i] = (T)((double)dw[i] + sw[i]), db[i] = (T)((double)db[i] + sb[i]);
}

}  // namespace trex::kern::ref
