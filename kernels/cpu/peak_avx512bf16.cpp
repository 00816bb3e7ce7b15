// bf16 dot-product (vdpbf16ps) throughput loop for kernels/peak.cpp: 16 independent zmm
// accumulators, 16 x 64 = 1024 FLOPs per iteration, no memory traffic.
// GCC 12 reports false (maybe-)uninitialized warnings inside the AVX-512 intrinsic headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#include <cstdint>

namespace trex::kern::cpu {

#define TREX_PEAK_R16(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

__attribute__((noinline)) float peak_dpbf16_avx512bf16(int64_t iters) {
#define TREX_DECL(i) __m512 a##i = _mm512_set1_ps(0.001f * (i + 1));
  TREX_PEAK_R16(TREX_DECL)
#undef TREX_DECL
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
  const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3800);  // 2^-15
  for (int64_t it = 0; it < iters; ++it) {
#define TREX_STEP(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
    TREX_PEAK_R16(TREX_STEP)
#undef TREX_STEP
  }
  __m512 s = _mm512_setzero_ps();
#define TREX_SUM(i) s = _mm512_add_ps(s, a##i);
  TREX_PEAK_R16(TREX_SUM)
#undef TREX_SUM
  return _mm512_reduce_add_ps(s);
}

}  // namespace trex::kern::cpu
