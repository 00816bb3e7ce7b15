// Causal softmax attention, flash style (FlashAttention-2: tiled, online softmax, no T x T
// matrix), forward and backward. Dispatches to the AVX-512 kernel, or on CPUs without AVX-512 to
// the AVX2 + FMA one (kernels/cpu/attention_avx2.h; TREX_ATTN=blas picks the GEMM-based
// kernels/cpu/attention_blas.h instead), or under TREX_ISA=ref to the scalar reference; a BF16
// shape (below) on an AVX512_BF16 CPU goes to kernels/cpu/attention_avx512bf16.h (TREX_ATTN=f32:
// not).
// Layout [B, T, H, D] row-major (token-major, as the projections produce it). Query t of batch
// row b attends key s iff
//   s <= t  and  (seg == nullptr || seg[b,s] == seg[b,t])  and  (window <= 0 || s > t - window).
// Scores are scale * q.k (the model passes 1/sqrt(Dqk) times any YaRN factor); Dqk and Dv may
// differ (MLA). Gradients: attention has no parameters; the activation gradients dq, dk, dv
// OVERWRITE their outputs.
#pragma once
#include <cstdint>
#include "kernels/gemm.h"

namespace trex::kern {

struct AttnShape {
  int B, T, H, Dqk, Dv;
  float scale;     // multiplies q.k
  int window = 0;  // > 0: sliding window of this many keys (the query itself included)
  // The precision the kernel may round its products' operands to (q, k, v, the probabilities,
  // dO and the score gradients), accumulating in f32: BF16 lets an accelerator use its bf16
  // matrix units, as FlashAttention does in a bf16 run; on the CPU, the AVX512_BF16 kernel
  // (kernels/cpu/attention_avx512bf16.h) where the CPU has it, else f32 as for F32.
  Prec prec = Prec::F32;
};

// q: [B,T,H,Dqk]  k: [B,T,H,Dqk]  v: [B,T,H,Dv]  seg: [B,T] int32 document ids or null
// -> o: [B,T,H,Dv]  lse: [B,H,T] (natural log-sum-exp of the scaled scores of each query row,
// saved for backward; -inf for a row that sees no key, whose o is 0).
void attention_fwd(const AttnShape& sh, const float* q, const float* k, const float* v, float* o,
                   float* lse, const int32_t* seg = nullptr);

// q, k: [B,T,H,Dqk]  v: [B,T,H,Dv]  o: [B,T,H,Dv] and lse: [B,H,T] from attention_fwd
// dO: [B,T,H,Dv]  seg: as in forward -> dq, dk: [B,T,H,Dqk]  dv: [B,T,H,Dv] (overwritten).
void attention_bwd(const AttnShape& sh, const float* q, const float* k, const float* v,
                   const float* o, const float* lse, const float* dO, float* dq, float* dk,
                   float* dv, const int32_t* seg = nullptr);

}  // namespace trex::kern
