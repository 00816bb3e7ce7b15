// Scalar reference for the RoPE rotation (the canonical definition). For each token n, head h
// and pair index i < D/2, with c = cos[pos[n], i], s = sin[pos[n], i] (s negated when inverse):
//   Interleaved: (a, b) = (x[2i], x[2i+1]);   HalfSplit: (a, b) = (x[i], x[i + D/2])
//   a' = a*c - b*s,  b' = b*c + a*s            (in place)
#pragma once
#include <cstdint>
#include "kernels/hd/rope.h"
#include "kernels/rope.h"

namespace trex::kern::ref {

// x: N tokens x H heads, slice at x + n*stride_tok + h*stride_head, D wide  pos: [N]
// cos, sin: [max_pos, D/2]
template <class T>
void rope_apply(T* x, int64_t N, int H, int64_t stride_tok, int64_t stride_head, int D, const int32_t* pos,
                const T* cos, const T* sin, RopeLayout layout, bool inverse) {
  const int half = D / 2;
  for (int64_t n = 0; n < N; ++n) {
    const T* cr = cos + static_cast<int64_t>(pos[n]) * half;
    const T* sr = sin + static_cast<int64_t>(pos[n]) * half;
    for (int h = 0; h < H; ++h) {
      T* xp = x + n * stride_tok + h * stride_head;
      for (int i = 0; i < half; ++i) {
        int ia, ib;
        hd::rope_pair(layout == RopeLayout::Interleaved, i, D, ia, ib);
        hd::rope_rotate(xp[ia], xp[ib], cr[i], sr[i], inverse);
      }
    }
  }
}

}  // namespace trex::kern::ref
