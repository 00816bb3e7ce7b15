// AVX-512 row kernels for FP8 e4m3 / FP4 e2m1 dequantization. Call through io/quant.h, which
// checks shapes, decodes the scales of a row to f32 and threads over rows. Results are bit-equal
// to the scalar reference (one exact decode and one f32 multiply per element).
#pragma once
#include <cstdint>

namespace trex::kern::cpu {

// w: [n] e4m3 bytes  scales: [ceil(n/block)] f32 -> out: [n]; out[j] = e4m3(w[j]) * scales[j/block]
void dequant_e4m3_row_avx512(const uint8_t* w, int64_t n, const float* scales, int64_t block,
                             float* out);

// w: [n/2] bytes, element 2k in the low nibble of byte k, 2k+1 in the high nibble (n even)
// scales: [ceil(n/block)] f32 -> out: [n]; out[j] = e2m1(nibble j) * scales[j/block]
void dequant_e2m1_row_avx512(const uint8_t* w, int64_t n, const float* scales, int64_t block,
                             float* out);

}  // namespace trex::kern::cpu
