// AVX-512 row operations of the fused LM head + cross-entropy (see gemm_avx512.h): the online
// log-sum-exp over a vocabulary chunk of logits and the scaled softmax for the backward pass.
// GCC 12 reports false (maybe-)uninitialized warnings inside the AVX-512 intrinsic headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#include <cmath>
#include <limits>
#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/simd_avx512.h"

namespace trex::kern::cpu {
namespace {

using avx512::exp_ps;  // e^x, kernels/cpu/simd_avx512.h
using avx512::tail_mask;

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
      a0 = _mm512_add_ps(a0, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(l + j), vmn)));
      a1 = _mm512_add_ps(a1, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(l + j + 16), vmn)));
    }
    for (; j < cols; j += 16) {
      __mmask16 k = cols - j >= 16 ? __mmask16(0xffff) : tail_mask(cols - j);
      __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, l + j), vmn));
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
      _mm512_storeu_ps(l + j, _mm512_mul_ps(exp_ps(_mm512_sub_ps(_mm512_loadu_ps(l + j), vl)), vg));
    if (j < cols) {
      __mmask16 k = tail_mask(cols - j);
      __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, l + j), vl));
      _mm512_mask_storeu_ps(l + j, k, _mm512_mul_ps(e, vg));
    }
  }
}

void ce_rows_p_bf16_avx512(const float* logits, int64_t ld, int64_t rows, int64_t cols, const int32_t* y,
                           float grad_scale, float* lse, float* lab, bf16* p, int64_t ldp) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits + r * ld;
    auto* out = reinterpret_cast<uint16_t*>(p + r * ldp);
    float m = -std::numeric_limits<float>::infinity(), s = 0.f;
    ce_chunk_stats_avx512(l, ld, 1, cols, &m, &s);
    const bool valid = y[r] >= 0 && y[r] < cols;
    const float ls = m + std::log(s), g = valid ? grad_scale : 0.f;
    lse[r] = ls;
    lab[r] = valid ? l[y[r]] : 0.f;
    const __m512 vl = _mm512_set1_ps(ls), vg = _mm512_set1_ps(g);
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 k = tail_mask(cols - j);
      __m512 v = g == 0.f ? _mm512_setzero_ps() : _mm512_mul_ps(exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, l + j), vl)), vg);
      if (valid && y[r] >= j && y[r] < j + 16) v = _mm512_mask_sub_ps(v, __mmask16(1u << (y[r] - j)), v, vg);
      _mm256_mask_storeu_epi16(out + j, k, avx512::to_bf16(v));
    }
  }
}

}  // namespace trex::kern::cpu
