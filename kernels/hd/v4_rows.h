// DeepSeek-V4's key lists (kernels/v4_rows.h), one query at a time, shared by the CPU functions
// (kernels/v4_rows.cpp) and the CUDA kernels (kernels/cuda/v4_rows.cu).
#pragma once
#include <cstdint>
#include "kernels/hd/hd.h"
#include "kernels/v4_rows.h"

namespace trex::kern::hd {

// Whether token u of row b is in the document of token t (seg [B, T] or null).
TREX_HD bool v4_same_doc(const int32_t* seg, int64_t T, int64_t b, int64_t t, int64_t u) {
  return !seg || seg[b * T + u] == seg[b * T + t];
}

// The rows query i attends, in order, written to out (null: only counted); returns their number.
TREX_HD int64_t v4_query_keys(const V4KeyShape& s, const int32_t* seg, const int32_t* cnt, const int32_t* sel,
                              int64_t i, int32_t* out) {
  const int64_t T = s.T, N = s.B * T, b = i / T, t = i % T, m = s.m, nw = s.nw;
  int64_t n = 0;
  for (int64_t u = t - s.W + 1 > 0 ? t - s.W + 1 : 0; u <= t; ++u)
    if (v4_same_doc(seg, T, b, t, u)) {
      if (out) out[n] = (int32_t)(b * T + u);
      ++n;
    }
  const int64_t base = N + b * nw;
  if (s.kind == V4Keys::Hca) {
    const int64_t e = (t + 1) / m < nw ? (t + 1) / m : nw;
    for (int64_t w = 0; w < e; ++w)
      if (v4_same_doc(seg, T, b, t, w * m)) {
        if (out) out[n] = (int32_t)(base + w);
        ++n;
      }
  } else if (s.kind == V4Keys::CsaDense) {
    for (int64_t w = 0; w < nw && (w + 1) * m <= t + 1; ++w)
      if (v4_same_doc(seg, T, b, t, w > 0 ? (w - 1) * m : 0)) {
        if (out) out[n] = (int32_t)(base + w);
        ++n;
      }
  } else if (s.kind == V4Keys::Csa) {
    for (int64_t k = 0; k < cnt[i]; ++k) {
      const int64_t w = sel[i * s.topk + k];
      if (v4_same_doc(seg, T, b, t, w > 0 ? (w - 1) * m : 0)) {
        if (out) out[n] = (int32_t)(base + w);
        ++n;
      }
    }
  }
  return n;
}

}  // namespace trex::kern::hd
