// AVX-512 RMSNorm. Forward: one pass over each row for sum(x^2), one for y (the row stays in
// L1/L2). Backward: rows are cut into at most kChunks chunks whose size depends only on N; each
// chunk accumulates its partial dw in its own slice of a per-calling-thread scratch, and the
// partials are then added in chunk order, column-parallel. dw is therefore bitwise the same for
// any thread count.
#include "kernels/cpu/rmsnorm_avx512.h"
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <vector>
#include "core/aligned.h"
#include "core/parallel.h"
#include "kernels/cpu/simd_avx512.h"

namespace trex::kern::cpu {
namespace {

constexpr int64_t kChunks = 64;  // max row chunks for the dw partials (scratch: kChunks x d)

using avx512::hsum;  // fixed order
using avx512::tail_mask;

// sum_j x[j]^2 over one row of length d.
inline float row_sumsq(const float* x, int64_t d) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 64 <= d; j += 64) {
    __m512 v0 = _mm512_loadu_ps(x + j), v1 = _mm512_loadu_ps(x + j + 16);
    __m512 v2 = _mm512_loadu_ps(x + j + 32), v3 = _mm512_loadu_ps(x + j + 48);
    a0 = _mm512_fmadd_ps(v0, v0, a0);
    a1 = _mm512_fmadd_ps(v1, v1, a1);
    a2 = _mm512_fmadd_ps(v2, v2, a2);
    a3 = _mm512_fmadd_ps(v3, v3, a3);
  }
  for (; j + 16 <= d; j += 16) {
    __m512 v = _mm512_loadu_ps(x + j);
    a0 = _mm512_fmadd_ps(v, v, a0);
  }
  if (j < d) {
    __m512 v = _mm512_maskz_loadu_ps(tail_mask(d - j), x + j);
    a1 = _mm512_fmadd_ps(v, v, a1);
  }
  return hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// sum_j dy[j] * w[j] * x[j] over one row.
inline float row_dot3(const float* dy, const float* w, const float* x, int64_t d) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  int64_t j = 0;
  for (; j + 32 <= d; j += 32) {
    a0 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(dy + j), _mm512_loadu_ps(w + j)),
                         _mm512_loadu_ps(x + j), a0);
    a1 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(dy + j + 16), _mm512_loadu_ps(w + j + 16)),
                         _mm512_loadu_ps(x + j + 16), a1);
  }
  for (; j < d; j += 16) {
    __mmask16 k = j + 16 <= d ? __mmask16(0xFFFF) : tail_mask(d - j);
    a0 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, dy + j), _mm512_maskz_loadu_ps(k, w + j)),
                         _mm512_maskz_loadu_ps(k, x + j), a0);
  }
  return hsum(_mm512_add_ps(a0, a1));
}

void fwd_rows(const float* x, int64_t b, int64_t e, int64_t d, const float* w, float eps, float* y,
              float* rstd) {
  for (int64_t n = b; n < e; ++n) {
    const float* xr = x + n * d;
    float* yr = y + n * d;
    const float r = 1.0f / std::sqrt(row_sumsq(xr, d) / static_cast<float>(d) + eps);
    if (rstd) rstd[n] = r;
    const __m512 vr = _mm512_set1_ps(r);
    for (int64_t j = 0; j < d; j += 16) {
      __mmask16 k = j + 16 <= d ? __mmask16(0xFFFF) : tail_mask(d - j);
      __m512 xh = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, xr + j), vr);
      _mm512_mask_storeu_ps(yr + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + j), xh));
    }
  }
}

// Rows [b, e): dx overwritten, dw partial accumulated into part[0, d).
void bwd_rows(const float* dy, const float* x, int64_t b, int64_t e, int64_t d, const float* w,
              const float* rstd, float* dx, float* part) {
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t n = b; n < e; ++n) {
    const float* dyr = dy + n * d;
    const float* xr = x + n * d;
    float* dxr = dx + n * d;
    const float r = rstd[n];
    const float m = row_dot3(dyr, w, xr, d) * r * inv_d;  // mean(dy * w * xhat)
    const __m512 vr = _mm512_set1_ps(r), vm = _mm512_set1_ps(m);
    for (int64_t j = 0; j < d; j += 16) {
      __mmask16 k = j + 16 <= d ? __mmask16(0xFFFF) : tail_mask(d - j);
      __m512 g = _mm512_maskz_loadu_ps(k, dyr + j);
      __m512 xh = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, xr + j), vr);
      __m512 gw = _mm512_mul_ps(g, _mm512_maskz_loadu_ps(k, w + j));
      _mm512_mask_storeu_ps(dxr + j, k, _mm512_mul_ps(vr, _mm512_fnmadd_ps(xh, vm, gw)));
      _mm512_mask_storeu_ps(part + j, k, _mm512_fmadd_ps(g, xh, _mm512_maskz_loadu_ps(k, part + j)));
    }
  }
}

}  // namespace

void rmsnorm_fwd_avx512(const float* x, int64_t N, int64_t d, const float* w, float eps, float* y,
                        float* rstd) {
  const int64_t grain = std::max<int64_t>(1, 16384 / d);
  parallel_for(N, grain, [&](int64_t b, int64_t e) { fwd_rows(x, b, e, d, w, eps, y, rstd); });
}

void rmsnorm_bwd_avx512(const float* dy, const float* x, int64_t N, int64_t d, const float* w,
                        const float* rstd, float* dx, float* dw) {
  const int64_t rows = (N + kChunks - 1) / kChunks;  // rows per chunk: a function of N only
  const int64_t nch = (N + rows - 1) / rows;
  const int64_t ld = (d + 15) / 16 * 16;
  // Bounded scratch of the calling thread (at most kChunks x d floats), reused across calls.
  thread_local aligned_vector<float> scratch;  // rows of ld floats on cache lines
  if (scratch.size() < static_cast<size_t>(nch * ld)) scratch.resize(static_cast<size_t>(nch * ld));
  float* part = scratch.data();
  parallel_dynamic(nch, [&](int64_t c) {
    float* pc = part + c * ld;
    for (int64_t j = 0; j < d; ++j) pc[j] = 0.0f;
    int64_t b = c * rows, e = std::min(N, b + rows);
    bwd_rows(dy, x, b, e, d, w, rstd, dx, pc);
  });
  // dw[j] += part[0][j] + part[1][j] + ... in chunk order (column-parallel, order per column fixed).
  parallel_for(d, 4096, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; j += 16) {
      __mmask16 k = j + 16 <= e ? __mmask16(0xFFFF) : tail_mask(e - j);
      __m512 acc = _mm512_maskz_loadu_ps(k, part + j);
      for (int64_t c = 1; c < nch; ++c) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(k, part + c * ld + j));
      _mm512_mask_storeu_ps(dw + j, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, dw + j), acc));
    }
  });
}

}  // namespace trex::kern::cpu
