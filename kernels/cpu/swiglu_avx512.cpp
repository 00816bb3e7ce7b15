// AVX-512 SwiGLU. Rows are split across threads; each row runs 16 columns at a time with a
// masked tail. exp is a Cephes-style polynomial (about 1 ulp) scaled with vscalefps, which also
// gives exact 0 / inf at the ends of the range and keeps NaN.
// GCC 12 warns falsely about the _mm512_undefined_ps() inside some intrinsics (GCC PR105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/cpu/swiglu_avx512.h"
#include <immintrin.h>
#include <algorithm>
#include "core/parallel.h"
#include "kernels/cpu/simd_avx512.h"

namespace trex::kern::cpu {
namespace {

using avx512::exp_ps;  // e^x, kernels/cpu/simd_avx512.h

inline __m512 sigmoid512(__m512 g) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}

// The next row's columns into L2 while this row's are computed: the rows are short streams for
// the hardware prefetchers (32768 x 512 on 2 Zen 5 cores: forward 10.1-10.5 -> 5.2-5.9 ms,
// backward 12.5-12.9 -> 8.3-9.0 ms). c may be null.
inline void prefetch_row(const float* a, const float* b, const float* c = nullptr) {
  _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T1);
  _mm_prefetch(reinterpret_cast<const char*>(b), _MM_HINT_T1);
  if (c) _mm_prefetch(reinterpret_cast<const char*>(c), _MM_HINT_T1);
}

inline __mmask16 col_mask(int64_t j, int64_t F) {
  return j + 16 <= F ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (F - j)) - 1u);
}

void fwd_rows(const float* gu, int64_t b, int64_t e, int64_t F, float limit, float* h) {
  const bool clamp = limit > 0;
  const __m512 hi = _mm512_set1_ps(limit), lo = _mm512_set1_ps(-limit);
  for (int64_t n = b; n < e; ++n) {
    const float* gr = gu + n * 2 * F;
    const float* ur = gr + F;
    float* hr = h + n * F;
    for (int64_t j = 0; j < F; j += 16) {
      const __mmask16 k = col_mask(j, F);
      if (n + 1 < e) prefetch_row(gr + 2 * F + j, ur + 2 * F + j);
      __m512 g = _mm512_maskz_loadu_ps(k, gr + j), u = _mm512_maskz_loadu_ps(k, ur + j);
      if (clamp) {  // operand order keeps NaN (min/max return the second operand on NaN)
        g = _mm512_min_ps(hi, g);
        u = _mm512_max_ps(lo, _mm512_min_ps(hi, u));
      }
      _mm512_mask_storeu_ps(hr + j, k, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid512(g)), u));
    }
  }
}

// dgu's 16 columns at p: f32, or bf16 rounded as to_bf16_avx512 rounds (the same bits).
inline void store_cols(float* p, __mmask16 k, __m512 v) { _mm512_mask_storeu_ps(p, k, v); }
inline void store_cols(bf16* p, __mmask16 k, __m512 v) {
  _mm256_mask_storeu_epi16(reinterpret_cast<uint16_t*>(p), k, avx512::to_bf16(v));
}

template <class T>
void bwd_rows(const float* dh, const float* gu, int64_t b, int64_t e, int64_t F, float limit, T* dgu) {
  const bool clamp = limit > 0;
  const __m512 hi = _mm512_set1_ps(limit), lo = _mm512_set1_ps(-limit), one = _mm512_set1_ps(1.0f);
  for (int64_t n = b; n < e; ++n) {
    const float* gr = gu + n * 2 * F;
    const float* ur = gr + F;
    const float* dr = dh + n * F;
    T* dgr = dgu + n * 2 * F;
    T* dur = dgr + F;
    for (int64_t j = 0; j < F; j += 16) {
      const __mmask16 k = col_mask(j, F);
      if (n + 1 < e) prefetch_row(gr + 2 * F + j, ur + 2 * F + j, dr + F + j);
      __m512 g = _mm512_maskz_loadu_ps(k, gr + j), u = _mm512_maskz_loadu_ps(k, ur + j);
      __mmask16 pass_g = k, pass_u = k;
      if (clamp) {  // gradient passes where lo <= value <= hi (false for NaN)
        pass_g = _mm512_mask_cmp_ps_mask(k, g, hi, _CMP_LE_OQ);
        pass_u = _mm512_mask_cmp_ps_mask(_mm512_mask_cmp_ps_mask(k, u, hi, _CMP_LE_OQ), u, lo, _CMP_GE_OQ);
        g = _mm512_min_ps(hi, g);
        u = _mm512_max_ps(lo, _mm512_min_ps(hi, u));
      }
      const __m512 d = _mm512_maskz_loadu_ps(k, dr + j);
      const __m512 s = sigmoid512(g);
      const __m512 gs = _mm512_mul_ps(g, s);
      // d * u * s * (1 + g * (1 - s))
      const __m512 ds = _mm512_mul_ps(s, _mm512_fmadd_ps(g, _mm512_sub_ps(one, s), one));
      const __m512 dg = _mm512_mul_ps(_mm512_mul_ps(d, u), ds);
      const __m512 du = _mm512_mul_ps(d, gs);
      // zero where clamped, inside the row's columns
      store_cols(dgr + j, k, _mm512_maskz_mov_ps(pass_g, dg));
      store_cols(dur + j, k, _mm512_maskz_mov_ps(pass_u, du));
    }
  }
}

}  // namespace

void swiglu_fwd_avx512(const float* gu, int64_t N, int64_t F, float limit, float* h) {
  const int64_t grain = std::max<int64_t>(1, 8192 / F);
  parallel_for(N, grain, [&](int64_t b, int64_t e) { fwd_rows(gu, b, e, F, limit, h); });
}

void swiglu_bwd_avx512(const float* dh, const float* gu, int64_t N, int64_t F, float limit, float* dgu) {
  const int64_t grain = std::max<int64_t>(1, 8192 / F);
  parallel_for(N, grain, [&](int64_t b, int64_t e) { bwd_rows(dh, gu, b, e, F, limit, dgu); });
}

void swiglu_bwd_bf16_avx512(const float* dh, const float* gu, int64_t N, int64_t F, float limit, bf16* dgu) {
  const int64_t grain = std::max<int64_t>(1, 8192 / F);
  parallel_for(N, grain, [&](int64_t b, int64_t e) { bwd_rows(dh, gu, b, e, F, limit, dgu); });
}

}  // namespace trex::kern::cpu
