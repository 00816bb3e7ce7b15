// The per-query math of the lightning-indexer top-k (kernels/indexer.h), shared by the CUDA kernel
// (kernels/cuda/indexer.cu) and the CPU reference (kernels/ref/indexer.h ranks with
// indexer_rank_key, and the op harness runs the kernel's radix selection on the host against the
// reference's sort: tests/ops/compress_pool_ops.cpp, "indexer[hd]").
// Ranking: one 64-bit key per entry, larger = ranks first and distinct for distinct entries:
//   high 32 bits: the score's order key (NaN above +inf, -0 equal to +0, then the IEEE order);
//   low 32 bits:  ~index (among equal scores the lower index ranks first).
// The top cnt entries are then the cnt largest keys: a most-significant-digit radix selection
// (8 passes of 8 bits, indexer_radix_pick per pass) finds the cnt-th largest key exactly.
#pragma once
#include <cstdint>
#include <cstring>
#include "kernels/hd/hd.h"

namespace trex::kern::hd {

// Valid entries of a query at position pos: clamp(floor((pos + 1) / m), 0, nw) (as
// kern::indexer_valid_count, callable on the device).
TREX_HD int64_t indexer_nvalid(int64_t pos, int64_t m, int64_t nw) {
  if (pos + 1 <= 0) return 0;
  const int64_t n = (pos + 1) / m;
  return n < nw ? n : nw;
}

// One head's term added to the score: acc + w * (relu(dot) * scale); relu keeps NaN (torch).
TREX_HD float indexer_head_term(float acc, float w, float dot, float scale) {
  const float r = dot < 0.f ? 0.f : dot;
  return acc + w * (r * scale);
}

// Order key of a score: a > b (NaN highest, -0 == +0) iff key(a) > key(b).
TREX_HD uint32_t indexer_score_key(float s) {
  if (s != s) return 0xFFFFFFFFu;
  if (s == 0.f) s = 0.f;  // -0 -> +0
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(s);
#else
  std::memcpy(&u, &s, sizeof u);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Rank key of entry idx (< 2^31) with score s: distinct per entry, larger ranks first.
TREX_HD uint64_t indexer_rank_key(float s, int64_t idx) {
  return (uint64_t(indexer_score_key(s)) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(idx));
}

// One radix pass: hist[256] counts the candidate keys by their digit; `want` (>= 1) of the largest
// candidates are still to be found. Returns the digit holding the want-th largest and sets *want
// to its rank within that digit's keys (the keys of larger digits are all taken).
TREX_HD int indexer_radix_pick(const int* hist, int64_t* want) {
  int64_t above = 0;
  for (int d = 255; d > 0; --d) {
    if (above + hist[d] >= *want) {
      *want -= above;
      return d;
    }
    above += hist[d];
  }
  *want -= above;
  return 0;
}

}  // namespace trex::kern::hd
