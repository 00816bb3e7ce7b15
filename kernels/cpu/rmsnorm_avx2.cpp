// AVX2 + FMA RMSNorm: the AVX-512 kernel (kernels/cpu/rmsnorm_avx512.cpp) resized for 8-float
// vectors; partial vectors at the end of a row go through vmaskmovps (zeros loaded in the masked
// lanes, nothing stored past the row).
// Forward: one pass over each row for sum(x^2), one for y (the row stays in L1/L2); rows are
// independent, so the result does not depend on the thread count.
// Backward: rows are cut into at most kChunks chunks whose size depends only on N; each chunk
// accumulates its partial dw in its own slice of a per-calling-thread scratch, and the partials
// are then added in chunk order, column-parallel. dw is therefore bitwise the same for any
// thread count.
#include "kernels/cpu/rmsnorm_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/simd_avx2.h"

namespace trex::kern::cpu {
namespace {

constexpr int64_t kChunks = 64;  // max row chunks for the dw partials (scratch: kChunks x d)

using avx2::hsum;  // fixed order
using avx2::tail_mask;

// sum_j x[j]^2 over one row of length d.
inline float row_sumsq(const float* x, int64_t d) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 32 <= d; j += 32) {
    const __m256 v0 = _mm256_loadu_ps(x + j), v1 = _mm256_loadu_ps(x + j + 8);
    const __m256 v2 = _mm256_loadu_ps(x + j + 16), v3 = _mm256_loadu_ps(x + j + 24);
    a0 = _mm256_fmadd_ps(v0, v0, a0);
    a1 = _mm256_fmadd_ps(v1, v1, a1);
    a2 = _mm256_fmadd_ps(v2, v2, a2);
    a3 = _mm256_fmadd_ps(v3, v3, a3);
  }
  for (; j + 8 <= d; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    a0 = _mm256_fmadd_ps(v, v, a0);
  }
  if (j < d) {
    const __m256 v = _mm256_maskload_ps(x + j, tail_mask(d - j));
    a1 = _mm256_fmadd_ps(v, v, a1);
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

// sum_j dy[j] * w[j] * x[j] over one row.
inline float row_dot3(const float* dy, const float* w, const float* x, int64_t d) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  int64_t j = 0;
  for (; j + 16 <= d; j += 16) {
    a0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dy + j), _mm256_loadu_ps(w + j)), _mm256_loadu_ps(x + j), a0);
    a1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dy + j + 8), _mm256_loadu_ps(w + j + 8)),
                         _mm256_loadu_ps(x + j + 8), a1);
  }
  for (; j + 8 <= d; j += 8)
    a0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dy + j), _mm256_loadu_ps(w + j)), _mm256_loadu_ps(x + j), a0);
  if (j < d) {
    const __m256i k = tail_mask(d - j);
    a1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_maskload_ps(dy + j, k), _mm256_maskload_ps(w + j, k)),
                         _mm256_maskload_ps(x + j, k), a1);
  }
  return hsum(_mm256_add_ps(a0, a1));
}

void fwd_rows(const float* x, int64_t b, int64_t e, int64_t d, const float* w, float eps, float* y, float* rstd) {
  const int64_t d8 = d / 8 * 8;
  const __m256i k = tail_mask(d - d8);
  for (int64_t n = b; n < e; ++n) {
    const float* xr = x + n * d;
    float* yr = y + n * d;
    const float r = 1.0f / std::sqrt(row_sumsq(xr, d) / static_cast<float>(d) + eps);
    if (rstd) rstd[n] = r;
    const __m256 vr = _mm256_set1_ps(r);
    for (int64_t j = 0; j < d8; j += 8)  // y = w * (x * r)
      _mm256_storeu_ps(yr + j, _mm256_mul_ps(_mm256_loadu_ps(w + j), _mm256_mul_ps(_mm256_loadu_ps(xr + j), vr)));
    if (d8 < d) {
      const __m256 xh = _mm256_mul_ps(_mm256_maskload_ps(xr + d8, k), vr);
      _mm256_maskstore_ps(yr + d8, k, _mm256_mul_ps(_mm256_maskload_ps(w + d8, k), xh));
    }
  }
}

// dx = r * (dy * w - xh * m) and part += dy * xh for one vector at column j (mask k).
template <bool Tail>
inline void bwd_vec(const float* dyr, const float* xr, const float* w, float* dxr, float* part, int64_t j,
                    __m256i k, __m256 vr, __m256 vm) {
  const __m256 g = Tail ? _mm256_maskload_ps(dyr + j, k) : _mm256_loadu_ps(dyr + j);
  const __m256 xv = Tail ? _mm256_maskload_ps(xr + j, k) : _mm256_loadu_ps(xr + j);
  const __m256 wv = Tail ? _mm256_maskload_ps(w + j, k) : _mm256_loadu_ps(w + j);
  const __m256 pv = Tail ? _mm256_maskload_ps(part + j, k) : _mm256_loadu_ps(part + j);
  const __m256 xh = _mm256_mul_ps(xv, vr);
  const __m256 dxv = _mm256_mul_ps(vr, _mm256_fnmadd_ps(xh, vm, _mm256_mul_ps(g, wv)));
  const __m256 pn = _mm256_fmadd_ps(g, xh, pv);
  if (Tail) {
    _mm256_maskstore_ps(dxr + j, k, dxv);
    _mm256_maskstore_ps(part + j, k, pn);
  } else {
    _mm256_storeu_ps(dxr + j, dxv);
    _mm256_storeu_ps(part + j, pn);
  }
}

// Rows [b, e): dx overwritten, dw partial accumulated into part[0, d).
void bwd_rows(const float* dy, const float* x, int64_t b, int64_t e, int64_t d, const float* w, const float* rstd,
              float* dx, float* part) {
  const float inv_d = 1.0f / static_cast<float>(d);
  const int64_t d8 = d / 8 * 8;
  const __m256i k = tail_mask(d - d8);
  for (int64_t n = b; n < e; ++n) {
    const float* dyr = dy + n * d;
    const float* xr = x + n * d;
    float* dxr = dx + n * d;
    const float r = rstd[n];
    const float m = row_dot3(dyr, w, xr, d) * r * inv_d;  // mean(dy * w * xhat)
    const __m256 vr = _mm256_set1_ps(r), vm = _mm256_set1_ps(m);
    for (int64_t j = 0; j < d8; j += 8) bwd_vec<false>(dyr, xr, w, dxr, part, j, k, vr, vm);
    if (d8 < d) bwd_vec<true>(dyr, xr, w, dxr, part, d8, k, vr, vm);
  }
}

}  // namespace

void rmsnorm_fwd_avx2(const float* x, int64_t N, int64_t d, const float* w, float eps, float* y, float* rstd) {
  const int64_t grain = std::max<int64_t>(1, 16384 / d);
  parallel_for(N, grain, [&](int64_t b, int64_t e) { fwd_rows(x, b, e, d, w, eps, y, rstd); });
}

void rmsnorm_bwd_avx2(const float* dy, const float* x, int64_t N, int64_t d, const float* w, const float* rstd,
                      float* dx, float* dw) {
  const int64_t rows = (N + kChunks - 1) / kChunks;  // rows per chunk: a function of N only
  const int64_t nch = (N + rows - 1) / rows;
  const int64_t ld = (d + 7) / 8 * 8;
  // Bounded scratch of the calling thread (at most kChunks x d floats), reused across calls.
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(nch * ld)) scratch.resize(static_cast<size_t>(nch * ld));
  float* part = scratch.data();
  parallel_dynamic(nch, [&](int64_t c) {
    float* pc = part + c * ld;
    std::fill(pc, pc + d, 0.0f);
    const int64_t b = c * rows, e = std::min(N, b + rows);
    bwd_rows(dy, x, b, e, d, w, rstd, dx, pc);
  });
  // dw[j] += part[0][j] + part[1][j] + ... in chunk order (column-parallel, order per column fixed).
  parallel_for(d, 4096, [&](int64_t b, int64_t e) {
    int64_t j = b;
    for (; j + 8 <= e; j += 8) {
      __m256 acc = _mm256_loadu_ps(part + j);
      for (int64_t c = 1; c < nch; ++c) acc = _mm256_add_ps(acc, _mm256_loadu_ps(part + c * ld + j));
      _mm256_storeu_ps(dw + j, _mm256_add_ps(_mm256_loadu_ps(dw + j), acc));
    }
    if (j < e) {
      const __m256i k = tail_mask(e - j);
      __m256 acc = _mm256_maskload_ps(part + j, k);
      for (int64_t c = 1; c < nch; ++c) acc = _mm256_add_ps(acc, _mm256_maskload_ps(part + c * ld + j, k));
      _mm256_maskstore_ps(dw + j, k, _mm256_add_ps(_mm256_maskload_ps(dw + j, k), acc));
    }
  });
}

}  // namespace trex::kern::cpu
