// Expert-parallel dispatch and combine of the MoE layer (model/moe.h) over all-to-all-v.
//
// Row orders. "Sorted": this rank's (token, slot) rows sorted by global expert (Dispatch), so the
// rows for ep rank p (experts [p * El, (p + 1) * El)) are one contiguous run. "Received": the
// rows that arrived, source rank major, and inside each source by local expert. "Local": expert
// major, source rank minor: each local expert's rows are contiguous for the grouped GEMM.
#pragma once
#include <vector>
#include "core/stack_arena.h"
#include "model/moe.h"
#include "parallel/comm.h"

namespace trex::model {

// Exchanges the per-expert row counts (a small all-to-all of int64) and fills r: rows to and from
// every rank, the local experts' offsets and the received -> local permutation (perm from A).
// offsets: [E + 1] sorted-order first row of every global expert. Collective over ep.comm.
void ep_plan(const ExpertParallel& ep, const std::vector<int64_t>& offsets, StackArena& A, EpRoute& r);
// Out along the dispatch route: sorted [R, w] -> recv [Rl, w] (received order). Asynchronous.
parallel::Handle ep_dispatch_rows(const ExpertParallel& ep, const EpRoute& r, const float* sorted, float* recv,
                                  int64_t w);
// Back along the combine route: recv [Rl, w] (received order) -> sorted [R, w]. Blocking.
void ep_combine_rows(const ExpertParallel& ep, const EpRoute& r, const float* recv, float* sorted, int64_t w);
// recv [Rl, w] (received order) -> local [Rl, w] (local order), and back.
void ep_to_local(const EpRoute& r, const float* recv, float* local, int64_t w);
void ep_from_local(const EpRoute& r, const float* local, float* recv, int64_t w);

}  // namespace trex::model
