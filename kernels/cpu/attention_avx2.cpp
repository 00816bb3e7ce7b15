// AVX2 + FMA flash attention, forward and backward: the tile drivers of
// kernels/cpu/attention_tiles.h on 8-float vectors (avx2::V8: rows padded to whole vectors, a
// 6 x 16-column micro-kernel in 12 of the 16 ymm registers, exp2 built in the exponent bits). It
// replaces the GEMM-based kernel (attention_blas.cpp) on AVX2 CPUs: no oneDNN call per small tile,
// no T-wide score rows, a polynomial exp fused with the max / sum passes, masks only on the tiles
// that need them.
#include "kernels/cpu/attention_avx2.h"

#include "kernels/cpu/simd_avx2.h"
// After the ISA header: the drivers are compiled here with this file's flags.
#include "kernels/cpu/attention_tiles.h"

namespace trex::kern::cpu {

void attention_fwd_avx2(const AttnShape& sh, const float* q, const float* k, const float* v,
                        float* o, float* lse, const int32_t* seg) {
  attention_fwd_tiles<avx2::V8>(sh, q, k, v, o, lse, seg);
}

void attention_bwd_avx2(const AttnShape& sh, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* dO, float* dq, float* dk,
                        float* dv, const int32_t* seg) {
  attention_bwd_tiles<avx2::V8>(sh, q, k, v, o, lse, dO, dq, dk, dv, seg);
}

}  // namespace trex::kern::cpu
