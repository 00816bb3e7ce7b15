// AVX2 + FMA helpers shared by the kernels/cpu/*_avx2.cpp files: tail masks, a fixed-order
// horizontal sum, exp and exp2, the in-register 8 x 8 transpose, and V8, the 8-float vector
// traits the ISA-generic tile drivers are written against (kernels/cpu/attention_tiles.h; the
// AVX-512 twin is kernels/cpu/simd_avx512.h). Include only from files built with the AVX2 flags
// (named *_avx2.cpp, see CMakeLists.txt); everything here is inline in namespace avx2.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace trex::kern::cpu::avx2 {

// Lanes i < n set (all for n >= 8, none for n <= 0).
inline __m256i tail_mask(int64_t n) {
  const int k = n >= 8 ? 8 : n <= 0 ? 0 : static_cast<int>(n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Sum of the 8 lanes in a fixed order (halves, then quarters, ...).
inline float hsum(__m256 v) {
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

// 2^x: x is clamped to [-127, 127] and split as n + f with f in [-1/2, 1/2]; 2^f comes from a
// degree-6 polynomial (Cephes exp2f coefficients, max relative error ~1e-7), 2^n is built in the
// exponent field (n = -127 gives the bits of +0, so -inf gives 0). x is the second operand of both
// clamps, which vmaxps / vminps return when either is NaN, so a NaN x gives NaN.
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

// 2^k for integer k in [-126, 127], built in the exponent field.
inline __m256 pow2i(__m256i k) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

// e^x, the same bits as avx512::exp_ps (kernels/cpu/simd_avx512.h): the Cephes expf polynomial
// (about 1 ulp) on x clamped to [-104, 89], times 2^n. AVX2 has no vscalefps, so 2^n (n in
// [-150, 128]) is applied as two exact powers 2^(n>>1) and 2^(n - (n>>1)), each in the normal
// range: p * 2^(n>>1) is exact and the second product rounds once, which is what vscalefps does
// (exact 0 / inf at the ends of the range). A NaN x stays NaN.
inline __m256 exp_ps(__m256 x) {
  // Clamp the range. min/max return their second operand when either is NaN: x goes second.
  x = _mm256_max_ps(_mm256_set1_ps(-104.0f), _mm256_min_ps(_mm256_set1_ps(89.0f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // n is an integer in [-150, 128] (NaN: garbage exponent bits, but p is NaN then).
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  return _mm256_mul_ps(_mm256_mul_ps(p, pow2i(n1)), pow2i(_mm256_sub_epi32(ni, n1)));
}

// In-register 8 x 8 transpose: r[c] lane i <- r[i] lane c.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h..4h+3
    u[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[c + 4] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

// Vector traits of 8 floats for the ISA-generic drivers. T: a vector; M: a lane mask (all-ones
// lanes); I: 8 int32; Tail: what limits the last vector of a micro-kernel row (nothing here: the
// micro-kernel reads and writes whole vectors, so its B and C rows are padded to a multiple of 8;
// masked loads and stores are slow on AMD).
struct V8 {
  using T = __m256;
  using M = __m256;
  using I = __m256i;
  struct Tail {};
  static constexpr int kW = 8;               // lanes
  static constexpr int kNV = 2;              // micro-kernel vectors: 12 ymm + 2 for B + 1 broadcast
  static constexpr bool kColsOuter = false;  // row groups outside column blocks in the tile GEMM

  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T load_n(const float* p, int n) { return _mm256_maskload_ps(p, tail_mask(n)); }
  static void store_n(float* p, T v, int n) {  // through a stack buffer: no vmaskmovps store
    if (n >= 8) return _mm256_storeu_ps(p, v);
    alignas(32) float t[8];
    _mm256_store_ps(t, v);
    std::memcpy(p, t, sizeof(float) * (n > 0 ? n : 0));
  }
  static Tail tail(int) { return {}; }
  static T load_tail(Tail, const float* p) { return _mm256_loadu_ps(p); }
  static void store_tail(float* p, Tail, T v) { _mm256_storeu_ps(p, v); }

  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T fmsub(T a, T b, T c) { return _mm256_fmsub_ps(a, b, c); }
  static T exp2(T x) { return exp2_ps(x); }
  static float reduce_add(T v) { return hsum(v); }

  static I iota(int base) {
    return _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(base));
  }
  static I seti(int x) { return _mm256_set1_epi32(x); }
  static I loadi(const int32_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
  static M gt(I a, I b) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b)); }
  static M eq(I a, I b) { return _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, b)); }
  static M eqf(T a, T b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
  static M mand(M a, M b) { return _mm256_and_ps(a, b); }
  static T select(M m, T a, T b) { return _mm256_blendv_ps(b, a, m); }  // m ? a : b
  static T maskz(M m, T a) { return _mm256_and_ps(a, m); }  // m ? a : 0 (clears even NaN)

  static void transpose(T r[8]) { transpose8(r); }  // r[c] lane i <- r[i] lane c
  // dst[c * ldd + r] = src[r * lds + c] for r < 8, c < nc (nc <= 8); rows r >= nr read as 0.
  static void transpose_tile(const float* src, int64_t lds, int nr, int nc, float* dst,
                             int64_t ldd) {
    if (nr == 8 && nc == 8) {
      __m256 r[8];
      for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(src + k * lds);
      transpose8(r);
      for (int c = 0; c < 8; ++c) _mm256_storeu_ps(dst + c * ldd, r[c]);
      return;
    }
    for (int c = 0; c < nc; ++c)
      for (int k = 0; k < 8; ++k) dst[c * ldd + k] = k < nr ? src[k * lds + c] : 0.0f;
  }
};

}  // namespace trex::kern::cpu::avx2
