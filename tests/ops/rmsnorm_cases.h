// RMSNorm op cases shared by trex_ops (tests/ops/rmsnorm_ops.cpp) and trex_cuda_ops
// (tests/ops_cuda/elementwise_ops.cpp): the shapes and the inputs of one case, so both harnesses
// check their kernels on the same data.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>
#include "tests/ops/harness.h"

namespace trex::ops {

// [N, d] shapes of the forward / backward test cases.
inline constexpr int64_t kRmsShapes[][2] = {{1, 37}, {5, 16},    {3, 129}, {37, 1000},
                                            {200, 64}, {129, 7168}, {70, 7},  {65, 8}};

struct RmsInputs {
  std::vector<float> x, w, dy, dw0;  // x, dy: [N, d]  w, dw0 (the dw start): [d]
};

// x at `scale` (small: mean(x^2) ~ eps, so eps matters), w near 1; nan_row >= 0 puts a NaN into
// that row of x.
inline RmsInputs rms_inputs(int64_t N, int64_t d, int64_t nan_row, double scale) {
  Rng r(1000 + N * 7 + d);
  const size_t nd = static_cast<size_t>(N * d);
  RmsInputs in{std::vector<float>(nd), std::vector<float>(d), std::vector<float>(nd), std::vector<float>(d)};
  fill_normal(in.x.data(), nd, r, scale);
  for (auto& v : in.w) v = static_cast<float>(1.0 + 0.3 * r.normal());
  fill_normal(in.dy.data(), nd, r);
  fill_normal(in.dw0.data(), d, r);
  if (nan_row >= 0) in.x[nan_row * d + d / 2] = std::numeric_limits<float>::quiet_NaN();
  return in;
}

inline std::string rms_case_name(const std::string& tag, int64_t N, int64_t d, int64_t nan_row, double scale) {
  return tag + " N=" + std::to_string(N) + " d=" + std::to_string(d) + (nan_row >= 0 ? " nan" : "") +
         (scale < 0.1 ? " small x" : "");
}

}  // namespace trex::ops
