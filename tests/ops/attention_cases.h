// Attention op cases shared by trex_ops (tests/ops/attention_ops.cpp) and trex_cuda_ops
// (tests/ops_cuda/attention_ops.cpp): the case shape, its name, the AttnShape it tests and the
// document ids of packed rows, and the shapes both harnesses test (odd and round, Dqk != Dv,
// documents, sliding windows).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>
#include "core/rng.h"
#include "kernels/attention.h"

namespace trex::ops {

struct AttnCfg {
  int B, T, H, Dqk, Dv, window;
  bool seg;
  int threads = 0;  // > 0: run the kernel under test with this many threads (CPU kernels)
  int Tq = 0;       // > 0: query rows, the last Tq of the T positions (AttnShape::Tq; CPU flash kernels)
  bool acc = false;  // backward adds dk, dv to what they hold (AttnShape::acc_dkv)
};

inline constexpr AttnCfg kAttnTests[] = {
    {1, 1, 1, 16, 16, 0, false},      {2, 7, 3, 40, 24, 0, false},   {1, 130, 1, 72, 56, 0, false},
    {2, 129, 3, 64, 64, 0, true},     {1, 200, 2, 192, 128, 50, false}, {3, 65, 5, 17, 33, 0, true},
    {2, 300, 1, 40, 24, 70, true},    {1, 1000, 2, 48, 32, 0, true}, {1, 257, 3, 192, 128, 0, false},
    {2, 64, 2, 16, 16, 3, false},
};

inline std::string attn_cfg_name(const char* op, const AttnCfg& c) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s B=%d T=%d H=%d Dqk=%d Dv=%d%s%s%s%s%s", op, c.B, c.T, c.H, c.Dqk, c.Dv,
                c.window > 0 ? (" win=" + std::to_string(c.window)).c_str() : "", c.seg ? " seg" : "",
                c.threads > 0 ? (" threads=" + std::to_string(c.threads)).c_str() : "",
                c.Tq > 0 ? (" Tq=" + std::to_string(c.Tq)).c_str() : "", c.acc ? " acc" : "");
  return buf;
}

// 1/sqrt(Dqk) times a YaRN-like factor.
inline kern::AttnShape attn_shape_of(const AttnCfg& c) {
  kern::AttnShape sh{c.B, c.T, c.H, c.Dqk, c.Dv, 1.1f / std::sqrt(static_cast<float>(c.Dqk)), c.window};
  sh.Tq = c.Tq;
  sh.acc_dkv = c.acc;
  return sh;
}

// 2-3 documents per batch row at random boundaries (ids increase along the row).
inline std::vector<int32_t> attn_make_seg(const AttnCfg& c, Rng& r) {
  std::vector<int32_t> s(static_cast<size_t>(c.B) * c.T);
  for (int b = 0; b < c.B; ++b) {
    const int ndoc = 2 + static_cast<int>(r.next_u64() % 2);
    std::vector<int> cut;
    for (int i = 1; i < ndoc; ++i) cut.push_back(1 + static_cast<int>(r.next_u64() % std::max(c.T - 1, 1)));
    for (int t = 0; t < c.T; ++t) {
      int id = 0;
      for (int x : cut) id += t >= x;
      s[static_cast<size_t>(b) * c.T + t] = 10 * b + id;
    }
  }
  return s;
}

}  // namespace trex::ops
