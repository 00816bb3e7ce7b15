// AVX-512 RoPE. Tokens are split across threads; for each token the cos/sin of a block of pairs
// are loaded once and applied to every head.
//   Interleaved: 16 floats = 8 pairs; cos/sin duplicated to (c0,c0,c1,c1,...), the pair-swapped
//   x times s added/subtracted with fmaddsub: even lanes a*c - b*s, odd lanes b*c + a*s.
//   HalfSplit: 16 pairs per step from the two halves.
// GCC 12 warns falsely about the _mm512_undefined_ps() inside some intrinsics (GCC PR105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/cpu/rope_avx512.h"
#include <immintrin.h>
#include <algorithm>
#include "core/parallel.h"

namespace trex::kern::cpu {
namespace {

void rope_interleaved(float* x, int64_t b, int64_t e, int H, int64_t stride_tok, int64_t stride_head, int D,
                      const int32_t* pos, const float* cos, const float* sin, bool inverse) {
  const int half = D / 2;
  const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512 sign = _mm512_set1_ps(inverse ? -1.0f : 1.0f);
  for (int64_t n = b; n < e; ++n) {
    const float* cr = cos + static_cast<int64_t>(pos[n]) * half;
    const float* sr = sin + static_cast<int64_t>(pos[n]) * half;
    float* xt = x + n * stride_tok;
    for (int i = 0; i < half; i += 8) {
      const int np = std::min(8, half - i);  // pairs in this block
      const __mmask8 k8 = static_cast<__mmask8>((1u << np) - 1u);
      const __mmask16 k16 = static_cast<__mmask16>((1u << (2 * np)) - 1u);
      const __m512 c = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(k8, cr + i)));
      const __m512 s = _mm512_mul_ps(
          sign, _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(k8, sr + i))));
      float* xp = xt + 2 * i;
      for (int h = 0; h < H; ++h, xp += stride_head) {
        const __m512 v = _mm512_maskz_loadu_ps(k16, xp);
        const __m512 sw = _mm512_permute_ps(v, 0xB1);  // (b, a) in each pair
        _mm512_mask_storeu_ps(xp, k16, _mm512_fmaddsub_ps(v, c, _mm512_mul_ps(sw, s)));
      }
    }
  }
}

void rope_halfsplit(float* x, int64_t b, int64_t e, int H, int64_t stride_tok, int64_t stride_head, int D,
                    const int32_t* pos, const float* cos, const float* sin, bool inverse) {
  const int half = D / 2;
  const __m512 sign = _mm512_set1_ps(inverse ? -1.0f : 1.0f);
  for (int64_t n = b; n < e; ++n) {
    const float* cr = cos + static_cast<int64_t>(pos[n]) * half;
    const float* sr = sin + static_cast<int64_t>(pos[n]) * half;
    float* xt = x + n * stride_tok;
    for (int i = 0; i < half; i += 16) {
      const int np = std::min(16, half - i);
      const __mmask16 k = static_cast<__mmask16>((1u << np) - 1u);
      const __m512 c = _mm512_maskz_loadu_ps(k, cr + i);
      const __m512 s = _mm512_mul_ps(sign, _mm512_maskz_loadu_ps(k, sr + i));
      float* xp = xt + i;
      for (int h = 0; h < H; ++h, xp += stride_head) {
        const __m512 a = _mm512_maskz_loadu_ps(k, xp), bb = _mm512_maskz_loadu_ps(k, xp + half);
        _mm512_mask_storeu_ps(xp, k, _mm512_fmsub_ps(a, c, _mm512_mul_ps(bb, s)));
        _mm512_mask_storeu_ps(xp + half, k, _mm512_fmadd_ps(bb, c, _mm512_mul_ps(a, s)));
      }
    }
  }
}

}  // namespace

void rope_apply_avx512(float* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D,
                       const int32_t* pos, const float* cos, const float* sin, RopeLayout layout,
                       bool inverse) {
  const int64_t grain = std::max<int64_t>(1, 8192 / (static_cast<int64_t>(H) * D));
  parallel_for(N, grain, [&](int64_t b, int64_t e) {
    if (layout == RopeLayout::Interleaved)
      rope_interleaved(x, b, e, H, stride_tok, stride_head, D, pos, cos, sin, inverse);
    else
      rope_halfsplit(x, b, e, H, stride_tok, stride_head, D, pos, cos, sin, inverse);
  });
}

}  // namespace trex::kern::cpu
