#include "kernels/layernorm.h"

#include <cmath>
#include <vector>
#include "core/error.h"
#include "core/parallel.h"

namespace trex::kern {

void layernorm_fwd(const float* x, int64_t N, int64_t d, const float* w, const float* b, float eps, float* y) {
  TREX_CHECK(N >= 0 && d > 0 && eps >= 0, "layernorm_fwd: N=", N, " d=", d, " eps=", eps);
  if (N == 0) return;
  TREX_CHECK(x && w && b && y, "layernorm_fwd: null pointer");
  parallel_for(N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* xr = x + n * d;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < d; ++i) mean += xr[i];
      mean /= (double)d;
      for (int64_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
      const double rstd = 1.0 / std::sqrt(var / (double)d + eps);
      float* yr = y + n * d;
      for (int64_t i = 0; i < d; ++i) yr[i] = (float)((xr[i] - mean) * rstd * w[i] + b[i]);
    }
  });
}

namespace {

// Mean and 1 / sqrt(var + eps) of one row, in double.
void row_stats(const float* xr, int64_t d, float eps, double& mean, double& rstd) {
  mean = 0;
  double var = 0;
  for (int64_t i = 0; i < d; ++i) mean += xr[i];
  mean /= (double)d;
  for (int64_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
  rstd = 1.0 / std::sqrt(var / (double)d + eps);
}

}  // namespace

void layernorm_bwd(const float* dy, const float* x, int64_t N, int64_t d, const float* w, float eps, float* dx,
                   float* dw, float* db) {
  TREX_CHECK(N >= 0 && d > 0 && eps >= 0, "layernorm_bwd: N=", N, " d=", d, " eps=", eps);
  if (N == 0) return;
  TREX_CHECK(dy && x && w && dx && dw && db, "layernorm_bwd: null pointer");
  std::vector<double> st((size_t)(2 * N));  // per row: mean, rstd
  parallel_for(N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* xr = x + n * d;
      const float* g = dy + n * d;
      double mg = 0, mgx = 0;
      row_stats(xr, d, eps, st[2 * n], st[2 * n + 1]);
      const double mean = st[2 * n], rstd = st[2 * n + 1];
      for (int64_t i = 0; i < d; ++i) {
        const double gw = (double)g[i] * w[i];
        mg += gw, mgx += gw * (xr[i] - mean) * rstd;
      }
      mg /= (double)d, mgx /= (double)d;
      for (int64_t i = 0; i < d; ++i)
        dx[n * d + i] = (float)(rstd * ((double)g[i] * w[i] - mg - (xr[i] - mean) * rstd * mgx));
    }
  });
  parallel_for(d, 8, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      double sw = 0, sb = 0;
      for (int64_t n = 0; n < N; ++n) {
        const double mean = st[2 * n], rstd = st[2 * n + 1];
        sw += (double)dy[n * d + i] * (x[n * d + i] - mean) * rstd;
        sb += dy[n * d + i];
      }
      dw[i] = (float)(dw[i] + sw), db[i] = (float)(db[i] + sb);
    }
  });
}

}  // namespace trex::kern
