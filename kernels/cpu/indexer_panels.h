// The packing of the lightning indexer's keys into the panels its CPU scoring kernels read:
// kernels/cpu/indexer_avx2.cpp (16 entries a panel, f32) and kernels/cpu/indexer_score_avx512.h
// (32 entries, f32 or bf16 pair words). No ISA-specific code: any kernel file may include it.
#pragma once
#include <cstdint>
#include "core/parallel.h"

namespace trex::kern::cpu {

// Keys k [B, nw, dI] -> kp [B][npan][len][P] words (npan = ceil(nw / P)): for each panel of P
// entries and each of the len words of a key, the P entries' words side by side; word(src, i) is
// word i of the key row src, entries past nw are zero words. Threads split the panels.
template <int64_t P, class Word, class WordOf>
void pack_key_panels(int64_t B, int64_t nw, int64_t dI, int64_t len, const float* k, Word* kp, WordOf word) {
  const int64_t npan = (nw + P - 1) / P;
  parallel_for(B * npan, 4, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / npan, s0 = (i % npan) * P;
      Word* dst = kp + i * len * P;
      for (int64_t j = 0; j < P; ++j) {
        const int64_t s = s0 + j;
        const float* src = s < nw ? k + (b * nw + s) * dI : nullptr;
        for (int64_t w = 0; w < len; ++w) dst[w * P + j] = src ? word(src, w) : Word{};
      }
    }
  });
}

}  // namespace trex::kern::cpu
