// The AVX-512 mHC loops (kernels/cpu/hyper_conn_avx512.h) against the baseline loops that
// kernels/hyper_conn.cpp runs without AVX-512 (kernels/hyper_conn_baseline.h, built here with the
// same baseline flags: products and sums rounded one at a time): equal bit for bit, for 1 to 13
// streams and widths on and off the 16-lane vectors. The pre step's projection (fused
// multiply-adds, where the baseline runs sgemm) against sums in double instead. Skipped on CPUs
// without AVX-512.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "kernels/cpu/hyper_conn_avx512.h"
#include "kernels/hyper_conn_baseline.h"

namespace {

using namespace trex::kern::cpu;
namespace base = trex::kern::hc_baseline;

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(HyperConnAvx512, EqualsTheBaselineLoopsBitForBit) {
  if (trex::cpu_isa() < trex::Isa::Avx512) GTEST_SKIP() << "the CPU has no AVX-512 (or TREX_ISA caps it)";
  std::mt19937 g(7);
  std::normal_distribution<float> nd;
  for (int n : {1, 2, 4, 5, 13})
    for (int64_t d : {7, 16, 37, 100}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " d=" + std::to_string(d));
      const int64_t K = n * d, T = 3;
      std::vector<float> x(T * K), f(T * d), post(T * n), comb(T * n * n), dout(T * K);
      for (auto* v : {&x, &f, &post, &comb, &dout})
        for (float& e : *v) e = nd(g);
      // post step forward
      std::vector<float> o(T * K), o_ref(T * K);
      hc_post_fwd_avx512(n, d, 0, T, x.data(), f.data(), post.data(), comb.data(), o.data());
      base::post_fwd(n, d, 0, T, x.data(), f.data(), post.data(), comb.data(), o_ref.data());
      EXPECT_TRUE(same(o, o_ref)) << "hc_post_fwd";
      // post step backward
      std::vector<float> dx(T * K), df(T * d), dp(T * n), dc(T * n * n);
      std::vector<float> dx_ref(T * K), df_ref(T * d), dp_ref(T * n), dc_ref(T * n * n);
      hc_post_bwd_avx512(n, d, 0, T, x.data(), f.data(), post.data(), comb.data(), dout.data(), dx.data(), df.data(),
                         dp.data(), dc.data());
      base::post_bwd(n, d, 0, T, x.data(), f.data(), post.data(), comb.data(), dout.data(), dx_ref.data(),
                     df_ref.data(), dp_ref.data(), dc_ref.data());
      EXPECT_TRUE(same(dx, dx_ref)) << "hc_post_bwd dx";
      EXPECT_TRUE(same(df, df_ref)) << "hc_post_bwd df";
      EXPECT_TRUE(same(dp, dp_ref)) << "hc_post_bwd dpost";
      EXPECT_TRUE(same(dc, dc_ref)) << "hc_post_bwd dcomb";
      // the pre and head steps' dots, collapse and dx update (with and without dy)
      std::vector<float> dots(n), dots_ref(n), y(d), y_ref(d);
      hc_dots_avx512(n, d, f.data(), x.data(), dots.data());
      base::dots(n, d, f.data(), x.data(), dots_ref.data());
      EXPECT_TRUE(same(dots, dots_ref)) << "hc_dots";
      hc_collapse_avx512(n, d, post.data(), x.data(), y.data());
      base::collapse(n, d, post.data(), x.data(), y_ref.data());
      EXPECT_TRUE(same(y, y_ref)) << "hc_collapse";
      for (const float* dy : {(const float*)f.data(), (const float*)nullptr}) {
        std::vector<float> u(dout.begin(), dout.begin() + K), u_ref(u);
        hc_dx_update_avx512(n, d, post.data(), 0.37f, dy, x.data(), u.data());
        base::dx_update(n, d, post.data(), 0.37f, dy, x.data(), u_ref.data());
        EXPECT_TRUE(same(u, u_ref)) << "hc_dx_update" << (dy ? "" : " (no dy)");
      }
      const float s = hc_dot_avx512(x.data(), x.data(), K), s_ref = base::dot(x.data(), x.data(), K);
      EXPECT_EQ(0, std::memcmp(&s, &s_ref, sizeof s)) << "hc_dot";
    }
}

// mix [tc, R] = x [tc, K] @ fn^T against double sums: every token tail of the 4-token tiles, output
// counts past one 6-output tile and one 48-output block (R = 97, 4224 = the largest at 64 streams),
// K past one 512 block and off the 16 lanes; each output within 1e-5 of its sum of |products|; a
// token's outputs do not depend on the tokens beside it (the same bits alone and in a chunk).
TEST(HyperConnAvx512, ProjectionMatchesDoubleSums) {
  if (trex::cpu_isa() < trex::Isa::Avx512) GTEST_SKIP() << "the CPU has no AVX-512 (or TREX_ISA caps it)";
  std::mt19937 g(11);
  std::normal_distribution<float> nd;
  struct Case {
    int R;
    int64_t K, tc;
  };
  for (const Case c : {Case{1, 7, 1}, Case{5, 16, 2}, Case{15, 100, 3}, Case{24, 4096, 32}, Case{24, 1031, 9},
                       Case{97, 529, 6}, Case{6, 1536, 5}, Case{4224, 33, 2}}) {
    SCOPED_TRACE("R=" + std::to_string(c.R) + " K=" + std::to_string(c.K) + " tc=" + std::to_string(c.tc));
    std::vector<float> x(c.tc * c.K), fn(c.R * c.K), mix(c.tc * c.R, NAN);
    for (float& e : x) e = nd(g);
    for (float& e : fn) e = nd(g);
    hc_project_avx512(c.R, c.K, c.tc, x.data(), fn.data(), mix.data());
    int bad = 0;
    for (int64_t t = 0; t < c.tc; ++t)
      for (int q = 0; q < c.R; ++q) {
        double sum = 0, mag = 0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double p = (double)x[t * c.K + k] * fn[q * c.K + k];
          sum += p;
          mag += std::fabs(p);
        }
        bad += !(std::fabs(mix[t * c.R + q] - sum) <= 1e-5 * mag);
      }
    EXPECT_EQ(bad, 0);
    const int64_t t = std::min<int64_t>(1, c.tc - 1);  // a token of the first tile, alone
    std::vector<float> one(c.R);
    hc_project_avx512(c.R, c.K, 1, x.data() + t * c.K, fn.data(), one.data());
    EXPECT_EQ(0, std::memcmp(one.data(), mix.data() + t * c.R, c.R * sizeof(float)));
  }
}

}  // namespace
