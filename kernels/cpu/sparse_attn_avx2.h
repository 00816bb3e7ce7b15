// AVX2 + FMA sparse shared-KV attention with an attention sink (forward and backward) for CPUs
// without AVX-512; semantics and shapes as in kernels/sparse_attn.h (dq OVERWRITES, dkv and dsink
// ACCUMULATE). Call through kernels/sparse_attn.h, which checks the shape, the lists and the CPU;
// the tests call these directly (the CPU must have AVX2 + FMA).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/sparse_attn.h"

namespace trex::kern::cpu {

// Fixed query chunks of the backward's deterministic dkv / dsink reduction: a function of N only
// (the same chunking as the AVX-512 kernel).
constexpr int64_t kSparseAttnAvx2ChunkMin = 256;  // queries per chunk at least (below 16 chunks)
constexpr int64_t kSparseAttnAvx2ChunksMax = 16;
inline int64_t sparse_attn_bwd_chunks_avx2(int64_t N) {
  return std::clamp<int64_t>((N + kSparseAttnAvx2ChunkMin - 1) / kSparseAttnAvx2ChunkMin, 1,
                             kSparseAttnAvx2ChunksMax);
}
// Workspace floats: (chunks - 1) x [M, D] partial dkv + chunks x round8(H) partial dsink.
inline size_t sparse_attn_bwd_workspace_floats_avx2(const SparseAttnShape& sh, int64_t M) {
  const int64_t c = sparse_attn_bwd_chunks_avx2(sh.N), hp = (sh.H + 7) / 8 * 8;
  return static_cast<size_t>((c - 1) * M * sh.D + c * hp);
}

// q: [N,H,D]  kv: [M,D]  off: [N+1]  idx: [off[N]]  sink: [H] or null -> o: [N,H,D]  lse: [N,H]
void sparse_attn_fwd_avx2(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                          const int64_t* off, const int32_t* idx, const float* sink, float* o,
                          float* lse);

// as sparse_attn_fwd plus o, lse from it and dO: [N,H,D]; workspace:
// [sparse_attn_bwd_workspace_floats_avx2(sh, M)] floats (contents on entry ignored)
// -> dq: [N,H,D] (overwritten)  dkv: [M,D] (+=)  dsink: [H] (+=, null iff sink null)
void sparse_attn_bwd_avx2(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                          const int64_t* off, const int32_t* idx, const float* sink,
                          const float* o, const float* lse, const float* dO, float* dq,
                          float* dkv, float* dsink, float* workspace);

}  // namespace trex::kern::cpu
