// RMSNorm as Hugging Face DeepseekV3RMSNorm in fp32: y = w * (x * rsqrt(mean(x^2) + eps)),
// forward and backward. Dispatches to the AVX-512 kernel, the AVX2 kernel or the scalar reference.
// Gradients: the parameter gradient dw ACCUMULATES (+=); the activation gradient dx OVERWRITES.
// dw is deterministic: rows are cut into chunks that depend only on N (never on the thread
// count), each chunk's partial sum is kept apart and the partials are added in chunk order.
#pragma once
#include <cstdint>

namespace trex::kern {

// x: [N, d]  w: [d] -> y: [N, d]  rstd: [N] = 1/sqrt(mean(x^2) + eps) (saved for backward; may be null)
void rmsnorm_fwd(const float* x, int64_t N, int64_t d, const float* w, float eps, float* y, float* rstd);

// dy, x: [N, d]  w: [d]  rstd: [N] from rmsnorm_fwd -> dx: [N, d] (overwritten)  dw: [d] (+=)
void rmsnorm_bwd(const float* dy, const float* x, int64_t N, int64_t d, const float* w, const float* rstd,
                 float* dx, float* dw);

}  // namespace trex::kern
