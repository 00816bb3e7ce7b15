// AVX-512 FP8 / FP4 dequantization rows. Decoding is integer-only (exact, independent of the
// MXCSR denormal flags); the only float operation is the final multiply by the scale, the same
// single IEEE multiply the scalar reference and torch perform.
#include "kernels/cpu/dequant_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

// GCC 12 flags the _mm512_undefined_epi32() pass-through inside its own intrinsics headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace trex::kern::cpu {
namespace {

// 16 e4m3 bytes -> 16 f32. Normal codes: exponent rebias (e+120) by integer add; subnormals
// m * 2^-9 (exact); 0x7f / 0xff -> NaN 0x7ff00000 | sign (torch's bits).
inline __m512 decode_e4m3(__m128i bytes) {
  const __m512i v = _mm512_maskz_cvtepu8_epi32(0xffff, bytes);
  const __m512i mag = _mm512_and_si512(v, _mm512_set1_epi32(0x7f));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
  const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(1.f / 512.f));
  const __mmask16 is_sub = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8));
  const __mmask16 is_nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f));
  __m512i r = _mm512_mask_blend_epi32(is_sub, normal, _mm512_castps_si512(sub));
  r = _mm512_mask_blend_epi32(is_nan, r, _mm512_set1_epi32(0x7ff00000));
  return _mm512_castsi512_ps(_mm512_or_si512(r, sign));
}

constexpr float kE2m1[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                             -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

}  // namespace

void dequant_e4m3_row_avx512(const uint8_t* w, int64_t n, const float* scales, int64_t block,
                             float* out) {
  for (int64_t j0 = 0, b = 0; j0 < n; j0 += block, ++b) {
    const int64_t j1 = std::min(n, j0 + block);
    const __m512 s = _mm512_set1_ps(scales[b]);
    int64_t j = j0;
    for (; j + 32 <= j1; j += 32) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j));
      _mm512_storeu_ps(out + j, _mm512_mul_ps(decode_e4m3(_mm256_castsi256_si128(x)), s));
      _mm512_storeu_ps(out + j + 16, _mm512_mul_ps(decode_e4m3(_mm256_extracti128_si256(x, 1)), s));
    }
    for (; j < j1; j += 16) {
      const int64_t rem = std::min<int64_t>(16, j1 - j);
      const __mmask16 m = static_cast<__mmask16>((1u << rem) - 1u);
      const __m128i x = _mm_maskz_loadu_epi8(m, w + j);
      _mm512_mask_storeu_ps(out + j, m, _mm512_mul_ps(decode_e4m3(x), s));
    }
  }
}

void dequant_e2m1_row_avx512(const uint8_t* w, int64_t n, const float* scales, int64_t block,
                             float* out) {
  if (block % 32 != 0) {  // the fast path needs 32-element chunks inside one scale block
    for (int64_t j = 0; j < n; j += 2) {
      const uint8_t b = w[j / 2];
      out[j] = kE2m1[b & 0xf] * scales[j / block];
      out[j + 1] = kE2m1[b >> 4] * scales[(j + 1) / block];
    }
    return;
  }
  const __m512 lut = _mm512_loadu_ps(kE2m1);
  // Interleave lows and highs: out[2k] = low nibble k, out[2k+1] = high nibble k.
  const __m512i idx0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i idx1 =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512i nib = _mm512_set1_epi32(0xf);
  auto chunk = [&](int64_t j, __m512 s) {  // 32 elements from 16 bytes
    const __m512i d = _mm512_maskz_cvtepu8_epi32(
        0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j / 2)));
    const __m512 lo = _mm512_permutexvar_ps(_mm512_and_si512(d, nib), lut);
    const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), lut);
    _mm512_storeu_ps(out + j, _mm512_mul_ps(_mm512_permutex2var_ps(lo, idx0, hi), s));
    _mm512_storeu_ps(out + j + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo, idx1, hi), s));
  };
  if (block == 32) {  // the V4 layout: one scale per 32-element chunk, no inner loop
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) chunk(j, _mm512_set1_ps(scales[j / 32]));
    for (; j < n; j += 2) {
      const uint8_t c = w[j / 2];
      out[j] = kE2m1[c & 0xf] * scales[j / 32];
      out[j + 1] = kE2m1[c >> 4] * scales[j / 32];
    }
    return;
  }
  for (int64_t j0 = 0, b = 0; j0 < n; j0 += block, ++b) {
    const int64_t j1 = std::min(n, j0 + block);
    const float sf = scales[b];
    const __m512 s = _mm512_set1_ps(sf);
    int64_t j = j0;
    for (; j + 32 <= j1; j += 32) chunk(j, s);
    for (; j < j1; j += 2) {  // j1 - j0 is even (block and n are), so j stays even
      const uint8_t c = w[j / 2];
      out[j] = kE2m1[c & 0xf] * sf;
      out[j + 1] = kE2m1[c >> 4] * sf;
    }
  }
}

}  // namespace trex::kern::cpu
