// Sparse shared-KV attention with an attention sink on the AVX512_BF16 dot-product instruction
// (vdpbf16ps), forward and backward; semantics and shapes as in kernels/sparse_attn.h, which
// calls it when SparseAttnShape::prec is BF16 and the CPU has AVX512_BF16 (Isa::Avx512Bf16).
// Every product (scores q.kv, o = P kv; backward q.kv again, dP = dO.kv, dq = dS kv,
// dkv += dS^T q + P^T dO) rounds its two operands to bf16 (round to nearest even) and accumulates
// in f32; the softmax (max, exp, sum), lse, the sink, delta = rowsum(dO o) and the scaling of dS
// stay in f32. Rounding points: q, kv and dO once per call; per query, the forward's
// exponentials exp(scale q.kv - max) (o is scaled by 1 / their sum in f32 afterwards), the
// backward's probabilities P = exp(scale q.kv - lse) and the scaled dS.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/sparse_attn.h"

namespace trex::kern::cpu {

// q: [N,H,D]  kv: [M,D]  off: [N+1]  idx: [off[N]]  sink: [H] or null -> o: [N,H,D]  lse: [N,H]
void sparse_attn_fwd_avx512bf16(const SparseAttnShape& sh, const float* q, const float* kv,
                                int64_t M, const int64_t* off, const int32_t* idx,
                                const float* sink, float* o, float* lse);

// as sparse_attn_fwd plus o, lse from it and dO: [N,H,D]; workspace: at least
// sparse_attn_bwd_workspace_floats_avx512(sh, M) floats (the same chunks as the f32 kernels)
// -> dq: [N,H,D] (overwritten)  dkv: [M,D] (+=)  dsink: [H] (+=, null iff sink null)
void sparse_attn_bwd_avx512bf16(const SparseAttnShape& sh, const float* q, const float* kv,
                                int64_t M, const int64_t* off, const int32_t* idx,
                                const float* sink, const float* o, const float* lse,
                                const float* dO, float* dq, float* dkv, float* dsink,
                                float* workspace);

}  // namespace trex::kern::cpu
