// The host-and-device math of kernels/hd/ on the CPU. The element formulas (SwiGLU, RoPE, RMSNorm,
// AdamW) are what kernels/ref calls, so trex_ops covers them; the online log-sum-exp is used only
// by the CUDA kernels, so it is checked here: any grouping of pushes and merges gives the
// log-sum-exp of the whole stream, -inf values add nothing, NaN propagates.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>
#include "core/rng.h"
#include "kernels/hd/softmax.h"

namespace {
using namespace trex;
using kern::hd::Lse;

double direct(const std::vector<double>& x) {
  double m = -INFINITY;
  for (double v : x) m = std::max(m, v);
  if (m == -INFINITY) return m;
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  return m + std::log(s);
}

TEST(HdMath, OnlineLogSumExpAnyGrouping) {
  Rng r(7);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(r.next_u64() % 300);
    std::vector<double> x(n);
    for (auto& v : x) v = (r.uniform() < 0.1) ? -INFINITY : 30.0 * r.normal();
    // One stream, and the same cut into k parts merged in order and in reverse.
    Lse<double> one = kern::hd::lse_empty<double>();
    for (double v : x) one = kern::hd::lse_push(one, v);
    const int k = 1 + trial % 7;
    std::vector<Lse<double>> parts(k, kern::hd::lse_empty<double>());
    for (int i = 0; i < n; ++i) parts[i % k] = kern::hd::lse_push(parts[i % k], x[i]);
    Lse<double> fwd = kern::hd::lse_empty<double>(), rev = kern::hd::lse_empty<double>();
    for (int j = 0; j < k; ++j) fwd = kern::hd::lse_merge(fwd, parts[j]), rev = kern::hd::lse_merge(rev, parts[k - 1 - j]);
    const double want = direct(x);
    for (const Lse<double>& s : {one, fwd, rev}) {
      const double got = kern::hd::lse_value(s);
      if (want == -INFINITY)
        EXPECT_EQ(got, -INFINITY);
      else
        EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, std::fabs(want))) << "trial " << trial;
    }
  }
}

TEST(HdMath, LogSumExpEdgeCases) {
  using L = Lse<float>;
  L e = kern::hd::lse_empty<float>();
  EXPECT_EQ(kern::hd::lse_value(e), -INFINITY);
  e = kern::hd::lse_push(e, -INFINITY);
  EXPECT_EQ(kern::hd::lse_value(e), -INFINITY);
  EXPECT_EQ(kern::hd::lse_value(kern::hd::lse_merge(e, kern::hd::lse_empty<float>())), -INFINITY);
  L a = kern::hd::lse_push(kern::hd::lse_empty<float>(), 2.f);
  EXPECT_FLOAT_EQ(kern::hd::lse_value(kern::hd::lse_push(a, 2.f)), 2.f + std::log(2.f));
  L n = kern::hd::lse_push(a, std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(kern::hd::lse_value(n)));
  EXPECT_TRUE(std::isnan(kern::hd::lse_value(kern::hd::lse_merge(a, n))));
  EXPECT_TRUE(std::isnan(kern::hd::lse_value(kern::hd::lse_merge(n, a))));
  const L first = kern::hd::lse_push(kern::hd::lse_empty<float>(), std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(kern::hd::lse_value(first)));
  EXPECT_TRUE(std::isnan(kern::hd::lse_value(kern::hd::lse_merge(kern::hd::lse_empty<float>(), first))));
}

}  // namespace
