// AVX2 + FMA sparse shared-KV attention with an attention sink, forward and backward: the drivers
// of kernels/cpu/sparse_attn_tiles.h on 8-float vectors (avx2::V8) with this file's tuning.
#include "kernels/cpu/sparse_attn_avx2.h"

#include "kernels/cpu/simd_avx2.h"
// After the ISA header: the drivers are compiled here with this file's flags.
#include "kernels/cpu/sparse_attn_tiles.h"

namespace trex::kern::cpu {
namespace {

// 16 ymm registers: micro-kernels hold at most 12 accumulators + the B vectors + one broadcast,
// 6 rows x 2 vectors (16 columns) or 12 rows x 1 vector. A block of key rows (~16 KiB) is sized
// to stay in L1 for the later products, which read each row once per group of output rows; while
// a block's scores run, the rows of the next row group are prefetched into L1 a line at a time,
// and the key grads prefetch the next group's dkv rows.
struct Tune2 {
  static constexpr int kKBMax = 128;
  // D floats a row, within ~16 KiB of L1 (at least 16, at most 128 rows).
  static int block_rows(int D) { return std::clamp(4096 / std::max(D, 1) / 8 * 8, 16, kKBMax); }
  static constexpr int rows_for(int nv) { return nv == 1 ? 12 : 6; }  // 12 accumulators
  static constexpr int kScoreRows = 12;
  static constexpr int rows_scores(int nv) { return rows_for(nv); }
  static constexpr int kValsRows = 12;
  static constexpr int rows_valst(int nv) { return rows_for(nv); }
  static constexpr int kKeyRows = 6;  // rows_for(2)
  static constexpr bool kPrefetchNext = true;
  static constexpr bool kPrefetchStream = false;
  static int64_t chunks(int64_t N) { return sparse_attn_bwd_chunks_avx2(N); }
};

}  // namespace

void sparse_attn_fwd_avx2(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                          const int64_t* off, const int32_t* idx, const float* sink, float* o,
                          float* lse) {
  (void)M;
  sparse_attn_fwd_tiles<avx2::V8, Tune2>(sh, q, kv, off, idx, sink, o, lse);
}

void sparse_attn_bwd_avx2(const SparseAttnShape& sh, const float* q, const float* kv, int64_t M,
                          const int64_t* off, const int32_t* idx, const float* sink,
                          const float* o, const float* lse, const float* dO, float* dq,
                          float* dkv, float* dsink, float* workspace) {
  sparse_attn_bwd_tiles<avx2::V8, Tune2>(sh, q, kv, M, off, idx, sink, o, lse, dO, dq, dkv, dsink,
                                         workspace);
}

}  // namespace trex::kern::cpu
