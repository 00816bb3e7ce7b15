// AVX2 AdamW step and sum of squares for CPUs without AVX-512; semantics and shapes as in
// kernels/adamw.h (the canonical definition: kernels/ref/adamw.h). Both give the reference
// fallback's bits exactly: AdamW is ref::adamw_step<float> (no FMA contraction), the sum of
// squares is the fallback's blocks of 2^16 each summed sequentially in double. Call through
// kernels/adamw.h, which checks the arguments and the CPU; the tests call these directly (the
// CPU must have AVX2).
// Gradients: none (this is the optimizer; p, m, v are updated in place).
#pragma once
#include <cstdint>
#include "core/dtype.h"
#include "kernels/adamw.h"
#include "kernels/ref/adamw.h"

namespace trex::kern::cpu {

// The sum_squares block (part of the definition of its value; the fallback uses it too).
constexpr int64_t kSumSquaresBlock = int64_t{1} << 16;

// s: the step's scalars, ref::AdamWScalars<float>(hp), formed by the caller in a baseline x86-64
// file (kernels/adamw.cpp, the tests): formed in this -mfma file, 1 - lr*wd could be fused into
// an FMA and round differently from the reference.
// p, g, m, v: [n] (in place)  p_bf16: [n] or null
void adamw_step_avx2(const ref::AdamWScalars<float>& s, float* p, const float* g, float* m, float* v,
                     int64_t n, bf16* p_bf16);

// x: [n] -> sum x^2 (double; blocks of kSumSquaresBlock elements, each summed in element order,
// the block sums added in block order: the value of the reference fallback in kernels/adamw.cpp)
double sum_squares_avx2(const float* x, int64_t n);

}  // namespace trex::kern::cpu
