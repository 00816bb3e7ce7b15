// AVX2 + FMA lightning-indexer top-k for CPUs without AVX-512; semantics and shapes as in
// kernels/indexer.h (the exact definition, tie-breaking included: kernels/ref/indexer.h). Call
// through kernels/indexer.h, which checks the arguments; the tests call it directly (the CPU must
// have AVX2 + FMA). Forward only: the selection carries no gradient.
#pragma once
#include <cstdint>

#include "kernels/indexer.h"

namespace trex::kern::cpu {

// q: [B, T, nh, dI]  k: [B, nw, dI]  wts: [B, T, nh]  pos: [B, T]
//   -> cnt: [B*T]  sel: [B*T, topk] (ascending, -1 padded)  scores_out: [B, T, nw] or null
// workspace: indexer_workspace_floats(sh) floats (this kernel uses at most that many).
void indexer_topk_avx2(const IndexerShape& sh, const float* q, const float* k, const float* wts,
                       const int32_t* pos, int32_t* cnt, int32_t* sel, float* scores_out,
                       float* workspace);

}  // namespace trex::kern::cpu
