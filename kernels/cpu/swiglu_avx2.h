// AVX2 + FMA SwiGLU (forward and backward) for CPUs without AVX-512; semantics and shapes as in
// kernels/swiglu.h (the canonical definition: kernels/ref/swiglu.h; dgu OVERWRITES). Call through
// kernels/swiglu.h, which checks the arguments and the CPU; the tests call these directly (the
// CPU must have AVX2 + FMA).
#pragma once
#include <cstdint>

namespace trex::kern::cpu {

// gu: [N, 2F] -> h: [N, F]
void swiglu_fwd_avx2(const float* gu, int64_t N, int64_t F, float limit, float* h);

// dh: [N, F]  gu: [N, 2F] -> dgu: [N, 2F] (overwritten)
void swiglu_bwd_avx2(const float* dh, const float* gu, int64_t N, int64_t F, float limit, float* dgu);

}  // namespace trex::kern::cpu
