// AVX2 + FMA RoPE rotation for CPUs without AVX-512; semantics and shapes as in kernels/rope.h
// (the canonical definition: kernels/ref/rope.h). Call through kernels/rope.h, which checks the
// arguments and the CPU; the tests call it directly (the CPU must have AVX2 + FMA).
#pragma once
#include <cstdint>

#include "kernels/rope.h"

namespace trex::kern::cpu {

// x: N tokens x H heads, slice at x + n*stride_tok + h*stride_head, D wide  pos: [N]
// cos, sin: [max_pos, D/2]  (in place; elements outside the slices are not touched)
void rope_apply_avx2(float* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D, const int32_t* pos,
                     const float* cos, const float* sin, RopeLayout layout, bool inverse);

}  // namespace trex::kern::cpu
