// AVX2 + FMA RoPE: the AVX-512 kernel (kernels/cpu/rope_avx512.cpp) resized for 8-float vectors.
// Tokens are split across threads; for each token the cos/sin of a block of 8 pairs are loaded
// once and applied to every head. A last block of fewer than 8 pairs uses vmaskmovps loads and
// stores, so nothing outside the rotated slices is written. Elementwise: the result does not
// depend on the thread count.
//   Interleaved: 8 pairs = 16 floats = 2 vectors; cos/sin duplicated to (c0,c0,c1,c1,...) with
//   vpermps, the pair-swapped x times s added/subtracted with fmaddsub: even lanes a*c - b*s,
//   odd lanes b*c + a*s.
//   HalfSplit: 8 pairs per step from the two halves.
#include "kernels/cpu/rope_avx2.h"

#include <immintrin.h>

#include <algorithm>

#include "core/parallel.h"
#include "kernels/cpu/simd_avx2.h"

namespace trex::kern::cpu {
namespace {

using avx2::tail_mask;

// One interleaved vector (4 pairs): (a, b) -> (a*c - b*s, b*c + a*s) with c, s duplicated.
inline __m256 rot_inter(__m256 v, __m256 c, __m256 s) {
  const __m256 sw = _mm256_permute_ps(v, 0xB1);  // (b, a) in each pair
  return _mm256_fmaddsub_ps(v, c, _mm256_mul_ps(sw, s));
}

void rope_interleaved(float* x, int64_t b, int64_t e, int H, int64_t stride_tok, int64_t stride_head, int D,
                      const int32_t* pos, const float* cos, const float* sin, bool inverse) {
  const int half = D / 2;
  const __m256i dup_lo = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  const __m256i dup_hi = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
  const __m256 sign = _mm256_set1_ps(inverse ? -1.0f : 1.0f);
  const int half8 = half / 8 * 8, rem = half - half8;  // pairs in the last, partial block
  const __m256i kc = tail_mask(rem), k0 = tail_mask(2 * rem), k1 = tail_mask(2 * rem - 8);
  for (int64_t n = b; n < e; ++n) {
    const float* cr = cos + static_cast<int64_t>(pos[n]) * half;
    const float* sr = sin + static_cast<int64_t>(pos[n]) * half;
    float* xt = x + n * stride_tok;
    for (int i = 0; i < half8; i += 8) {
      const __m256 c8 = _mm256_loadu_ps(cr + i), s8 = _mm256_mul_ps(sign, _mm256_loadu_ps(sr + i));
      const __m256 c0 = _mm256_permutevar8x32_ps(c8, dup_lo), c1 = _mm256_permutevar8x32_ps(c8, dup_hi);
      const __m256 s0 = _mm256_permutevar8x32_ps(s8, dup_lo), s1 = _mm256_permutevar8x32_ps(s8, dup_hi);
      float* xp = xt + 2 * i;
      for (int h = 0; h < H; ++h, xp += stride_head) {
        _mm256_storeu_ps(xp, rot_inter(_mm256_loadu_ps(xp), c0, s0));
        _mm256_storeu_ps(xp + 8, rot_inter(_mm256_loadu_ps(xp + 8), c1, s1));
      }
    }
    if (rem) {
      const __m256 c8 = _mm256_maskload_ps(cr + half8, kc);
      const __m256 s8 = _mm256_mul_ps(sign, _mm256_maskload_ps(sr + half8, kc));
      const __m256 c0 = _mm256_permutevar8x32_ps(c8, dup_lo), c1 = _mm256_permutevar8x32_ps(c8, dup_hi);
      const __m256 s0 = _mm256_permutevar8x32_ps(s8, dup_lo), s1 = _mm256_permutevar8x32_ps(s8, dup_hi);
      float* xp = xt + 2 * half8;
      for (int h = 0; h < H; ++h, xp += stride_head) {
        _mm256_maskstore_ps(xp, k0, rot_inter(_mm256_maskload_ps(xp, k0), c0, s0));
        if (rem > 4) _mm256_maskstore_ps(xp + 8, k1, rot_inter(_mm256_maskload_ps(xp + 8, k1), c1, s1));
      }
    }
  }
}

void rope_halfsplit(float* x, int64_t b, int64_t e, int H, int64_t stride_tok, int64_t stride_head, int D,
                    const int32_t* pos, const float* cos, const float* sin, bool inverse) {
  const int half = D / 2;
  const __m256 sign = _mm256_set1_ps(inverse ? -1.0f : 1.0f);
  const int half8 = half / 8 * 8, rem = half - half8;
  const __m256i k = tail_mask(rem);
  for (int64_t n = b; n < e; ++n) {
    const float* cr = cos + static_cast<int64_t>(pos[n]) * half;
    const float* sr = sin + static_cast<int64_t>(pos[n]) * half;
    float* xt = x + n * stride_tok;
    for (int i = 0; i < half8; i += 8) {
      const __m256 c = _mm256_loadu_ps(cr + i), s = _mm256_mul_ps(sign, _mm256_loadu_ps(sr + i));
      float* xp = xt + i;
      for (int h = 0; h < H; ++h, xp += stride_head) {
        const __m256 a = _mm256_loadu_ps(xp), bb = _mm256_loadu_ps(xp + half);
        _mm256_storeu_ps(xp, _mm256_fmsub_ps(a, c, _mm256_mul_ps(bb, s)));
        _mm256_storeu_ps(xp + half, _mm256_fmadd_ps(bb, c, _mm256_mul_ps(a, s)));
      }
    }
    if (rem) {
      const __m256 c = _mm256_maskload_ps(cr + half8, k), s = _mm256_mul_ps(sign, _mm256_maskload_ps(sr + half8, k));
      float* xp = xt + half8;
      for (int h = 0; h < H; ++h, xp += stride_head) {
        const __m256 a = _mm256_maskload_ps(xp, k), bb = _mm256_maskload_ps(xp + half, k);
        _mm256_maskstore_ps(xp, k, _mm256_fmsub_ps(a, c, _mm256_mul_ps(bb, s)));
        _mm256_maskstore_ps(xp + half, k, _mm256_fmadd_ps(bb, c, _mm256_mul_ps(a, s)));
      }
    }
  }
}

}  // namespace

void rope_apply_avx2(float* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D, const int32_t* pos,
                     const float* cos, const float* sin, RopeLayout layout, bool inverse) {
  const int64_t grain = std::max<int64_t>(1, 8192 / (static_cast<int64_t>(H) * D));
  parallel_for(N, grain, [&](int64_t b, int64_t e) {
    if (layout == RopeLayout::Interleaved)
      rope_interleaved(x, b, e, H, stride_tok, stride_head, D, pos, cos, sin, inverse);
    else
      rope_halfsplit(x, b, e, H, stride_tok, stride_head, D, pos, cos, sin, inverse);
  });
}

}  // namespace trex::kern::cpu
