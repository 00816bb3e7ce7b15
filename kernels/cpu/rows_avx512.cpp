// AVX-512 f32 -> bf16 over a contiguous range: 32 elements a step, the tail under a mask.
#include "kernels/cpu/rows_avx512.h"
#include "kernels/cpu/simd_avx512.h"

namespace trex::kern::cpu {

void to_bf16_avx512(const float* x, int64_t n, bf16* y) {
  auto* out = reinterpret_cast<uint16_t*>(y);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = avx512::to_bf16(_mm512_loadu_ps(x + i));
    const __m256i b = avx512::to_bf16(_mm512_loadu_ps(x + i + 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16), b);
  }
  for (; i < n; i += 16) {
    const __mmask16 k = avx512::tail_mask(n - i);
    _mm256_mask_storeu_epi16(out + i, k, avx512::to_bf16(_mm512_maskz_loadu_ps(k, x + i)));
  }
}

}  // namespace trex::kern::cpu
