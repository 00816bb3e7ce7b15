// The lightning indexer's scores on the AVX512_BF16 dot-product instruction (vdpbf16ps), for a
// bf16 shape (kernels/indexer.h, IndexerShape::prec): q and k rounded to bf16 (nearest even), each
// product exact, summed in f32 two dimensions at a time; relu, the head weights and the scale
// then as the f32 kernel (kernels/cpu/indexer_avx512.cpp, which selects the top-k from these
// scores). Called only on CPUs with AVX512_BF16.
#pragma once
#include <cstdint>

namespace trex::kern::cpu {

// Words of one head's (or one key's) bf16 pairs: dimensions (2i, 2i + 1) in word i, 2i in the low
// half, a zero past dI.
inline int indexer_pairs(int dI) { return (dI + 1) / 2; }

// Keys k [B, nw, dI] -> kp [B][npan][pairs][32] words (npan = round_up(nw, 32) / 32; entries past
// nw are zero): for each panel of 32 entries and each pair of dimensions, the 32 entries' words
// side by side. Threads split the panels.
void indexer_pack_keys_bf16(int64_t B, int64_t nw, int dI, const float* k, uint32_t* kp);

// One query's heads q [nh, dI] -> qp [nh][pairs] words.
void indexer_pack_query_bf16(int nh, int dI, const float* q, uint32_t* qp);

// row[0 : round_up(nv, 32)] = scale * sum_h w[h] relu(q_h . k_s) for the first entries of one
// batch row's panels kp (entries >= nv of the last panel are garbage); qp from
// indexer_pack_query_bf16.
void indexer_score_row_bf16(const uint32_t* qp, const float* w, const uint32_t* kp, int64_t nv, int nh, int dI,
                            float scale, float* row);

}  // namespace trex::kern::cpu
