// AVX-512 AdamW (elementwise, threads over contiguous ranges, same f32 operation order as the
// reference up to FMA contraction) and a deterministic sum of squares: blocks of kBlock elements
// are each summed in double with a fixed lane layout, and the block sums are added in block order.
// GCC 12 warns falsely about the _mm512_undefined_ps() inside some intrinsics (GCC PR105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/cpu/adamw_avx512.h"
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include "core/parallel.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/ref/adamw.h"

namespace trex::kern::cpu {
namespace {

constexpr int64_t kBlock = 8192;  // sum_squares block (part of the definition of the result)
constexpr int64_t kGroup = 4096;  // block sums kept at a time (32 KiB of stack)
constexpr int64_t kAhead = 256;   // AdamW's prefetch distance in elements (1 KiB)

using avx512::to_bf16;

void adamw_range(const ref::AdamWScalars<float>& s, float* p, const float* g, float* m, float* v, int64_t b,
                 int64_t e, bf16* p_bf16) {
  const __m512 decay = _mm512_set1_ps(s.decay), w = _mm512_set1_ps(s.lerp_w),
               w1 = _mm512_set1_ps(1.0f - s.lerp_w), b2 = _mm512_set1_ps(s.b2), c2 = _mm512_set1_ps(s.c2),
               ns = _mm512_set1_ps(s.neg_step), bc2 = _mm512_set1_ps(s.bc2_sqrt), eps = _mm512_set1_ps(s.eps),
               gs = _mm512_set1_ps(s.gscale);
  for (int64_t i = b; i < e; i += 16) {
    const __mmask16 k = i + 16 <= e ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (e - i)) - 1u);
    if (i + kAhead < e) {  // eight streams at once: the hardware prefetchers fall behind
      _mm_prefetch(reinterpret_cast<const char*>(p + i + kAhead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(g + i + kAhead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(m + i + kAhead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(v + i + kAhead), _MM_HINT_T0);
    }
    const __m512 gi = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, g + i), gs);
    const __m512 pi = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + i), decay);
    const __m512 mo = _mm512_maskz_loadu_ps(k, m + i);
    const __m512 diff = _mm512_sub_ps(gi, mo);
    const __m512 mi = s.lerp_small ? _mm512_fmadd_ps(w, diff, mo) : _mm512_fnmadd_ps(diff, w1, gi);
    const __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(c2, gi), gi, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, v + i), b2));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
    const __m512 pn = _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(ns, mi), denom));
    _mm512_mask_storeu_ps(p + i, k, pn);
    _mm512_mask_storeu_ps(m + i, k, mi);
    _mm512_mask_storeu_ps(v + i, k, vi);
    if (p_bf16) {  // the bf16 copy is not read here: streamed where it fills aligned 32 bytes
      bf16* o = p_bf16 + i;
      if (k == 0xFFFF && (reinterpret_cast<uintptr_t>(o) & 31) == 0)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(o), to_bf16(pn));
      else _mm256_mask_storeu_epi16(o, k, to_bf16(pn));
    }
  }
  _mm_sfence();
}

// sum x^2 over one block, in double: 4 accumulators x 8 lanes, then a fixed-order reduction.
double block_ss(const float* x, int64_t len) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 32 <= len; j += 32) {
    const __m512d x0 = _mm512_cvtps_pd(_mm256_loadu_ps(x + j)), x1 = _mm512_cvtps_pd(_mm256_loadu_ps(x + j + 8));
    const __m512d x2 = _mm512_cvtps_pd(_mm256_loadu_ps(x + j + 16)), x3 = _mm512_cvtps_pd(_mm256_loadu_ps(x + j + 24));
    a0 = _mm512_fmadd_pd(x0, x0, a0);
    a1 = _mm512_fmadd_pd(x1, x1, a1);
    a2 = _mm512_fmadd_pd(x2, x2, a2);
    a3 = _mm512_fmadd_pd(x3, x3, a3);
  }
  for (; j < len; j += 8) {
    const __mmask8 k = j + 8 <= len ? __mmask8(0xFF) : static_cast<__mmask8>((1u << (len - j)) - 1u);
    const __m512d xv = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, x + j));
    a0 = _mm512_fmadd_pd(xv, xv, a0);
  }
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, _mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

}  // namespace

void adamw_step_avx512(const AdamWParams& hp, float* p, const float* g, float* m, float* v, int64_t n,
                       bf16* p_bf16) {
  const ref::AdamWScalars<float> s(hp);
  parallel_for(n, 32768, [&](int64_t b, int64_t e) { adamw_range(s, p, g, m, v, b, e, p_bf16); });
}

double sum_squares_avx512(const float* x, int64_t n) {
  const int64_t nb = (n + kBlock - 1) / kBlock;
  double part[kGroup];
  double total = 0.0;
  for (int64_t g0 = 0; g0 < nb; g0 += kGroup) {
    const int64_t gn = std::min(kGroup, nb - g0);
    parallel_for(gn, 4, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t blk = g0 + i, off = blk * kBlock;
        part[i] = block_ss(x + off, std::min(kBlock, n - off));
      }
    });
    for (int64_t i = 0; i < gn; ++i) total += part[i];
  }
  return total;
}

}  // namespace trex::kern::cpu
