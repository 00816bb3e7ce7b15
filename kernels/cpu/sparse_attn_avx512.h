// AVX-512 sparse shared-KV attention with an attention sink (forward and backward); semantics
// and shapes as in kernels/sparse_attn.h. Call through kernels/sparse_attn.h, which checks the
// shape, the lists and the CPU.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/sparse_attn.h"

namespace trex::kern::cpu {

// Fixed query chunks of the backward's deterministic dkv / dsink reduction: a function of N only.
constexpr int64_t kSparseAttnChunkMin = 256;  // queries per chunk at least (below 16 chunks)
constexpr int64_t kSparseAttnChunksMax = 16;
inline int64_t sparse_attn_bwd_chunks(int64_t N) {
  return std::clamp<int64_t>((N + kSparseAttnChunkMin - 1) / kSparseAttnChunkMin, 1,
                             kSparseAttnChunksMax);
}
// Workspace floats: (chunks - 1) x [M, D] partial dkv + chunks x round16(H) partial dsink.
inline size_t sparse_attn_bwd_workspace_floats_avx512(const SparseAttnShape& sh, int64_t M) {
  const int64_t c = sparse_attn_bwd_chunks(sh.N), hp = (sh.H + 15) / 16 * 16;
  return static_cast<size_t>((c - 1) * M * sh.D + c * hp);
}

// q: [N,H,D]  kv: [M,D]  off: [N+1]  idx: [off[N]]  sink: [H] or null -> o: [N,H,D]  lse: [N,H]
void sparse_attn_fwd_avx512(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                            const int64_t* off, const int32_t* idx, const float* sink, float* o,
                            float* lse);

// as sparse_attn_fwd plus o, lse from it and dO: [N,H,D]; workspace: [bwd_workspace_floats]
// -> dq: [N,H,D] (overwritten)  dkv: [M,D] (+=)  dsink: [H] (+=, null iff sink null)
void sparse_attn_bwd_avx512(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                            const int64_t* off, const int32_t* idx, const float* sink,
                            const float* o, const float* lse, const float* dO, float* dq,
                            float* dkv, float* dsink, float* workspace);

}  // namespace trex::kern::cpu
