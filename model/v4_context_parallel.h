// Context parallelism for DeepSeek-V4's attention (model/context_parallel.h has the split and the
// collectives; docs/PARALLEL.md, "Context parallelism"). Each cp rank holds the 2c local tokens of
// every row and computes their queries; the keys are the whole rows':
//   forward:  the per-token key-side projections of the local tokens (kv(x), the compressor's
//             c_kv(x) / c_gate(x), the CSA indexer's i_kv(x) / i_gate(x)) are all-gathered into
//             whole rows [B, T, w]; every rank then runs the cheap per-token and per-window work
//             (kv_norm, RoPE, window pooling, the compressed entries' norm and RoPE, the indexer's
//             keys) over the whole rows, so sliding rows and compressed entries are exactly one
//             process's, and builds the key lists of its local queries at their sequence indices.
//   backward: the gradients of the gathered projections are this rank's queries' share; a
//             reduce-scatter returns their sum to the owners, whose projection backward gives dx
//             and the weight gradients (partial on each cp rank, summed by the gradient sync).
// Tensor parallel: the cp group is the ranks of one tp rank (parallel/dims.h). The key side runs
// in full on every tp rank (V4AttnIn::tp), so each tp rank exchanges it over its own cp group; the
// gradients returned are its heads' share, partial over tp through the (linear) reduce-scatter,
// and the tp reduction of the layer's input gradient and of the attention's unsliced weights
// completes them, as without cp.
// The indexer's KL loss and recall (train.indexer_loss_weight, train.indexer_recall) are per
// local query, the indexer's keys the whole rows' (model/v4_indexer.h).
#pragma once
#include <cstdint>

#include "core/stack_arena.h"
#include "kernels/v4_rows.h"
#include "model/context_parallel.h"

namespace trex::model {

// The sequence index of each local query: [B Tl] (query i of local row i / Tl sits at
// qidx[i % Tl]), host memory from A.
int32_t* v4_cp_query_positions(const CpAttn& cp, int64_t B, StackArena& A);

// The key lists of the local queries (kernels/v4_rows.h's lists, against the whole rows): ks is
// the whole rows' shape (ks.T = the sequence length, ks.nw its entries); key row b T + u is token
// u of row b, row B T + b nw + w entry w. seg: the whole rows' documents [B, T] or null; cnt [Nl],
// sel [Nl, topk]: the indexer's selection of the local queries (Csa only). -> off [Nl + 1], and
// idx [off[Nl]] allocated from A.
void v4_cp_key_lists(const kern::V4KeyShape& ks, const CpAttn& cp, const int32_t* seg, const int32_t* cnt,
                     const int32_t* sel, int64_t* off, int32_t** idx, StackArena& A);

}  // namespace trex::model
