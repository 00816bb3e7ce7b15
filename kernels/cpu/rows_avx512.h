// AVX-512 row conversions and fills; semantics as in kernels/rows.h (to_bf16: f32_to_bf16's bits).
// Call through kernels/rows.h, which threads over the rows and checks the CPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include "core/dtype.h"

namespace trex::kern::cpu {

// x: [n] f32 -> y: [n] bf16 (round to nearest even, NaN -> quiet NaN)
void to_bf16_avx512(const float* x, int64_t n, bf16* y);

// p [bytes] = 0 with streaming (non-temporal) stores: the lines are written without being read
// first and do not stay in the cache. p needs no alignment.
void zero_stream_avx512(void* p, size_t bytes);

}  // namespace trex::kern::cpu
