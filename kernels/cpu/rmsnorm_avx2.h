// AVX2 + FMA RMSNorm (forward and backward) for CPUs without AVX-512; semantics and shapes as in
// kernels/rmsnorm.h (the canonical definition: kernels/ref/rmsnorm.h). dw ACCUMULATES (+=),
// deterministically; dx OVERWRITES. Call through kernels/rmsnorm.h, which checks the arguments
// and the CPU; the tests call these directly (the CPU must have AVX2 + FMA).
#pragma once
#include <cstdint>

namespace trex::kern::cpu {

// x: [N, d]  w: [d] -> y: [N, d]  rstd: [N] (may be null)
void rmsnorm_fwd_avx2(const float* x, int64_t N, int64_t d, const float* w, float eps, float* y, float* rstd);

// dy, x: [N, d]  w: [d]  rstd: [N] -> dx: [N, d] (overwritten)  dw: [d] (+=, deterministic)
void rmsnorm_bwd_avx2(const float* dy, const float* x, int64_t N, int64_t d, const float* w, const float* rstd,
                      float* dx, float* dw);

}  // namespace trex::kern::cpu
