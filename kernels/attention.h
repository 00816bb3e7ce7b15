// Causal softmax attention, flash style (FlashAttention-2: tiled, online softmax, no T x T
// matrix), forward and backward. Dispatches to the AVX-512 kernel, or on CPUs without AVX-512 to
// the AVX2 + FMA one (kernels/cpu/attention_avx2.h; TREX_ATTN=blas picks the GEMM-based
// kernels/cpu/attention_blas.h instead), or under TREX_ISA=ref to the scalar reference; a BF16
// shape (below) on an AVX512_BF16 CPU goes to kernels/cpu/attention_avx512bf16.h (TREX_ATTN=f32:
// not).
// Layout [B, T, H, D] row-major (token-major, as the projections produce it); with AttnShape::Tq
// the queries (and o, dO, dq, lse) hold only the last Tq positions. Query t (a position) of batch
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
  // Tq > 0: the queries are the last Tq of the T positions (query row i sits at position
  // T - Tq + i: FlashAttention's bottom-right causal alignment for Tq != Tk), as a
  // context-parallel rank's chunk of a row attends every key before it; 0: all T. Needs a flash
  // kernel (attention_supports_rows below).
  int Tq = 0;
  // Backward: dk, dv += this call's gradients (from its queries only) instead of overwriting
  // them, so two query chunks of one row add into the same key gradients.
  bool acc_dkv = false;
  int rows() const { return Tq > 0 ? Tq : T; }  // query rows
};

// q: [B,Tq,H,Dqk]  k: [B,T,H,Dqk]  v: [B,T,H,Dv]  seg: [B,T] int32 document ids or null
// -> o: [B,Tq,H,Dv]  lse: [B,H,Tq] (natural log-sum-exp of the scaled scores of each query row,
// saved for backward; -inf for a row that sees no key, whose o is 0). Tq = sh.rows().
void attention_fwd(const AttnShape& sh, const float* q, const float* k, const float* v, float* o,
                   float* lse, const int32_t* seg = nullptr);

// q: [B,Tq,H,Dqk]  k: [B,T,H,Dqk]  v: [B,T,H,Dv]  o: [B,Tq,H,Dv] and lse: [B,H,Tq] from
// attention_fwd  dO: [B,Tq,H,Dv]  seg: as in forward -> dq: [B,Tq,H,Dqk] (overwritten)
// dk: [B,T,H,Dqk]  dv: [B,T,H,Dv] (overwritten, or added to with sh.acc_dkv).
void attention_bwd(const AttnShape& sh, const float* q, const float* k, const float* v,
                   const float* o, const float* lse, const float* dO, float* dq, float* dk,
                   float* dv, const int32_t* seg = nullptr);

// Whether attention_fwd / attention_bwd take sh with Tq != T and acc_dkv on this CPU: the flash
// kernels (AVX-512, AVX2, AVX512_BF16) do; the GEMM-based one and the scalar reference
// (TREX_ISA=ref) do not.
bool attention_supports_rows(const AttnShape& sh);

// A bf16 shape's products run on the bf16 dot-product kernels (this file's and
// kernels/sparse_attn.h's): the CPU has AVX512_BF16, its dot product outruns the FMAs
// (kernels/peak.h bf16_dot_fast), and TREX_ATTN is not f32 (read on every call, which costs nothing
// next to the attention: the parity test switches it between two runs of one process).
bool attention_bf16_kernels(Prec prec);

}  // namespace trex::kern
