// Row operations of DeepSeek-V4's training step besides its big kernels (model/v4_attn.cpp,
// model/v4_indexer.cpp), so that the step runs through the backend's kernel table: a scale, and
// each query's list of attended key rows for kern::sparse_attn_fwd / _bwd (its sliding window
// plus the compressed entries of its layer kind). The per-row math is kernels/hd/v4_rows.h, which
// the CUDA kernels (kernels/cuda/v4_rows.cu) run too.
#pragma once
#include <cstdint>

namespace trex::kern {

// x [n] *= a
void scale(float* x, int64_t n, float a);

// The attended rows of a V4 attention layer over B rows of T tokens, N = B T queries; the key
// rows are the N sliding rows, then B nw compressed entries (row N + b nw + w).
//   Sliding: rows u of t's batch row with t - W < u <= t.
//   Hca:     those, then the entries w < min((t + 1) / m, nw) (window start w m).
//   Csa:     those, then the indexer's selection sel[i, 0 .. cnt[i]) (window start max(0, (w-1) m)).
//   CsaDense: those, then every complete entry w ((w + 1) m <= t + 1, w < nw) (the indexer's
//            dense warm-up).
// seg [B, T] (null: one document a row): an entry or sliding row is kept only when its first token
// is in t's document.
enum class V4Keys : int { Sliding, Hca, Csa, CsaDense };
struct V4KeyShape {
  int64_t B, T;
  int64_t W;   // sliding_window
  int64_t m;   // compress rate (1 for Sliding)
  int64_t nw;  // compressed entries per row (0 for Sliding)
  V4Keys kind;
  int topk;    // columns of sel (Csa)
};

// -> off [N + 1]: off[0] = 0, off[i + 1] = off[i] + number of rows of query i.
// cnt [N], sel [N, topk]: the indexer's (kern::indexer_topk; Csa only, else may be null).
void v4_key_offsets(const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel, int64_t* off);
// -> idx [off[N]]: query i's rows at idx[off[i] .. off[i + 1]) in the order above.
void v4_key_fill(const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel, const int64_t* off,
                 int32_t* idx);

}  // namespace trex::kern
