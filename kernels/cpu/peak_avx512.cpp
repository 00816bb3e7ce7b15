// fp32 FMA throughput loop for kernels/peak.cpp: 16 independent zmm accumulators, 512 FLOPs
// per iteration, no memory traffic.
// GCC 12 reports false (maybe-)uninitialized warnings inside the AVX-512 intrinsic headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#include <cstdint>

namespace trex::kern::cpu {

#define TREX_PEAK_R16(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

// Returns a value that depends on every accumulator (so nothing is optimized away).
__attribute__((noinline)) float peak_fma_f32_avx512(int64_t iters) {
#define TREX_DECL(i) __m512 a##i = _mm512_set1_ps(0.001f * (i + 1));
  TREX_PEAK_R16(TREX_DECL)
#undef TREX_DECL
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-4f);
  for (int64_t it = 0; it < iters; ++it) {
#define TREX_STEP(i) a##i = _mm512_fmadd_ps(a##i, x, y);
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
