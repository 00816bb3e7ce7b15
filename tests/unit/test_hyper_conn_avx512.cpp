// The AVX-512 mHC loops (kernels/cpu/hyper_conn_avx512.h) against the baseline loops that
// kernels/hyper_conn.cpp runs without AVX-512 (kernels/hyper_conn_baseline.h, built here with the
// same baseline flags: products and sums rounded one at a time): equal bit for bit, for 1 to 13
// streams and widths on and off the 16-lane vectors. Skipped on CPUs without AVX-512.
#include <gtest/gtest.h>

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

}  // namespace
