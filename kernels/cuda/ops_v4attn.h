// The CUDA kernels of DeepSeek-V4's sparse attention with sinks (kernels/sparse_attn.h) and of its
// indexer's top-k (kernels/indexer.h): kernels/cuda/sparse_attn.cu and kernels/cuda/indexer.cu.
// Each has exactly the arguments and semantics of the kern:: function of the same name; every
// pointer is device memory and the work is enqueued on c.stream.
#pragma once
#include <cstdint>
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
