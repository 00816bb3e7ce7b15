// Sparse shared-KV multi-query attention with a per-head attention sink: the attention core of
// DeepSeek-V4 (reference: eager_attention_forward in transformers' modeling_deepseek_v4.py),
// forward and backward. Dispatches to the AVX-512 kernel, the AVX2 kernel (CPUs without AVX-512) or
// the scalar reference.
//
// All H query heads share ONE set of key rows, and the key and the value are the same row (K = V
// = kv). Query i attends an explicit list of kv rows idx[off[i] .. off[i+1]) built by the caller
// (its sliding window plus the selected compressed entries; distinct rows, any order, possibly
// empty). With s_j = scale * q[i,h] . kv[j] over the listed rows and the sink logit sink[h]:
//   lse[i,h] = log(sum_j exp(s_j) + exp(sink[h]))      (the sink term is absent when sink == null)
//   o[i,h]   = sum_j exp(s_j - lse[i,h]) kv[j]           (the sink joins the softmax, has no value)
// A query with no keys gives o = 0 (lse = sink[h], or -inf without a sink).
//
// Gradients: the activation gradient dq OVERWRITES; dkv (gradient of the kv activation, which is
// summed from many queries) and the parameter gradient dsink ACCUMULATE (+=). Results do not
// depend on the thread count: dkv and dsink are reduced over fixed query chunks in chunk order.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/gemm.h"  // Prec

namespace trex::kern {

struct SparseAttnShape {
  int64_t N;    // queries
  int H;        // query heads
  int D;        // head dim (q, k and v all D)
  float scale;  // multiplies q.k
  // The precision the kernel may round its products' operands to (q, kv, the probabilities, dO
  // and the score gradients), accumulating in f32, as AttnShape::prec (kernels/attention.h): on
  // the CPU, the AVX512_BF16 kernel where the CPU has it, else f32 as for F32.
  Prec prec = Prec::F32;
};

// q: [N, H, D]  kv: [M, D] (key = value rows)  off: [N+1] int64 (off[0] = 0, non-decreasing)
// idx: [off[N]] int32 rows of kv: query i attends rows idx[off[i] .. off[i+1]) (distinct, any
// order)  sink: [H] or null (no sink)
// -> o: [N, H, D]  lse: [N, H] = log(sum_j exp(scale q.k_j) + exp(sink[h])) (natural log; saved
// for backward)
void sparse_attn_fwd(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                     const int64_t* off, const int32_t* idx, const float* sink, float* o,
                     float* lse);

// q, kv, off, idx, sink: as in forward  o: [N, H, D] and lse: [N, H] from sparse_attn_fwd
// dO: [N, H, D]  workspace: [sparse_attn_bwd_workspace_floats(sh, M)] floats (may be null when
// that is 0; contents on entry do not matter)
// -> dq: [N, H, D] OVERWRITTEN  dkv: [M, D] ACCUMULATED (+=)  dsink: [H] ACCUMULATED (null iff sink
// is null)
void sparse_attn_bwd(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                     const int64_t* off, const int32_t* idx, const float* sink, const float* o,
                     const float* lse, const float* dO, float* dq, float* dkv, float* dsink,
                     float* workspace);

// Floats of workspace sparse_attn_bwd needs: (chunks - 1) partial [M, D] copies of dkv plus
// chunks x round16(H) partial dsinks, chunks = clamp(ceil(N / 256), 1, 16) (a function of the
// shape only, never of the thread count).
size_t sparse_attn_bwd_workspace_floats(const SparseAttnShape& sh, int64_t M);

}  // namespace trex::kern
