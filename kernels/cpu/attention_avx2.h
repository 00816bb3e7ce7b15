// AVX2 + FMA flash attention (forward and backward) for CPUs without AVX-512; semantics and shapes
// as in kernels/attention.h. Call through kernels/attention.h, which checks the shape and the CPU.
#pragma once
#include <cstdint>

#include "kernels/attention.h"

namespace trex::kern::cpu {

// q: [B,Tq,H,Dqk]  k: [B,T,H,Dqk]  v: [B,T,H,Dv]  seg: [B,T] or null -> o: [B,Tq,H,Dv]
// lse: [B,H,Tq] (Tq = sh.rows())
void attention_fwd_avx2(const AttnShape& sh, const float* q, const float* k, const float* v,
                        float* o, float* lse, const int32_t* seg);

// q: [B,Tq,H,Dqk]  k: [B,T,H,Dqk]  v: [B,T,H,Dv]  o, dO: [B,Tq,H,Dv]  lse: [B,H,Tq]
// seg: [B,T] or null -> dq: [B,Tq,H,Dqk] (overwritten)  dk: [B,T,H,Dqk]  dv: [B,T,H,Dv]
// (overwritten, or added to with sh.acc_dkv)
void attention_bwd_avx2(const AttnShape& sh, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* dO, float* dq, float* dk,
                        float* dv, const int32_t* seg);

}  // namespace trex::kern::cpu
