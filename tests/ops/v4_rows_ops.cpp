// Op cases for DeepSeek-V4's row operations (kernels/v4_rows.h): the key lists of every attention
// kind (sliding window, HCA, CSA with the indexer's selection, CSA's dense warm-up), with and
// without packed documents (one-token documents included), against loops written from the layer's
// definition (model/v4_attn.h); and the scale. Both must match bit for bit.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>
#include "kernels/v4_rows.h"
#include "tests/ops/harness.h"

namespace {
using namespace trex;
using namespace trex::ops;
using K = kern::V4Keys;

bool keys_test(int64_t B, int64_t T, int64_t W, int64_t m, K kind, int topk, bool packed) {
  const std::string name = "v4 keys B=" + std::to_string(B) + " T=" + std::to_string(T) + " W=" + std::to_string(W) +
                           " m=" + std::to_string(m) + " kind=" + std::to_string((int)kind) + (packed ? " packed" : "");
  const int64_t N = B * T, nw = kind == K::Sliding ? 0 : T / m;
  std::vector<int32_t> seg(N), cnt(N), sel(N * std::max(topk, 1), -1);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = i % T;
    seg[i] = (int32_t)(t / 7 + (t % 11 == 3));
    const int64_t valid = std::min<int64_t>((t + 1) / m, nw);
    cnt[i] = (int32_t)std::min<int64_t>(topk, valid);
    for (int k = 0; k < cnt[i]; ++k) sel[i * topk + k] = (int32_t)((valid - cnt[i]) * (i % 2) + k);
  }
  const int32_t* sg = packed ? seg.data() : nullptr;
  // The definition: sliding rows t-W+1..t of t's document, then the compressed entries whose
  // window starts in it (HCA: w m; CSA: max(0, (w-1) m)).
  auto doc = [&](int64_t b, int64_t t, int64_t u) { return !sg || sg[b * T + u] == sg[b * T + t]; };
  std::vector<int64_t> off_r{0};
  std::vector<int32_t> idx_r;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t b = i / T, t = i % T;
    for (int64_t u = std::max<int64_t>(0, t - W + 1); u <= t; ++u)
      if (doc(b, t, u)) idx_r.push_back((int32_t)(b * T + u));
    auto entry = [&](int64_t w, int64_t start) {
      if (doc(b, t, start)) idx_r.push_back((int32_t)(N + b * nw + w));
    };
    if (kind == K::Hca)
      for (int64_t w = 0; w < std::min<int64_t>((t + 1) / m, nw); ++w) entry(w, w * m);
    if (kind == K::CsaDense)
      for (int64_t w = 0; w < nw; ++w)
        if ((w + 1) * m <= t + 1) entry(w, std::max<int64_t>(0, (w - 1) * m));
    if (kind == K::Csa)
      for (int64_t k = 0; k < cnt[i]; ++k) entry(sel[i * topk + k], std::max<int64_t>(0, (sel[i * topk + k] - 1) * m));
    off_r.push_back((int64_t)idx_r.size());
  }
  const kern::V4KeyShape s{B, T, W, m, nw, kind, topk};
  Guarded<int64_t> off(N + 1);
  kern::v4_key_offsets(s, sg, cnt.data(), sel.data(), off.data());
  Guarded<int32_t> idx(off_r[N]);
  kern::v4_key_fill(s, sg, cnt.data(), sel.data(), off.data(), idx.data());
  bool ok = report(name, "off", std::memcmp(off.data(), off_r.data(), (N + 1) * 8) ? 1 : 0, 0, off.guard_ok(), "guard");
  ok &= report(name, "idx", idx_r.empty() || !std::memcmp(idx.data(), idx_r.data(), idx_r.size() * 4) ? 0 : 1, 0,
               idx.guard_ok(), "guard");
  return ok;
}

bool scale_test(int64_t n) {
  Rng r(5 + n);
  std::vector<float> x0(n);
  fill_normal(x0.data(), n, r);
  Guarded<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = x0[i];
  kern::scale(x.data(), n, -1.7f);
  size_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += x[i] != x0[i] * -1.7f;
  return report("v4 scale n=" + std::to_string(n), "x", (double)bad, 0, x.guard_ok(), "guard");
}

}  // namespace

TREX_OP_CASES(v4_rows_cases) {
  for (bool packed : {false, true}) {
    cases.push_back({"v4 keys", [=] { return keys_test(2, 37, 5, 1, K::Sliding, 0, packed); }, nullptr, nullptr});
    cases.push_back({"v4 keys", [=] { return keys_test(3, 41, 7, 5, K::Hca, 0, packed); }, nullptr, nullptr});
    cases.push_back({"v4 keys", [=] { return keys_test(2, 45, 4, 3, K::Csa, 4, packed); }, nullptr, nullptr});
    cases.push_back({"v4 keys", [=] { return keys_test(1, 2049, 128, 4, K::Csa, 128, packed); }, nullptr, nullptr});
    cases.push_back({"v4 keys", [=] { return keys_test(2, 29, 6, 3, K::CsaDense, 2, packed); }, nullptr, nullptr});
    cases.push_back({"v4 keys", [=] { return keys_test(1, 3, 9, 4, K::Hca, 0, packed); }, nullptr, nullptr});
  }
  for (int64_t n : {1, 37, 100003}) cases.push_back({"v4 scale", [=] { return scale_test(n); }, nullptr, nullptr});
}
