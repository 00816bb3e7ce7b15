// AVX2 + FMA SwiGLU: the AVX-512 kernel (kernels/cpu/swiglu_avx512.cpp) resized for 8-float
// vectors. Rows are split across threads; each row runs 8 columns at a time, the last partial
// vector with vmaskmovps loads (zeros in the masked lanes) and stores (nothing written past the
// row). Elementwise, so the result does not depend on the thread count.
// exp is avx2::exp_ps (kernels/cpu/simd_avx2.h): the same bits as the AVX-512 kernel's exp.
#include "kernels/cpu/swiglu_avx2.h"

#include <immintrin.h>

#include <algorithm>

#include "core/parallel.h"
#include "kernels/cpu/simd_avx2.h"

namespace trex::kern::cpu {
namespace {

using avx2::exp_ps;  // e^x, the same bits as avx512::exp_ps

inline __m256 sigmoid256(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g))));
}

using avx2::tail_mask;

// h = g * sigmoid(g) * u for one vector, the clamp first (operand order keeps NaN: min/max
// return the second operand on NaN).
inline __m256 fwd_vec(__m256 g, __m256 u, bool clamp, __m256 hi, __m256 lo) {
  if (clamp) {
    g = _mm256_min_ps(hi, g);
    u = _mm256_max_ps(lo, _mm256_min_ps(hi, u));
  }
  return _mm256_mul_ps(_mm256_mul_ps(g, sigmoid256(g)), u);
}

void fwd_rows(const float* gu, int64_t b, int64_t e, int64_t F, float limit, float* h) {
  const bool clamp = limit > 0;
  const __m256 hi = _mm256_set1_ps(limit), lo = _mm256_set1_ps(-limit);
  const int64_t F8 = F / 8 * 8;
  const __m256i k = tail_mask(F - F8);
  for (int64_t n = b; n < e; ++n) {
    const float* gr = gu + n * 2 * F;
    const float* ur = gr + F;
    float* hr = h + n * F;
    for (int64_t j = 0; j < F8; j += 8)
      _mm256_storeu_ps(hr + j, fwd_vec(_mm256_loadu_ps(gr + j), _mm256_loadu_ps(ur + j), clamp, hi, lo));
    if (F8 < F)
      _mm256_maskstore_ps(hr + F8, k,
                          fwd_vec(_mm256_maskload_ps(gr + F8, k), _mm256_maskload_ps(ur + F8, k), clamp, hi, lo));
  }
}

// One vector of the backward: dg = d u s (1 + g (1 - s)), du = d g s, each zeroed where the
// clamp cut its input (the gradient passes where lo <= value <= hi, false for NaN).
inline void bwd_vec(__m256 d, __m256 g, __m256 u, bool clamp, __m256 hi, __m256 lo, __m256& dg, __m256& du) {
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 pass_g = _mm256_castsi256_ps(_mm256_set1_epi32(-1)), pass_u = pass_g;
  if (clamp) {
    pass_g = _mm256_cmp_ps(g, hi, _CMP_LE_OQ);
    pass_u = _mm256_and_ps(_mm256_cmp_ps(u, hi, _CMP_LE_OQ), _mm256_cmp_ps(u, lo, _CMP_GE_OQ));
    g = _mm256_min_ps(hi, g);
    u = _mm256_max_ps(lo, _mm256_min_ps(hi, u));
  }
  const __m256 s = sigmoid256(g);
  const __m256 gs = _mm256_mul_ps(g, s);
  const __m256 ds = _mm256_mul_ps(s, _mm256_fmadd_ps(g, _mm256_sub_ps(one, s), one));
  dg = _mm256_mul_ps(_mm256_mul_ps(d, u), ds);
  du = _mm256_mul_ps(d, gs);
  if (clamp) {  // +0 where clamped, as the reference writes T(0)
    dg = _mm256_and_ps(pass_g, dg);
    du = _mm256_and_ps(pass_u, du);
  }
}

void bwd_rows(const float* dh, const float* gu, int64_t b, int64_t e, int64_t F, float limit, float* dgu) {
  const bool clamp = limit > 0;
  const __m256 hi = _mm256_set1_ps(limit), lo = _mm256_set1_ps(-limit);
  const int64_t F8 = F / 8 * 8;
  const __m256i k = tail_mask(F - F8);
  for (int64_t n = b; n < e; ++n) {
    const float* gr = gu + n * 2 * F;
    const float* ur = gr + F;
    const float* dr = dh + n * F;
    float* dgr = dgu + n * 2 * F;
    float* dur = dgr + F;
    __m256 dg, du;
    for (int64_t j = 0; j < F8; j += 8) {
      bwd_vec(_mm256_loadu_ps(dr + j), _mm256_loadu_ps(gr + j), _mm256_loadu_ps(ur + j), clamp, hi, lo, dg, du);
      _mm256_storeu_ps(dgr + j, dg);
      _mm256_storeu_ps(dur + j, du);
    }
    if (F8 < F) {
      bwd_vec(_mm256_maskload_ps(dr + F8, k), _mm256_maskload_ps(gr + F8, k), _mm256_maskload_ps(ur + F8, k), clamp,
              hi, lo, dg, du);
      _mm256_maskstore_ps(dgr + F8, k, dg);
      _mm256_maskstore_ps(dur + F8, k, du);
    }
  }
}

}  // namespace

void swiglu_fwd_avx2(const float* gu, int64_t N, int64_t F, float limit, float* h) {
  const int64_t grain = std::max<int64_t>(1, 8192 / F);
  parallel_for(N, grain, [&](int64_t b, int64_t e) { fwd_rows(gu, b, e, F, limit, h); });
}

void swiglu_bwd_avx2(const float* dh, const float* gu, int64_t N, int64_t F, float limit, float* dgu) {
  const int64_t grain = std::max<int64_t>(1, 8192 / F);
  parallel_for(N, grain, [&](int64_t b, int64_t e) { bwd_rows(dh, gu, b, e, F, limit, dgu); });
}

}  // namespace trex::kern::cpu
