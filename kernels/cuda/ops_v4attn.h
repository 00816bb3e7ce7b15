// The CUDA kernels of DeepSeek-V4's attention core: sparse shared-KV sink attention (forward and
// backward, kernels/cuda/sparse_attn.cu) and the lightning-indexer top-k (kernels/cuda/indexer.cu).
// Each function has the semantics of the kern:: function of the same name (kernels/sparse_attn.h,
// kernels/indexer.h); every pointer is device memory (off and idx included), workspace has the
// size the kern:: *_workspace_floats function gives (these kernels do not use it: their scratch
// comes from Scratch; it may be null), and the work is enqueued on ctx.stream. The lists are not
// checked here (they are device memory): off non-decreasing from 0, idx rows in [0, M) and
// distinct within a query, as kern::sparse_attn_* requires (the CPU checks the first two).
#pragma once
#include "kernels/cuda/ops.h"
#include "kernels/indexer.h"
#include "kernels/sparse_attn.h"

namespace trex::kern::cuda {
void sparse_attn_fwd(const Ctx& c, const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                     const int64_t* off, const int32_t* idx, const float* sink, float* o, float* lse);
void sparse_attn_bwd(const Ctx& c, const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                     const int64_t* off, const int32_t* idx, const float* sink, const float* o, const float* lse,
                     const float* dO, float* dq, float* dkv, float* dsink, float* workspace);
void indexer_topk(const Ctx& c, const IndexerShape& sh, const float* q, const float* k, const float* wts,
                  const int32_t* pos, int32_t* cnt, int32_t* sel, float* scores_out, float* workspace);
}  // namespace trex::kern::cuda
