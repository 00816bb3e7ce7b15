// AVX512_BF16 scores of the lightning indexer (see indexer_avx512bf16.h). The micro-kernel is the
// f32 kernel's (kernels/cpu/indexer_avx512.cpp) with pairs of dimensions: for a panel of 32
// entries it keeps 8 heads x 2 vectors of q.k accumulators in registers, loads each pair word of
// the 32 keys once for the 8 heads and broadcasts each head's pair word, one vdpbf16ps per head
// and vector: half the instructions of the f32 FMAs.
// GCC 12 reports false (maybe-)uninitialized warnings inside the AVX-512 intrinsic headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "kernels/cpu/indexer_avx512bf16.h"
#include <immintrin.h>
#include <algorithm>
#include "core/dtype.h"
#include "core/parallel.h"

namespace trex::kern::cpu {
namespace {

constexpr int kHeads = 8;  // heads per micro-kernel call

inline uint32_t pair_word(const float* x, int d, int dI) {
  const uint32_t lo = f32_to_bf16(x[d]).bits, hi = d + 1 < dI ? f32_to_bf16(x[d + 1]).bits : 0u;
  return lo | hi << 16;
}

// sc0, sc1 += sum_{i<H} w[i] * relu(q_i . kp[:, 0:32]) for heads q_i = qh + i * P (P pair words
// each); kp: one panel [P][32] words.
template <int H>
inline void score_heads(const uint32_t* qh, const float* w, const uint32_t* kp, int P, __m512& sc0, __m512& sc1) {
  __m512 a0[H], a1[H];
#pragma GCC unroll 8
  for (int i = 0; i < H; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int p = 0; p < P; ++p) {
    const __m512bh k0 = (__m512bh)_mm512_loadu_si512(kp + p * kIndexerPanel);
    const __m512bh k1 = (__m512bh)_mm512_loadu_si512(kp + p * kIndexerPanel + 16);
#pragma GCC unroll 8
    for (int i = 0; i < H; ++i) {
      const __m512bh qb = (__m512bh)_mm512_set1_epi32(static_cast<int>(qh[i * P + p]));
      a0[i] = _mm512_dpbf16_ps(a0[i], qb, k0);
      a1[i] = _mm512_dpbf16_ps(a1[i], qb, k1);
    }
  }
  const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int i = 0; i < H; ++i) {  // max(0, x) returns x when x is NaN: relu keeps NaN as torch does
    const __m512 wi = _mm512_set1_ps(w[i]);
    sc0 = _mm512_fmadd_ps(wi, _mm512_max_ps(z, a0[i]), sc0);
    sc1 = _mm512_fmadd_ps(wi, _mm512_max_ps(z, a1[i]), sc1);
  }
}

using HeadsFn = void (*)(const uint32_t*, const float*, const uint32_t*, int, __m512&, __m512&);
constexpr HeadsFn kHeadsFn[kHeads + 1] = {nullptr,        score_heads<1>, score_heads<2>,
                                          score_heads<3>, score_heads<4>, score_heads<5>,
                                          score_heads<6>, score_heads<7>, score_heads<8>};

}  // namespace

void indexer_pack_keys_bf16(int64_t B, int64_t nw, int dI, const float* k, uint32_t* kp) {
  const int P = indexer_pairs(dI);
  const int64_t npan = (nw + kIndexerPanel - 1) / kIndexerPanel;
  parallel_for(B * npan, 4, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / npan, s0 = (i % npan) * kIndexerPanel;
      uint32_t* dst = kp + i * P * kIndexerPanel;
      for (int64_t j = 0; j < kIndexerPanel; ++j) {
        const int64_t s = s0 + j;
        const float* src = k + (b * nw + s) * dI;
        for (int p = 0; p < P; ++p) dst[p * kIndexerPanel + j] = s < nw ? pair_word(src, 2 * p, dI) : 0u;
      }
    }
  });
}

void indexer_pack_query_bf16(int nh, int dI, const float* q, uint32_t* qp) {
  const int P = indexer_pairs(dI);
  for (int h = 0; h < nh; ++h)
    for (int p = 0; p < P; ++p) qp[h * P + p] = pair_word(q + static_cast<int64_t>(h) * dI, 2 * p, dI);
}

void indexer_score_row_bf16(const uint32_t* qp, const float* w, const uint32_t* kp, int64_t nv, int nh, int dI,
                            float scale, float* row) {
  const int P = indexer_pairs(dI);
  const int64_t np = (nv + kIndexerPanel - 1) / kIndexerPanel;
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t p = 0; p < np; ++p) {
    __m512 sc0 = _mm512_setzero_ps(), sc1 = sc0;
    const uint32_t* kpp = kp + p * P * kIndexerPanel;
    for (int h0 = 0; h0 < nh; h0 += kHeads)
      kHeadsFn[std::min(kHeads, nh - h0)](qp + static_cast<int64_t>(h0) * P, w + h0, kpp, P, sc0, sc1);
    _mm512_storeu_ps(row + p * kIndexerPanel, _mm512_mul_ps(sc0, s));
    _mm512_storeu_ps(row + p * kIndexerPanel + 16, _mm512_mul_ps(sc1, s));
  }
}

}  // namespace trex::kern::cpu
