// AVX-512 f32 -> bf16 over a contiguous range: 32 elements a step, the tail under a mask; and a
// zero fill with streaming stores.
#include "kernels/cpu/rows_avx512.h"
#include "kernels/cpu/simd_avx512.h"

#include <cstring>

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

void zero_stream_avx512(void* p, size_t bytes) {
  auto* a = static_cast<char*>(p);
  char* e = a + bytes;
  char* lo = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(a) + 63) / 64 * 64);
  char* hi = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(e) / 64 * 64);
  if (lo >= hi) {
    std::memset(a, 0, bytes);
    return;
  }
  std::memset(a, 0, (size_t)(lo - a));
  const __m512i z = _mm512_setzero_si512();
  for (char* q = lo; q < hi; q += 64) _mm512_stream_si512(reinterpret_cast<__m512i*>(q), z);
  _mm_sfence();  // the streaming stores are ordered before what follows
  std::memset(hi, 0, (size_t)(e - hi));
}

}  // namespace trex::kern::cpu
