// AVX-512 sparse shared-KV attention with an attention sink, forward and backward: the drivers of
// kernels/cpu/sparse_attn_tiles.h on 16-float vectors (avx512::V16) with this file's tuning.
#include "kernels/cpu/sparse_attn_avx512.h"

#include "kernels/cpu/simd_avx512.h"
// After the ISA header: the drivers are compiled here with this file's flags.
#include "kernels/cpu/sparse_attn_tiles.h"

namespace trex::kern::cpu {
namespace {

// 32 zmm registers. Blocks of 128 key rows. Scores: 12 row pointers + k + B fill the general-
// purpose registers. Transposed values: with one vector of columns (H <= 16) every FMA needs its
// own broadcast load, so the loads bound it: more rows amortize the B load and the prefetches
// (28 accumulators + 2 fit 32 zmm). The next query's operands stream into L2 during the value
// products, and the kv row 8 steps ahead is prefetched.
struct Tune512 {
  static constexpr int kKBMax = 128;
  static int block_rows(int) { return kKBMax; }
  static constexpr int kScoreRows = 12;
  static constexpr int rows_scores(int nv) { return nv <= 2 ? 12 : nv == 3 ? 8 : 6; }
  static constexpr int kValsRows = 28;
  static constexpr int rows_valst(int nv) { return nv == 1 ? 28 : nv == 2 ? 12 : nv == 3 ? 8 : 6; }
  static constexpr int kKeyRows = 6;
  static constexpr bool kPrefetchNext = false;
  static constexpr bool kPrefetchStream = true;
  static int64_t chunks(int64_t N) { return sparse_attn_bwd_chunks(N); }
};

}  // namespace

void sparse_attn_fwd_avx512(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                            const int64_t* off, const int32_t* idx, const float* sink, float* o,
                            float* lse) {
  (void)M;
  sparse_attn_fwd_tiles<avx512::V16, Tune512>(sh, q, kv, off, idx, sink, o, lse);
}

void sparse_attn_bwd_avx512(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                            const int64_t* off, const int32_t* idx, const float* sink,
                            const float* o, const float* lse, const float* dO, float* dq,
                            float* dkv, float* dsink, float* workspace) {
  sparse_attn_bwd_tiles<avx512::V16, Tune512>(sh, q, kv, M, off, idx, sink, o, lse, dO, dq, dkv,
                                              dsink, workspace);
}

}  // namespace trex::kern::cpu
