// AVX-512 row operations of the fused LM head + cross-entropy (see gemm_avx512.h): the online
// log-sum-exp over a vocabulary chunk of logits and the scaled softmax for the backward pass.
// GCC 12 reports false (maybe-)uninitialized warnings inside the AVX-512 intrinsic headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#include <cmath>
#include <limits>
#include "kernels/cpu/gemm_avx512.h"

namespace trex::kern::cpu {
namespace {

// exp(x) to ~2 ulp: x = n*ln2 + r, |r| <= ln2/2, degree-6 polynomial, scaled by 2^n with scalef.
// Clamping to [-110, 100] keeps n finite (exp underflows to 0 / overflows to inf as it should);
// the operand order of max/min keeps NaN.
inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(100.f), _mm512_max_ps(_mm512_set1_ps(-110.f), x));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

}  // namespace

void ce_chunk_stats_avx512(const float* logits, int64_t ld, int64_t rows, int64_t cols, float* m, float* s) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits + r * ld;
    __m512 vm = _mm512_set1_ps(ninf);
    int64_t j = 0;
    for (; j + 16 <= cols; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(l + j));
    if (j < cols) vm = _mm512_mask_max_ps(vm, tail_mask(cols - j), vm, _mm512_maskz_loadu_ps(tail_mask(cols - j), l + j));
    float cm = _mm512_reduce_max_ps(vm);
    float mo = m[r], mn = cm > mo ? cm : mo;
    __m512 vmn = _mm512_set1_ps(mn);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    j = 0;
    for (; j + 32 <= cols; j += 32) {
      a0 = _mm512_add_ps(a0, exp512(_mm512_sub_ps(_mm512_loadu_ps(l + j), vmn)));
      a1 = _mm512_add_ps(a1, exp512(_mm512_sub_ps(_mm512_loadu_ps(l + j + 16), vmn)));
    }
    for (; j < cols; j += 16) {
      __mmask16 k = cols - j >= 16 ? __mmask16(0xffff) : tail_mask(cols - j);
      __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, l + j), vmn));
      a0 = _mm512_add_ps(a0, _mm512_maskz_mov_ps(k, e));
    }
    float cs = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    s[r] = (mo == ninf ? 0.f : s[r] * std::exp(mo - mn)) + cs;
    m[r] = mn;
  }
}

void ce_chunk_softmax_avx512(float* logits, int64_t ld, int64_t rows, int64_t cols, const float* lse,
                             const float* g) {
  for (int64_t r = 0; r < rows; ++r) {
    float* l = logits + r * ld;
    if (g[r] == 0.f) {
      for (int64_t j = 0; j < cols; j += 16) {
        __mmask16 k = cols - j >= 16 ? __mmask16(0xffff) : tail_mask(cols - j);
        _mm512_mask_storeu_ps(l + j, k, _mm512_setzero_ps());
      }
      continue;
    }
    __m512 vl = _mm512_set1_ps(lse[r]), vg = _mm512_set1_ps(g[r]);
    int64_t j = 0;
    for (; j + 16 <= cols; j += 16)
      _mm512_storeu_ps(l + j, _mm512_mul_ps(exp512(_mm512_sub_ps(_mm512_loadu_ps(l + j), vl)), vg));
    if (j < cols) {
      __mmask16 k = tail_mask(cols - j);
      __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, l + j), vl));
      _mm512_mask_storeu_ps(l + j, k, _mm512_mul_ps(e, vg));
    }
  }
}

}  // namespace trex::kern::cpu
