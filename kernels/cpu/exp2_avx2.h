// 2^x on 8 floats for the AVX2 + FMA kernels (include from *_avx2.cpp files only: they are built
// with -mavx2 -mfma). x is clamped to [-127, 127] and split as n + f with f in [-1/2, 1/2]; 2^f
// comes from a degree-6 polynomial (Cephes exp2f coefficients, max relative error ~1e-7), 2^n is
// built in the exponent field (n = -127 gives the bits of +0, so -inf gives 0). x is the second
// operand of both clamps, which vmaxps / vminps return when either is NaN, so a NaN x gives NaN.
#pragma once
#include <immintrin.h>

namespace trex::kern::cpu::avx2 {

inline __m256 exp2_ps(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-127.f), _mm256_min_ps(_mm256_set1_ps(127.f), x));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

}  // namespace trex::kern::cpu::avx2
