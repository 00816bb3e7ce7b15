// AVX-512 AdamW step and sum of squares; semantics and shapes as in kernels/adamw.h.
// Call through kernels/adamw.h, which checks the arguments and the CPU.
#pragma once
#include <cstdint>
#include "core/dtype.h"
#include "kernels/adamw.h"

namespace trex::kern::cpu {

// p, g, m, v: [n] (in place)  p_bf16: [n] or null
void adamw_step_avx512(const AdamWParams& hp, float* p, const float* g, float* m, float* v, int64_t n,
                       bf16* p_bf16);

// x: [n] -> sum x^2 (double; blocks of a fixed size, added in block order)
double sum_squares_avx512(const float* x, int64_t n);

}  // namespace trex::kern::cpu
