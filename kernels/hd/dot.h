// An f32 dot product with four running sums (elements d = 0, 1, 2, 3 mod 4, added pairwise at
// the end): four independent FMA chains for a GPU lane, and one fixed order that the CUDA
// kernels and their host models (tests/ops/*_hd_model.h) share.
#pragma once
#include "kernels/hd/hd.h"

namespace trex::kern::hd {

TREX_HD float dot4(const float* a, const float* b, int n) {
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
  int d = 0;
  for (; d + 4 <= n; d += 4) {
    s0 += a[d] * b[d];
    s1 += a[d + 1] * b[d + 1];
    s2 += a[d + 2] * b[d + 2];
    s3 += a[d + 3] * b[d + 3];
  }
  for (; d < n; ++d) s0 += a[d] * b[d];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace trex::kern::hd
