// The RoPE rotation of one pair (a, b) by an angle with cosine c and sine s (kernels/rope.h):
// forward (a, b) -> (a c - b s, b c + a s); the inverse (the adjoint) negates s.
#pragma once
#include "kernels/hd/hd.h"

namespace trex::kern::hd {

template <class T>
TREX_HD void rope_rotate(T& a, T& b, T c, T s, bool inverse) {
  if (inverse) s = -s;
  const T a0 = a, b0 = b;
  a = a0 * c - b0 * s;
  b = b0 * c + a0 * s;
}

// Offsets of pair i of a D-wide head: Interleaved (2i, 2i+1), HalfSplit (i, i + D/2).
TREX_HD void rope_pair(bool interleaved, int i, int D, int& ia, int& ib) {
  ia = interleaved ? 2 * i : i;
  ib = interleaved ? 2 * i + 1 : i + D / 2;
}

}  // namespace trex::kern::hd
