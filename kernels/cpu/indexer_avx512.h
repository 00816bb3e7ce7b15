// AVX-512 lightning-indexer top-k; semantics and shapes as in kernels/indexer.h. Call through
// kernels/indexer.h, which checks the arguments.
#pragma once
#include <cstdint>
#include "kernels/indexer.h"

namespace trex::kern::cpu {

// q: [B, T, nh, dI]  k: [B, nw, dI]  wts: [B, T, nh]  pos: [B, T]
//   -> cnt: [B*T]  sel: [B*T, topk]  scores_out: [B, T, nw] or null
// workspace: indexer_workspace_floats(sh) floats. bf16: the scores on the AVX512_BF16 dot product
// (kernels/cpu/indexer_avx512bf16.h; only on CPUs that have it), q and k rounded to bf16.
void indexer_topk_avx512(const IndexerShape& sh, const float* q, const float* k, const float* wts,
                         const int32_t* pos, int32_t* cnt, int32_t* sel, float* scores_out, float* workspace,
                         bool bf16 = false);

}  // namespace trex::kern::cpu
