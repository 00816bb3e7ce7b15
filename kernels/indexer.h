// Lightning-indexer top-k of DeepSeek-V4's compressed sparse attention (HF DeepseekV4Indexer +
// DeepseekV4IndexerScorer, no cache), forward only: in the reference the selection carries no
// gradient, so the indexer gets none. Exact definition: kernels/ref/indexer.h.
//   score[b, t, s] = sum_h wts[b, t, h] * relu(q[b, t, h, :] . k[b, s, :]) * softmax_scale
//   entry s is valid for query t iff s < (pos[b, t] + 1) / m (floor division; later entries are
//   future windows); the top min(topk, nw) entries by score among the valid ones are selected.
// Output per query: cnt = number of selected entries (= min(topk, nw, valid count)), sel = their
// indices in ascending order, padded with -1 up to topk. Ties: the lower index wins (torch does
// not specify; parity data avoids ties); -0 equals +0; NaN ranks above every number.
// Caller's inputs: q already roped, k = the compressed indexer keys (normed and roped), wts =
// weights_proj(h) * nh^-0.5, softmax_scale = dI^-0.5.
// The fast path computes scores only for the valid entries of queries that have more valid
// entries than min(topk, nw) (the others select all their valid entries) unless scores_out is
// given. Dispatches to the AVX-512 kernel (kernels/cpu/indexer_avx512.cpp), the AVX2 kernel
// (kernels/cpu/indexer_avx2.cpp, CPUs without AVX-512) or the reference.
#pragma once
#include <cstddef>
#include <cstdint>
#include "kernels/gemm.h"

namespace trex::kern {

struct IndexerShape {
  int64_t B, T, nw;     // batch rows, tokens per row, compressed entries per row
  int nh, dI;           // indexer heads, indexer head dim
  int64_t m;            // compress rate (>= 1)
  int topk;             // index_topk (>= 0)
  float softmax_scale;  // dI^-0.5 in DeepSeek-V4
  // BF16: on a CPU where the attention core runs on the bf16 dot-product kernels
  // (kern::attention_bf16_kernels: AVX512_BF16, TREX_ATTN not f32) the scores round q and k to
  // bf16 (nearest even), each product exact, summed in f32 (DeepSeek's own indexer scores in
  // FP8); elsewhere (other CPUs, the CUDA backend), and for F32, the scores are f32 throughout.
  Prec prec = Prec::F32;
};

// q: [B, T, nh, dI]  k: [B, nw, dI]  wts: [B, T, nh]  pos: [B, T]
//   -> cnt: [B*T]  sel: [B*T, topk] (ascending, -1 padded)
//      scores_out: [B, T, nw] (score of valid entries, -inf for future ones) or null
// workspace: [indexer_workspace_floats(shape)] floats (contents on entry ignored).
void indexer_topk(const IndexerShape& sh, const float* q, const float* k, const float* wts, const int32_t* pos,
                  int32_t* cnt, int32_t* sel, float* scores_out, float* workspace);

// Floats of workspace indexer_topk needs: the keys packed in panels of 32 entries
// (B * round_up(nw, 32) * dI) plus one score row of round_up(nw, 32) for each of up to
// kIndexerMaxThreads threads (more threads than that are not used).
size_t indexer_workspace_floats(const IndexerShape& sh);
constexpr int kIndexerMaxThreads = 64;

// Number of valid entries of a query at position pos: clamp(floor((pos + 1) / m), 0, nw).
inline int64_t indexer_valid_count(int64_t pos, int64_t m, int64_t nw) {
  if (pos + 1 <= 0) return 0;
  const int64_t n = (pos + 1) / m;
  return n < nw ? n : nw;
}

}  // namespace trex::kern
