// LM head + cross-entropy op cases shared by trex_ops (tests/ops/lm_head_ce_ops.cpp) and
// trex_cuda_ops (tests/ops_cuda/lm_head_ce_ops.cpp): the shapes both test and the inputs of one
// case, so both harnesses check their kernels on the same data.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>
#include "core/dtype.h"
#include "kernels/gemm.h"
#include "tests/ops/harness.h"

namespace trex::ops {

struct CeShape {
  int64_t N, d, V, chunk;
};
// Odd sizes, V = 1, one chunk, many, a chunk of 1; the default blocking at large vocabularies:
// one chunk of 65521 in row blocks of 256 and a tail of 44 rows (the 64 MiB logits block), and
// 70001 (past one chunk) in default chunks of 4096 with a tail of 369.
inline constexpr CeShape kCeShapes[] = {{1, 7, 5, 0},      {5, 16, 1, 0},      {37, 64, 1000, 300}, {129, 33, 1000, 0},
                                        {64, 100, 4099, 0}, {300, 48, 777, 128}, {17, 129, 1000, 1},
                                        {300, 6, 65521, 0}, {5, 12, 70001, 0}};

// Labels in [0, V), each -100 (ignored) with probability p_ignore.
inline std::vector<int32_t> ce_labels(int64_t N, int64_t V, Rng& r, double p_ignore) {
  std::vector<int32_t> y(N);
  for (auto& v : y) v = r.uniform() < p_ignore ? -100 : static_cast<int32_t>(r.next_u64() % V);
  return y;
}

struct CeInputs {
  std::vector<float> h, W, dW0;  // [N, d], [V, d], the dW start [V, d] (f32; bf16-exact for BF16)
  std::vector<bf16> hb, Wb;      // their bf16 copies (BF16 only)
  std::vector<int32_t> y;        // [N], 20% ignored
};

// nan_row >= 0: that row gets label 0 and a NaN input.
inline CeInputs ce_inputs(kern::Prec prec, int64_t N, int64_t d, int64_t V, int nan_row) {
  Rng r(3 + N * 5 + d * 7 + V);
  CeInputs in{std::vector<float>(N * d), std::vector<float>(V * d), std::vector<float>(V * d), {}, {}, {}};
  fill_normal(in.h.data(), in.h.size(), r, 1.0);
  fill_normal(in.W.data(), in.W.size(), r, 2.0 / std::sqrt(static_cast<double>(d)));
  fill_normal(in.dW0.data(), in.dW0.size(), r);
  in.y = ce_labels(N, V, r, 0.2);
  if (nan_row >= 0) {
    in.y[nan_row] = 0;
    in.h[nan_row * d] = std::numeric_limits<float>::quiet_NaN();
  }
  in.hb.resize(in.h.size()), in.Wb.resize(in.W.size());
  if (prec == kern::Prec::BF16) {
    for (size_t i = 0; i < in.h.size(); ++i) in.hb[i] = f32_to_bf16(in.h[i]), in.h[i] = bf16_to_f32(in.hb[i]);
    for (size_t i = 0; i < in.W.size(); ++i) in.Wb[i] = f32_to_bf16(in.W[i]), in.W[i] = bf16_to_f32(in.Wb[i]);
  }
  return in;
}

}  // namespace trex::ops
