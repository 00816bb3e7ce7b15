// AVX-512 RMSNorm (forward and backward); semantics and shapes as in kernels/rmsnorm.h.
// Call through kernels/rmsnorm.h, which checks the arguments and the CPU.
#pragma once
#include <cstdint>

namespace trex::kern::cpu {

// x: [N, d]  w: [d] -> y: [N, d]  rstd: [N] (may be null)
void rmsnorm_fwd_avx512(const float* x, int64_t N, int64_t d, const float* w, float eps, float* y,
                        float* rstd);

// dy, x: [N, d]  w: [d]  rstd: [N] -> dx: [N, d] (overwritten)  dw: [d] (+=, deterministic)
void rmsnorm_bwd_avx512(const float* dy, const float* x, int64_t N, int64_t d, const float* w,
                        const float* rstd, float* dx, float* dw);

}  // namespace trex::kern::cpu
