// AVX-512 flash attention, forward and backward: the tile drivers of kernels/cpu/attention_tiles.h
// on 16-float vectors (avx512::V16: masked tails, 6 x 64-column micro-kernel, vscalefps exp2).
#include "kernels/cpu/attention_avx512.h"

#include "kernels/cpu/simd_avx512.h"
// After the ISA header: the drivers are compiled here with this file's flags.
#include "kernels/cpu/attention_tiles.h"

namespace trex::kern::cpu {

void attention_fwd_avx512(const AttnShape& sh, const float* q, const float* k, const float* v,
                          float* o, float* lse, const int32_t* seg) {
  attention_fwd_tiles<avx512::V16>(sh, q, k, v, o, lse, seg);
}

void attention_bwd_avx512(const AttnShape& sh, const float* q, const float* k, const float* v,
                          const float* o, const float* lse, const float* dO, float* dq, float* dk,
                          float* dv, const int32_t* seg) {
  attention_bwd_tiles<avx512::V16>(sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
}

}  // namespace trex::kern::cpu
