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
#include "kernels/hd/hyper_conn.h"
#include "kernels/hyper_conn_baseline.h"

namespace {

using namespace trex::kern::cpu;
namespace base = trex::kern::hc_baseline;

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A sum formed in double with the sum of its terms' magnitudes: a float result is near it when
// within 1e-5 of that magnitude (the bound of the FMA kernels' checks below).
struct DoubleSum {
  double sum = 0, mag = 0;
  void add(double p) {
    sum += p;
    mag += std::fabs(p);
  }
  bool near(float v) const { return std::fabs(v - sum) <= 1e-5 * mag; }
};

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
      const float s = hc_dot_avx512(x.data(), x.data(), K), s_ref = base::dot(x.data(), x.data(), K);
      EXPECT_EQ(0, std::memcmp(&s, &s_ref, sizeof s)) << "hc_dot";
    }
}

// mix [tc, R] = x [tc, K] @ fn^T against double sums: every token tail of the 4-token tiles, output
// counts past one 6-output tile and one 48-output block (R = 97, 4224 = the largest at 64 streams),
// K off the 16 lanes; each output within 1e-5 of its sum of |products|; a token's outputs do not
// depend on the tokens beside it (the same bits alone and in a chunk), nor on fn being packed.
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
        DoubleSum e;
        for (int64_t k = 0; k < c.K; ++k) e.add((double)x[t * c.K + k] * fn[q * c.K + k]);
        bad += !e.near(mix[t * c.R + q]);
      }
    EXPECT_EQ(bad, 0);
    const int64_t t = std::min<int64_t>(1, c.tc - 1);  // a token of the first tile, alone
    std::vector<float> one(c.R);
    hc_project_avx512(c.R, c.K, 1, x.data() + t * c.K, fn.data(), one.data());
    EXPECT_EQ(0, std::memcmp(one.data(), mix.data() + t * c.R, c.R * sizeof(float)));
    // fn packed: the same bits (the packing's zeros past K add nothing), alone and in the chunk
    std::vector<float> packed(hc_pack_proj_floats(c.R, c.K), NAN), pmix(c.tc * c.R, NAN);
    hc_pack_proj_avx512(c.R, c.K, fn.data(), packed.data());
    hc_project_avx512(c.R, c.K, c.tc, x.data(), packed.data(), pmix.data(), true);
    EXPECT_EQ(0, std::memcmp(pmix.data(), mix.data(), mix.size() * sizeof(float)));
    hc_project_avx512(c.R, c.K, 1, x.data() + t * c.K, packed.data(), one.data(), true);
    EXPECT_EQ(0, std::memcmp(one.data(), mix.data() + t * c.R, c.R * sizeof(float)));
  }
}

// dx (+)= dmixs @ fn + pre (x) dy - c x against double sums: token tails of the 8-token tiles,
// widths off the 32-column tiles (d = 7, 37, 100), R from 1 to 24, with and without dy and the old
// dx; each element within 1e-5 of its sum of |terms|; a token alone gives the bits it gets in a chunk.
TEST(HyperConnAvx512, InputGradientMatchesDoubleSums) {
  if (trex::cpu_isa() < trex::Isa::Avx512) GTEST_SKIP() << "the CPU has no AVX-512 (or TREX_ISA caps it)";
  std::mt19937 g(13);
  std::normal_distribution<float> nd;
  struct Case {
    int n, R;
    int64_t d, tc;
  };
  for (const Case c : {Case{4, 24, 1024, 32}, Case{4, 4, 100, 11}, Case{3, 15, 37, 9}, Case{1, 1, 7, 3},
                       Case{5, 35, 48, 17}, Case{2, 8, 16, 1}})
    for (bool acc : {true, false})
      for (bool with_dy : {true, false}) {
        SCOPED_TRACE("n=" + std::to_string(c.n) + " R=" + std::to_string(c.R) + " d=" + std::to_string(c.d) +
                     " tc=" + std::to_string(c.tc) + " acc=" + std::to_string(acc) + " dy=" + std::to_string(with_dy));
        const int64_t K = c.n * c.d;
        std::vector<float> dm(c.tc * c.R), fn(c.R * K), pre(c.tc * c.n), cx(c.tc), dy(c.tc * c.d), x(c.tc * K),
            dx0(c.tc * K);
        for (auto* v : {&dm, &fn, &pre, &cx, &dy, &x, &dx0})
          for (float& e : *v) e = nd(g);
        std::vector<float> dx(dx0);
        const float* dyp = with_dy ? dy.data() : nullptr;
        std::vector<float> fp(hc_pack_fn_floats(c.n, c.R, c.d));
        hc_pack_fn_avx512(c.n, c.R, c.d, fn.data(), fp.data());
        hc_pre_dx_avx512(c.n, c.R, c.d, c.tc, dm.data(), fp.data(), pre.data(), cx.data(), dyp, x.data(), dx.data(),
                         acc);
        int bad = 0;
        for (int64_t t = 0; t < c.tc; ++t)
          for (int j = 0; j < c.n; ++j)
            for (int64_t i = 0; i < c.d; ++i) {
              const int64_t k = j * c.d + i;
              DoubleSum e;
              e.add(acc ? dx0[t * K + k] : 0.0);
              for (int q = 0; q < c.R; ++q) e.add((double)dm[t * c.R + q] * fn[q * K + k]);
              e.add(with_dy ? (double)pre[t * c.n + j] * dy[t * c.d + i] : 0.0);
              e.add(-(double)cx[t] * x[t * K + k]);
              bad += !e.near(dx[t * K + k]);
            }
        EXPECT_EQ(bad, 0);
        const int64_t t = c.tc - 1;  // the last token, alone
        std::vector<float> one(dx0.begin() + t * K, dx0.begin() + (t + 1) * K);
        hc_pre_dx_avx512(c.n, c.R, c.d, 1, dm.data() + t * c.R, fp.data(), pre.data() + t * c.n, cx.data() + t,
                         with_dy ? dy.data() + t * c.d : nullptr, x.data() + t * K, one.data(), acc);
        EXPECT_EQ(0, std::memcmp(one.data(), dx.data() + t * K, K * sizeof(float)));
      }
}

// The coefficients of 4 streams, 16 tokens to a vector, equal the per-token code bit for bit: every
// group size 1..16, 1 and 20 Sinkhorn iterations, with and without each input gradient, and
// inputs spread wide (softmax logits up to +-30, where exp rounds hard).
TEST(HyperConnAvx512, FourStreamCoefficientsEqualThePerTokenCode) {
  if (trex::cpu_isa() < trex::Isa::Avx512) GTEST_SKIP() << "the CPU has no AVX-512 (or TREX_ISA caps it)";
  namespace hd = trex::kern::hd;
  constexpr int n = 4, R = 24;
  std::mt19937 g(17);
  std::normal_distribution<float> nd;
  for (int iters : {1, 20})
    for (int64_t tc : {1, 5, 15, 16})
      for (float spread : {1.f, 30.f})
        for (int grads = 0; grads < 4; ++grads) {
          SCOPED_TRACE("iters=" + std::to_string(iters) + " tc=" + std::to_string(tc) + " spread=" +
                       std::to_string(spread) + " grads=" + std::to_string(grads));
          std::vector<float> mix(tc * R), base(R), dpre(tc * n), dpost(tc * n), dcomb(tc * n * n);
          for (float& e : mix) e = nd(g) * spread;
          for (float& e : base) e = nd(g);
          for (auto* v : {&dpre, &dpost, &dcomb})
            for (float& e : *v) e = nd(g);
          const float scale[3] = {0.7f, 1.3f, 0.9f}, eps = 1e-6f;
          const float* dp = grads & 1 ? dpre.data() : nullptr;
          const float* dq = grads & 2 ? dpost.data() : nullptr;
          const float* dc = grads == 3 ? nullptr : dcomb.data();
          std::vector<float> pre(tc * n), post(tc * n), comb(tc * n * n), pre_r(tc * n), post_r(tc * n),
              comb_r(tc * n * n);
          hc_coeffs4_fwd_avx512(iters, eps, tc, mix.data(), base.data(), scale, pre.data(), post.data(), comb.data());
          std::vector<float> dz(tc * R), dz_r(tc * R), pb(tc * n), pb_r(tc * n);
          std::vector<float> scr(hc_coeffs4_scratch_floats(iters) + 16);
          float* s16 = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scr.data()) + 63) & ~uintptr_t{63});
          hc_coeffs4_bwd_avx512(iters, eps, tc, mix.data(), base.data(), scale, dp, dq, dc, dz.data(), pb.data(), s16);
          std::vector<float> sc(hd::hc_coeffs_scratch(n, iters));
          for (int64_t t = 0; t < tc; ++t) {
            hd::hc_coeffs_fwd<float>(n, iters, eps, mix.data() + t * R, base.data(), scale, pre_r.data() + t * n,
                                     post_r.data() + t * n, comb_r.data() + t * n * n, nullptr);
            hd::hc_coeffs_bwd<float>(n, iters, eps, mix.data() + t * R, base.data(), scale, dp ? dp + t * n : nullptr,
                                     dq ? dq + t * n : nullptr, dc ? dc + t * n * n : nullptr, dz_r.data() + t * R,
                                     pb_r.data() + t * n, sc.data());
          }
          EXPECT_TRUE(same(pre, pre_r)) << "pre";
          EXPECT_TRUE(same(post, post_r)) << "post";
          EXPECT_TRUE(same(comb, comb_r)) << "comb";
          EXPECT_TRUE(same(dz, dz_r)) << "dz";
          EXPECT_TRUE(same(pb, pb_r)) << "pre (backward)";
        }
}

// The input gradient's pass also adds dmixs [tc, R]^T @ x [tc, K] to the weight gradient's partial
// (laid out as the packed fn) against double sums: output counts 1 to 35, widths off the
// 32-column blocks, token tails of the 8-token tiles, a nonzero partial to add to.
TEST(HyperConnAvx512, WeightGradientMatchesDoubleSums) {
  if (trex::cpu_isa() < trex::Isa::Avx512) GTEST_SKIP() << "the CPU has no AVX-512 (or TREX_ISA caps it)";
  std::mt19937 g(19);
  std::normal_distribution<float> nd;
  struct Case {
    int n, R;
    int64_t d, tc;
  };
  for (const Case c : {Case{4, 24, 1024, 16}, Case{1, 1, 7, 1}, Case{1, 13, 100, 5}, Case{5, 35, 48, 17},
                       Case{4, 4, 1000, 3}, Case{3, 15, 37, 9}}) {
    SCOPED_TRACE("n=" + std::to_string(c.n) + " R=" + std::to_string(c.R) + " d=" + std::to_string(c.d) +
                 " tc=" + std::to_string(c.tc));
    const int64_t K = c.n * c.d, nb = (c.d + 31) / 32, P = hc_pack_fn_floats(c.n, c.R, c.d);
    std::vector<float> dm(c.tc * c.R), fn(c.R * K), pre(c.tc * c.n), cx(c.tc), x(c.tc * K), dx(c.tc * K), part0(P);
    for (auto* v : {&dm, &fn, &pre, &cx, &x, &dx, &part0})
      for (float& e : *v) e = nd(g);
    std::vector<float> fp(P), part(part0);
    hc_pack_fn_avx512(c.n, c.R, c.d, fn.data(), fp.data());
    hc_pre_dx_avx512(c.n, c.R, c.d, c.tc, dm.data(), fp.data(), pre.data(), cx.data(), nullptr, x.data(), dx.data(),
                     true, part.data());
    int bad = 0;
    for (int q = 0; q < c.R; ++q)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t j = k / c.d, i = k % c.d, o = ((j * nb + i / 32) * c.R + q) * 32 + i % 32;
        DoubleSum e;
        e.add(part0[o]);
        for (int64_t t = 0; t < c.tc; ++t) e.add((double)dm[t * c.R + q] * x[t * K + k]);
        bad += !e.near(part[o]);
      }
    EXPECT_EQ(bad, 0);
  }
}

}  // namespace
