// Flash attention with bf16 operands on the AVX512_BF16 dot-product instruction (vdpbf16ps),
// forward and backward; semantics and shapes as in kernels/attention.h. kernels/attention.h
// calls it when AttnShape::prec is BF16 and the CPU has AVX512_BF16 (Isa::Avx512Bf16).
// Every product of the tiles (S = Q K^T, O += P V; backward S, dP = dO V^T, dV += P^T dO,
// dK += dS^T Q, dQ += dS K) rounds its two operands to bf16 (round to nearest even) and
// accumulates in f32; the softmax (max, exp, sum), lse, delta = rowsum(dO o) and the scaling of
// dS stay in f32. Rounding points: q, k, v and dO once per call; the forward's unnormalized
// probabilities exp(s - running max) (their f32 sum is the one divided by); the backward's P and
// dS per tile.
#pragma once
#include <cstdint>

#include "kernels/attention.h"

namespace trex::kern::cpu {

// q: [B,Tq,H,Dqk]  k: [B,T,H,Dqk]  v: [B,T,H,Dv]  seg: [B,T] or null -> o: [B,Tq,H,Dv]
// lse: [B,H,Tq] (Tq = sh.rows())
void attention_fwd_avx512bf16(const AttnShape& sh, const float* q, const float* k, const float* v,
                              float* o, float* lse, const int32_t* seg);

// q: [B,Tq,H,Dqk]  k: [B,T,H,Dqk]  v: [B,T,H,Dv]  o, dO: [B,Tq,H,Dv]  lse: [B,H,Tq]
// seg: [B,T] or null -> dq: [B,Tq,H,Dqk] (overwritten)  dk: [B,T,H,Dqk]  dv: [B,T,H,Dv]
// (overwritten, or added to with sh.acc_dkv)
void attention_bwd_avx512bf16(const AttnShape& sh, const float* q, const float* k, const float* v,
                              const float* o, const float* lse, const float* dO, float* dq,
                              float* dk, float* dv, const int32_t* seg);

}  // namespace trex::kern::cpu
