// SwiGLU with the optional clamp of DeepSeek-V4 (swiglu_limit), forward and backward.
// Input gu: [N, 2F], the output of one GEMM with the gate and up weights stacked: columns [0, F)
// are the gate, [F, 2F) the up projection. h = silu(gate) * up, silu(g) = g * sigmoid(g).
// With limit > 0: gate = min(gate, limit), up = clamp(up, -limit, limit) first, and the gradient
// is zero where a value was clamped (torch.clamp's autograd: it passes where the value lies inside
// the bounds, bounds included; NaN inputs get zero gradient). limit <= 0: no clamp.
// Gradients: no parameters; the activation gradient dgu OVERWRITES.
#pragma once
#include <cstdint>
#include "core/dtype.h"

namespace trex::kern {

// gu: [N, 2F] -> h: [N, F]
void swiglu_fwd(const float* gu, int64_t N, int64_t F, float limit, float* h);

// dh: [N, F]  gu: [N, 2F] (the forward input) -> dgu: [N, 2F] (overwritten)
void swiglu_bwd(const float* dh, const float* gu, int64_t N, int64_t F, float limit, float* dgu);

// The same with dgu rounded to bf16 (a bf16 run's GEMM operand): the bits to_bf16 (kernels/rows.h)
// gives swiglu_bwd's output, without the f32 copy.
void swiglu_bwd_bf16(const float* dh, const float* gu, int64_t N, int64_t F, float limit, bf16* dgu);

}  // namespace trex::kern
