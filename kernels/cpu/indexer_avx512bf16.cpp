// AVX512_BF16 scores of the lightning indexer (see indexer_avx512bf16.h): the f32 kernel's
// micro-kernel (kernels/cpu/indexer_score_avx512.h) on pair words, one vdpbf16ps per head, vector
// and pair of dimensions: half the instructions of the f32 FMAs.
// GCC 12 reports false (maybe-)uninitialized warnings inside the AVX-512 intrinsic headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "kernels/cpu/indexer_avx512bf16.h"
#include <immintrin.h>
#include "core/dtype.h"
#include "kernels/cpu/indexer_score_avx512.h"

namespace trex::kern::cpu {
namespace {

inline uint32_t pair_word(const float* x, int d, int dI) {
  const uint32_t lo = f32_to_bf16(x[d]).bits, hi = d + 1 < dI ? f32_to_bf16(x[d + 1]).bits : 0u;
  return lo | hi << 16;
}

// The bf16 pair operands of the scoring micro-kernel: q . k over a pair word by vdpbf16ps.
struct StepBf16 {
  using Word = uint32_t;
  using Vec = __m512bh;
  static Vec load(const uint32_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static Vec broadcast(uint32_t q) { return (__m512bh)_mm512_set1_epi32(static_cast<int>(q)); }
  static __m512 madd(__m512 acc, Vec q, Vec k) { return _mm512_dpbf16_ps(acc, q, k); }
};

}  // namespace

void indexer_pack_keys_bf16(int64_t B, int64_t nw, int dI, const float* k, uint32_t* kp) {
  pack_key_panels<kIndexerPanel>(B, nw, dI, indexer_pairs(dI), k, kp,
                                 [dI](const float* src, int64_t p) { return pair_word(src, 2 * p, dI); });
}

void indexer_pack_query_bf16(int nh, int dI, const float* q, uint32_t* qp) {
  const int P = indexer_pairs(dI);
  for (int h = 0; h < nh; ++h)
    for (int p = 0; p < P; ++p) qp[h * P + p] = pair_word(q + static_cast<int64_t>(h) * dI, 2 * p, dI);
}

void indexer_score_row_bf16(const uint32_t* qp, const float* w, const uint32_t* kp, int64_t nv, int nh, int dI,
                            float scale, float* row) {
  indexer_score::score_row<StepBf16>(qp, w, kp, nv, nh, indexer_pairs(dI), scale, row);
}

}  // namespace trex::kern::cpu
