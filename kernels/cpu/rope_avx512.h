// AVX-512 RoPE rotation; semantics and shapes as in kernels/rope.h.
// Call through kernels/rope.h, which checks the arguments and the CPU.
#pragma once
#include <cstdint>
#include "kernels/rope.h"

namespace trex::kern::cpu {

// x: N tokens x H heads, slice at x + n*stride_tok + h*stride_head, D wide  pos: [N]
// cos, sin: [max_pos, D/2]  (in place)
void rope_apply_avx512(float* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D,
                       const int32_t* pos, const float* cos, const float* sin, RopeLayout layout,
                       bool inverse);

}  // namespace trex::kern::cpu
