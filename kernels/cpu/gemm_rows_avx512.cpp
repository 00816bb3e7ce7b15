// Row-invariant A B^T on AVX-512 (see gemm_rows_avx512.h). Register tiles of R rows x NC
// columns (1 x 16, 2 x 8, 3 x 5, 4 x 4: at most 16 accumulators), the R rows of A loaded once per
// step of 16 k. The 16 accumulators are then summed together by one transposing tree (reduce16),
// which adds the lanes of each accumulator in the same pairs whatever the tile's shape. So the
// shape changes how often operands are loaded, never the operations an element goes through.
// Intrinsics with an internal undefined operand appear in their maskz forms with a full mask:
// GCC 12 warns that the plain forms' operand is used uninitialized.
#include "kernels/cpu/gemm_rows_avx512.h"

#include <immintrin.h>
#include <algorithm>

#include "core/dtype.h"
#include "kernels/cpu/simd_avx512.h"

namespace trex::kern::cpu {
namespace {

using avx512::tail_mask;

constexpr int kRows = 4;  // rows of A per register tile at most

// Columns of a register tile of r rows.
constexpr int cols_for(int r) { return r == 1 ? 16 : r == 2 ? 8 : r == 3 ? 5 : 4; }

template <bool BF16>
inline __m512 load16(const void* p, int64_t k, __mmask16 m) {
  if constexpr (BF16) {
    return avx512::widen_bf16(_mm256_maskz_loadu_epi16(m, static_cast<const bf16*>(p) + k));
  } else {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + k);
  }
}

// The sums of the 16 lanes of v[0..15]: lane 4 q + m of the result is the sum of v[q + 4 m].
// Every v[e] is summed in the same pairs: lanes l and l + 8, then + 4, + 2, + 1.
inline __m512 reduce16(const __m512* v) {
  __m512 u[8], x[4], y[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // u[i]: v[2i] (l + l+8) in lanes 0-7, v[2i+1] in 8-15
    u[i] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_maskz_shuffle_f32x4(0xFFFF, v[2 * i], v[2 * i + 1], 0xEE));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // x[i]: 128-bit lane q holds v[4i + q]'s four partial sums
    x[i] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, u[2 * i], u[2 * i + 1], 0x88),
                         _mm512_maskz_shuffle_f32x4(0xFFFF, u[2 * i], u[2 * i + 1], 0xDD));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // y[i]: per 128-bit lane q, v[8i + q] two sums, v[8i + 4 + q] two
    y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// C[r, c] for r < R, c < nc (<= NC): b[c] for c >= nc repeat a real column, unused.
template <bool ABF, bool BBF, int R, int NC>
void tile(int64_t K, const void* const* a, const void* const* b, int nc, float* C, int64_t ldc, float alpha,
          float beta) {
  static_assert(R * NC <= 16);
  __m512 acc[16];
#pragma GCC unroll 16
  for (int e = 0; e < 16; ++e) acc[e] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : tail_mask(K - k);
    __m512 av[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) av[r] = load16<ABF>(a[r], k, m);
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) {
      const __m512 bv = load16<BBF>(b[c], k, m);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r * NC + c] = _mm512_fmadd_ps(av[r], bv, acc[r * NC + c]);
    }
  }
  // Lanes back to element order (lane e = element r NC + c), then alpha (and beta C) on the
  // vector: the same single roundings as the scalar alpha * s and std::fma(beta, c, .).
  alignas(64) static constexpr int kOrder[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
  const __m512 v = _mm512_mul_ps(_mm512_set1_ps(alpha),
                                 _mm512_maskz_permutexvar_ps(0xFFFF, _mm512_load_si512(kOrder), reduce16(acc)));
  const __mmask16 mc = tail_mask(nc);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    __m512 y = r == 0 ? v : _mm512_maskz_compress_ps(__mmask16(tail_mask(NC) << (r * NC)), v);
    float* out = C + r * ldc;
    if (beta != 0.f) y = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mc, out), y);
    _mm512_mask_storeu_ps(out, mc, y);
  }
}

template <bool ABF, bool BBF, int R>
void row_group(int64_t n0, int64_t n1, int64_t K, const void* const* a, const char* Bb, int64_t ldb, float* C,
               int64_t ldc, float alpha, float beta) {
  constexpr int NC = cols_for(R);
  const int64_t eb = BBF ? 2 : 4;
  for (int64_t n = n0; n < n1; n += NC) {
    const int nc = static_cast<int>(std::min<int64_t>(NC, n1 - n));
    const void* b[NC];
    for (int c = 0; c < NC; ++c) b[c] = Bb + (n + std::min(c, nc - 1)) * ldb * eb;
    tile<ABF, BBF, R, NC>(K, a, b, nc, C + n, ldc, alpha, beta);
  }
}

template <bool ABF, bool BBF>
void run(int64_t i0, int64_t i1, int64_t n0, int64_t n1, int64_t K, float alpha, const void* A, int64_t lda,
         const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t ea = ABF ? 2 : 4;
  const char* Ab = static_cast<const char*>(A);
  const char* Bb = static_cast<const char*>(B);
  for (int64_t i = i0; i < i1; i += kRows) {
    const int r = static_cast<int>(std::min<int64_t>(kRows, i1 - i));
    const void* a[kRows];
    for (int q = 0; q < r; ++q) a[q] = Ab + (i + q) * lda * ea;
    float* Ci = C + i * ldc;
    if (r == 1) row_group<ABF, BBF, 1>(n0, n1, K, a, Bb, ldb, Ci, ldc, alpha, beta);
    else if (r == 2) row_group<ABF, BBF, 2>(n0, n1, K, a, Bb, ldb, Ci, ldc, alpha, beta);
    else if (r == 3) row_group<ABF, BBF, 3>(n0, n1, K, a, Bb, ldb, Ci, ldc, alpha, beta);
    else row_group<ABF, BBF, 4>(n0, n1, K, a, Bb, ldb, Ci, ldc, alpha, beta);
  }
}

}  // namespace

void gemm_rows_abt_avx512(bool a_bf16, bool b_bf16, int64_t i0, int64_t i1, int64_t n0, int64_t n1, int64_t K,
                          float alpha, const void* A, int64_t lda, const void* B, int64_t ldb, float beta, float* C,
                          int64_t ldc) {
  if (a_bf16 && b_bf16) return run<true, true>(i0, i1, n0, n1, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (a_bf16) return run<true, false>(i0, i1, n0, n1, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (b_bf16) return run<false, true>(i0, i1, n0, n1, K, alpha, A, lda, B, ldb, beta, C, ldc);
  run<false, false>(i0, i1, n0, n1, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace trex::kern::cpu
