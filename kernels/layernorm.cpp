#include "kernels/layernorm.h"

#include <cmath>
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

}  // namespace trex::kern
