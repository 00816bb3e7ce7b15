// DeepSeek-V4's gated window pooling, one window channel at a time (kernels/compress_pool.h; the
// definition is kernels/ref/compress_pool.h). Shared by the CPU reference and the CUDA kernels
// (kernels/cuda/compress_pool.cu).
#pragma once
#include <cmath>
#include <cstdint>
#include "kernels/hd/hd.h"

namespace trex::kern::hd {

// Slots of a window: 2m for c = 2 (the "Ca" half of window w-1, then the "Cb" half of window w),
// m for c = 1.
TREX_HD int64_t compress_pool_nslots(int64_t m, int c) { return c == 2 ? 2 * m : m; }

// Slot s of window w, channel ch (< hd), of row b: the index of its value and logit in kv / gate
// [B, T, c*hd] (*i) and of its position bias in pb [m, c*hd] (*ip). False when the slot does not
// exist (c = 2, window 0's Ca half: HF's -inf fill, weight exactly 0).
TREX_HD bool compress_pool_slot(int64_t b, int64_t w, int64_t ch, int64_t Tn, int64_t m, int64_t hd, int c, int64_t s,
                                int64_t* i, int64_t* ip) {
  const int64_t C = c * hd;
  if (c == 2 && s < m) {
    if (w == 0) return false;
    *i = (b * Tn + (w - 1) * m + s) * C + ch;
    *ip = s * C + ch;
    return true;
  }
  const int64_t r = c == 2 ? s - m : s, col = c == 2 ? hd + ch : ch;
  *i = (b * Tn + w * m + r) * C + col;
  *ip = r * C + col;
  return true;
}

// Softmax statistics of window w, channel ch: max logit, sum of exp(logit - max) and the output.
template <class T>
TREX_HD void compress_pool_stats(int64_t b, int64_t w, int64_t ch, int64_t Tn, int64_t m, int64_t hd, int c,
                                 const T* kv, const T* gate, const T* pb, T& mx, T& sum, T& out) {
  const int64_t S = compress_pool_nslots(m, c);
  int64_t i, ip;
  mx = -INFINITY;
  for (int64_t s = 0; s < S; ++s)
    if (compress_pool_slot(b, w, ch, Tn, m, hd, c, s, &i, &ip)) {
      const T l = gate[i] + pb[ip];
      if (l > mx) mx = l;
    }
  sum = 0;
  T acc = 0;
  for (int64_t s = 0; s < S; ++s)
    if (compress_pool_slot(b, w, ch, Tn, m, hd, c, s, &i, &ip)) {
      const T e = std::exp(gate[i] + pb[ip] - mx);
      sum += e;
      acc += e * kv[i];
    }
  out = acc / sum;
}

}  // namespace trex::kern::hd
