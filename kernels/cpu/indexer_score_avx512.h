// The lightning indexer's scoring micro-kernel, shared by the f32 kernel
// (kernels/cpu/indexer_avx512.cpp) and the bf16 one (kernels/cpu/indexer_avx512bf16.cpp), whose keys
// pack_key_panels (kernels/cpu/indexer_panels.h) lays out in kIndexerPanel entries: a panel
// of 32 key entries against up to 8 heads at a time, 8 x 2 accumulators in registers (each key
// vector loaded once for the 8 heads, each head's word broadcast), then sc += w_h relu(acc) and
// the scale. The operand format is the Step's:
//   Step::Word  an element of q and of the panels: f32 (one dimension), or a bf16 pair word
//   Step::Vec   16 words of a panel; Step::load(p), Step::broadcast(word)
//   Step::madd(acc, q, k)  acc + q . k lane-wise (an FMA, or a vdpbf16ps over the pair)
// Panels: [len][32] words per 32 entries, len words per head (dI, or its pair count).
// Include only from files built with the AVX-512 flags; instantiate with a Step of internal
// linkage (each kernel file's own).
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include "core/parallel.h"
#include "kernels/cpu/indexer_panels.h"

namespace trex::kern::cpu {

constexpr int64_t kIndexerPanel = 32;  // key entries per packed panel (2 vectors)

namespace indexer_score {

constexpr int kHeads = 8;  // heads per micro-kernel call

// sc0, sc1 += sum_{i<H} w[i] * relu(q_i . kp[:, 0:32]) for heads q_i = qh + i * len; kp: one panel.
template <class Step, int H>
inline void score_heads(const typename Step::Word* qh, const float* w, const typename Step::Word* kp, int len,
                        __m512& sc0, __m512& sc1) {
  __m512 a0[H], a1[H];
#pragma GCC unroll 8
  for (int i = 0; i < H; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int d = 0; d < len; ++d) {
    const typename Step::Vec k0 = Step::load(kp + d * kIndexerPanel), k1 = Step::load(kp + d * kIndexerPanel + 16);
#pragma GCC unroll 8
    for (int i = 0; i < H; ++i) {
      const typename Step::Vec qb = Step::broadcast(qh[i * len + d]);
      a0[i] = Step::madd(a0[i], qb, k0);
      a1[i] = Step::madd(a1[i], qb, k1);
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

// row[0 : round_up(nv, 32)] = scale * sum_h w[h] relu(q_h . k_s): query qt (heads [nh][len]),
// weights w [nh], against the first panels of kp (entries >= nv of the last panel are garbage).
template <class Step>
void score_row(const typename Step::Word* qt, const float* w, const typename Step::Word* kp, int64_t nv, int nh,
               int len, float scale, float* row) {
  using Word = typename Step::Word;
  using HeadsFn = void (*)(const Word*, const float*, const Word*, int, __m512&, __m512&);
  static constexpr HeadsFn kFn[kHeads + 1] = {nullptr,
                                              score_heads<Step, 1>,
                                              score_heads<Step, 2>,
                                              score_heads<Step, 3>,
                                              score_heads<Step, 4>,
                                              score_heads<Step, 5>,
                                              score_heads<Step, 6>,
                                              score_heads<Step, 7>,
                                              score_heads<Step, 8>};
  const int64_t np = (nv + kIndexerPanel - 1) / kIndexerPanel;
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t p = 0; p < np; ++p) {
    __m512 sc0 = _mm512_setzero_ps(), sc1 = sc0;
    const Word* kpp = kp + p * len * kIndexerPanel;
    for (int h0 = 0; h0 < nh; h0 += kHeads)
      kFn[std::min(kHeads, nh - h0)](qt + static_cast<int64_t>(h0) * len, w + h0, kpp, len, sc0, sc1);
    _mm512_storeu_ps(row + p * kIndexerPanel, _mm512_mul_ps(sc0, s));
    _mm512_storeu_ps(row + p * kIndexerPanel + 16, _mm512_mul_ps(sc1, s));
  }
}

}  // namespace indexer_score
}  // namespace trex::kern::cpu
