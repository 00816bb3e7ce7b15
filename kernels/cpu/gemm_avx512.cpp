// AVX-512 bf16 -> f32 widening of GEMM panels (see gemm_avx512.h).
// GCC 12 reports false (maybe-)uninitialized warnings inside the AVX-512 intrinsic headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/simd_avx512.h"

namespace trex::kern::cpu {

void bf16_to_f32_2d_avx512(const bf16* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src + r * lds);
    float* d = dst + r * ldd;
    int64_t j = 0;
    for (; j + 32 <= cols; j += 32) {
      _mm512_storeu_ps(d + j, avx512::widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + j))));
      _mm512_storeu_ps(d + j + 16,
                       avx512::widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + j + 16))));
    }
    for (; j < cols; j += 16) {
      int64_t n = cols - j < 16 ? cols - j : 16;
      __mmask16 k = static_cast<__mmask16>((1u << n) - 1u);
      _mm512_mask_storeu_ps(d + j, k, avx512::widen_bf16(_mm256_maskz_loadu_epi16(k, s + j)));
    }
  }
}

}  // namespace trex::kern::cpu
