// AVX-512 helpers shared by the kernels/cpu/*_avx512*.cpp files: tail masks, f32 <-> bf16, a
// fixed-order horizontal sum, exp and exp2, the in-register 16 x 16 transpose, and V16, the
// 16-float vector traits the ISA-generic tile drivers are written against
// (kernels/cpu/attention_tiles.h; the AVX2 twin is kernels/cpu/simd_avx2.h). Include only from
// files built with the AVX-512 flags (named *_avx512.cpp, see CMakeLists.txt); everything here is
// inline in namespace avx512.
#pragma once
// GCC 12 reports the _mm512_undefined_ps() idiom inside its own intrinsics as (maybe-)
// uninitialized; the warnings point into the header, so silencing them there is enough.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

namespace trex::kern::cpu::avx512 {

// Lanes i < n set (all for n >= 16, none for n <= 0).
inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
}

// 16 f32 -> 16 bf16: round to nearest even, NaN -> quiet NaN, subnormals kept (the bits of
// f32_to_bf16 in core/dtype.h; vcvtneps2bf16 would flush subnormal inputs to zero).
inline __m256i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i hi = _mm512_srli_epi32(u, 16);
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1))));
  r = _mm512_srli_epi32(r, 16);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

// 16 bf16 -> 16 f32, exact (zero-extend, shift into the high half). The maskz forms: GCC 12 warns
// -Wuninitialized inside the plain ones.
inline __m512 widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16));
}

// Sum of the 16 lanes in a fixed order (halves, then quarters, ...).
inline float hsum(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

// 2^x: x clamped below at -200 (2^-200 is 0 in fp32, so -inf gives 0), x = n + f with
// f in [-1/2, 1/2], 2^f by a degree-6 polynomial (Cephes exp2f coefficients; measured max relative
// error 8e-8 on [-40, 0]), scaled by 2^n with vscalefps (which flushes very negative n to 0 and
// overflows to inf). vmaxps returns its second operand when either is NaN: a NaN x stays NaN.
inline __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-200.0f), x);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// e^x to about 1 ulp: x clamped to [-104, 89] (exp is 0 / inf beyond), x = n ln2 + r with
// |r| <= ln2/2 (ln2 in two parts), the Cephes expf polynomial, scaled by 2^n with vscalefps
// (exact 0 / inf at the ends of the range). min/max return their second operand when either is
// NaN and x goes second: a NaN x stays NaN (so does -inf - -inf).
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// In-register 16 x 16 transpose: r[c] lane i <- r[i] lane c.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: (a0 b0 a1 b1), (a2 b2 a3 b3)
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // lane l of r[4i+k]: rows 4i..4i+3 of column 4l+k
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]),
                  c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88);
    t[k + 4] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xDD);
    t[k + 8] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
    t[k + 12] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xDD);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
    r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xDD);
    r[k + 4] = _mm512_shuffle_f32x4(t[k + 4], t[k + 12], 0x88);
    r[k + 12] = _mm512_shuffle_f32x4(t[k + 4], t[k + 12], 0xDD);
  }
}

// Vector traits of 16 floats for the ISA-generic drivers. T: a vector; M: a lane mask; I: 16
// int32; Tail: what limits the last vector of a micro-kernel row (a mask here, so operands need
// no padding past their width).
struct V16 {
  using T = __m512;
  using M = __mmask16;
  using I = __m512i;
  using Tail = __mmask16;
  static constexpr int kW = 16;             // lanes
  static constexpr int kNV = 4;             // micro-kernel vectors of columns (6 x 4 beat 12 x 2, 8 x 3)
  static constexpr bool kColsOuter = true;  // column blocks outside row groups in the tile GEMM

  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
  static void store_n(float* p, T v, int n) { _mm512_mask_storeu_ps(p, tail_mask(n), v); }
  static Tail tail(int n) { return tail_mask(n); }
  static T load_tail(Tail m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void store_tail(float* p, Tail m, T v) { _mm512_mask_storeu_ps(p, m, v); }

  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T fmsub(T a, T b, T c) { return _mm512_fmsub_ps(a, b, c); }
  static T exp2(T x) { return exp2_ps(x); }
  static float reduce_add(T v) { return hsum(v); }

  static I iota(int base) {
    return _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(base));
  }
  static I seti(int x) { return _mm512_set1_epi32(x); }
  static I loadi(const int32_t* p) { return _mm512_load_si512(p); }  // 64-byte aligned
  static M gt(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }
  static M eq(I a, I b) { return _mm512_cmpeq_epi32_mask(a, b); }
  static M eqf(T a, T b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static M mand(M a, M b) { return a & b; }
  static T select(M m, T a, T b) { return _mm512_mask_mov_ps(b, m, a); }  // m ? a : b
  static T maskz(M m, T a) { return _mm512_maskz_mov_ps(m, a); }          // m ? a : 0

  static void transpose(T r[16]) { transpose16(r); }  // r[c] lane i <- r[i] lane c
  // dst[c * ldd + r] = src[r * lds + c] for r < 16, c < nc (nc <= 16); rows r >= nr read as 0.
  static void transpose_tile(const float* src, int64_t lds, int nr, int nc, float* dst,
                             int64_t ldd) {
    __m512 r[16];
    const __mmask16 mc = tail_mask(nc);
    for (int i = 0; i < 16; ++i)
      r[i] = _mm512_maskz_loadu_ps(i < nr ? mc : __mmask16(0), src + i * lds);
    transpose16(r);
    for (int c = 0; c < nc; ++c) _mm512_storeu_ps(dst + c * ldd, r[c]);
  }
};

}  // namespace trex::kern::cpu::avx512
