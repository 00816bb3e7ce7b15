// AVX-512 SwiGLU (forward and backward); semantics and shapes as in kernels/swiglu.h.
// Call through kernels/swiglu.h, which checks the arguments and the CPU.
#pragma once
#include <cstdint>
#include "core/dtype.h"

namespace trex::kern::cpu {

// gu: [N, 2F] -> h: [N, F]
void swiglu_fwd_avx512(const float* gu, int64_t N, int64_t F, float limit, float* h);

// dh: [N, F]  gu: [N, 2F] -> dgu: [N, 2F] (overwritten)
void swiglu_bwd_avx512(const float* dh, const float* gu, int64_t N, int64_t F, float limit, float* dgu);

// The same rounded to bf16 (to_bf16_avx512's bits of swiglu_bwd_avx512's output).
void swiglu_bwd_bf16_avx512(const float* dh, const float* gu, int64_t N, int64_t F, float limit, bf16* dgu);

}  // namespace trex::kern::cpu
