// The MoE combine's adjoint (kernels/rows.h) as model/moe.cpp runs it: dy = p dout per row, then
// q = dy . y where the rows are computed (row_dot), then the probabilities' gradient q / p, which
// must equal dout[n] . y[row]; a zero probability gets a zero gradient. Odd sizes, a permuted slot
// order.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/rows.h"

using namespace trex;

namespace {

std::vector<float> randv(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (float& x : v) x = (float)(r.uniform() * 2 - 1);
  return v;
}

}  // namespace

TEST(MoeRows, ProbsGradientFromTheScaledRowsIsTheDotWithTheOutput) {
  const int64_t N = 7, K = 3, d = 13, F = 11, R = N * K;
  const std::vector<float> h = randv(R * F, 1), W = randv(d * F, 2), dout = randv(N * d, 3);
  std::vector<float> probs = randv(R, 4);
  for (float& p : probs) p = std::fabs(p) + 0.01f;
  probs[5] = 0.f;  // a probability that underflowed
  std::vector<int32_t> slot_row(R);
  for (int64_t s = 0; s < R; ++s) slot_row[s] = (int32_t)((s * 8 + 3) % R);  // a permutation (gcd(8, 21) = 1)

  // y = W h per row (a routed expert's down projection); the reference gradient dout[n] . y[row].
  std::vector<double> y(R * d), ref(R);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < d; ++i) {
      double a = 0;
      for (int64_t f = 0; f < F; ++f) a += (double)W[i * F + f] * h[r * F + f];
      y[r * d + i] = a;
    }
  for (int64_t s = 0; s < R; ++s) {
    double a = 0;
    for (int64_t i = 0; i < d; ++i) a += (double)dout[(s / K) * d + i] * y[slot_row[s] * d + i];
    ref[s] = a;
  }

  std::vector<float> dy(R * d, -1.f), yf(y.begin(), y.end()), dprobs(R, -1.f);
  std::vector<double> q(R);
  kern::moe_combine_bwd(dout.data(), probs.data(), slot_row.data(), N, K, d, dy.data());
  for (int64_t s = 0; s < R; ++s)
    for (int64_t i = 0; i < d; ++i) EXPECT_EQ(dy[slot_row[s] * d + i], probs[s] * dout[(s / K) * d + i]);
  kern::row_dot(dy.data(), yf.data(), R, d, q.data());
  for (int64_t r = 0; r < R; ++r) {
    double a = 0;
    for (int64_t i = 0; i < d; ++i) a += (double)dy[r * d + i] * yf[r * d + i];
    EXPECT_EQ(q[r], a) << "row " << r;
  }
  kern::moe_probs_bwd(q.data(), probs.data(), slot_row.data(), N, K, dprobs.data());
  for (int64_t s = 0; s < R; ++s) {
    if (probs[s] == 0.f) {
      EXPECT_EQ(dprobs[s], 0.f) << "slot " << s;
      continue;
    }
    EXPECT_NEAR(dprobs[s], ref[s], 1e-6 * (1 + std::fabs(ref[s]))) << "slot " << s;
  }
}
