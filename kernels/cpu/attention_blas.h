// Causal attention through GEMMs (oneDNN sgemm) for CPUs without AVX-512: semantics and shapes
// as in kernels/attention.h. Per (batch row, head) and block of queries, the scores of the block
// against the keys it may see are one GEMM, masked and soft-maxed in a row-major scratch, and the
// output one more GEMM; the backward recomputes the probabilities from lse and needs four GEMMs
// per block. The scratch is [query block, visible keys]: at most kBlock x T floats per thread.
// Call through kernels/attention.h.
#pragma once
#include <cstdint>

#include "kernels/attention.h"

namespace trex::kern::cpu {

// q, k: [B,T,H,Dqk]  v: [B,T,H,Dv]  seg: [B,T] or null -> o: [B,T,H,Dv]  lse: [B,H,T]
void attention_fwd_blas(const AttnShape& sh, const float* q, const float* k, const float* v, float* o,
                        float* lse, const int32_t* seg);

// q, k: [B,T,H,Dqk]  v, o, dO: [B,T,H,Dv]  lse: [B,H,T]  seg: [B,T] or null
// -> dq, dk: [B,T,H,Dqk]  dv: [B,T,H,Dv] (overwritten)
void attention_bwd_blas(const AttnShape& sh, const float* q, const float* k, const float* v, const float* o,
                        const float* lse, const float* dO, float* dq, float* dk, float* dv, const int32_t* seg);

}  // namespace trex::kern::cpu
