// The AVX-512 mHC loops (kernels/cpu/hyper_conn_avx512.h) against plain C++ loops of the same
// arithmetic, written here as kernels/hyper_conn.cpp's baseline build runs them (16-lane dots
// summed in a fixed order; products and sums rounded one at a time): equal bit for bit, for 1 to
// 13 streams and widths on and off the 16-lane vectors. Skipped on CPUs without AVX-512.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "kernels/cpu/hyper_conn_avx512.h"

namespace {

using namespace trex::kern::cpu;

float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void collapse(int n, int64_t d, const float* w, const float* x, float* y) {
  for (int64_t i = 0; i < d; ++i) y[i] = w[0] * x[i];
  for (int j = 1; j < n; ++j) axpy(w[j], x + j * d, y, d);
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(HyperConnAvx512, EqualsThePlainLoopsBitForBit) {
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
      for (int64_t t = 0; t < T; ++t)
        for (int k = 0; k < n; ++k) {
          float* ok = o_ref.data() + t * K + k * d;
          for (int64_t i = 0; i < d; ++i) ok[i] = post[t * n + k] * f[t * d + i];
          for (int j = 0; j < n; ++j) axpy(comb[t * n * n + j * n + k], x.data() + t * K + j * d, ok, d);
        }
      EXPECT_TRUE(same(o, o_ref)) << "hc_post_fwd";
      // post step backward
      std::vector<float> dx(T * K), df(T * d), dp(T * n), dc(T * n * n);
      std::vector<float> dx_ref(T * K), df_ref(T * d), dp_ref(T * n), dc_ref(T * n * n);
      hc_post_bwd_avx512(n, d, 0, T, x.data(), f.data(), post.data(), comb.data(), dout.data(), dx.data(), df.data(),
                         dp.data(), dc.data());
      for (int64_t t = 0; t < T; ++t) {
        const float *go = dout.data() + t * K, *cm = comb.data() + t * n * n, *xt = x.data() + t * K;
        collapse(n, d, post.data() + t * n, go, df_ref.data() + t * d);
        for (int j = 0; j < n; ++j) {
          float* dxj = dx_ref.data() + t * K + j * d;
          for (int64_t i = 0; i < d; ++i) dxj[i] = cm[j * n] * go[i];
          for (int k = 1; k < n; ++k) axpy(cm[j * n + k], go + k * d, dxj, d);
        }
        for (int k = 0; k < n; ++k) {
          dp_ref[t * n + k] = dot(go + k * d, f.data() + t * d, d);
          for (int j = 0; j < n; ++j) dc_ref[(t * n + j) * n + k] = dot(go + k * d, xt + j * d, d);
        }
      }
      EXPECT_TRUE(same(dx, dx_ref)) << "hc_post_bwd dx";
      EXPECT_TRUE(same(df, df_ref)) << "hc_post_bwd df";
      EXPECT_TRUE(same(dp, dp_ref)) << "hc_post_bwd dpost";
      EXPECT_TRUE(same(dc, dc_ref)) << "hc_post_bwd dcomb";
      // the pre and head steps' dots, collapse and dx update (with and without dy)
      std::vector<float> dots(n), dots_ref(n), y(d), y_ref(d);
      hc_dots_avx512(n, d, f.data(), x.data(), dots.data());
      for (int j = 0; j < n; ++j) dots_ref[j] = dot(f.data(), x.data() + j * d, d);
      EXPECT_TRUE(same(dots, dots_ref)) << "hc_dots";
      hc_collapse_avx512(n, d, post.data(), x.data(), y.data());
      collapse(n, d, post.data(), x.data(), y_ref.data());
      EXPECT_TRUE(same(y, y_ref)) << "hc_collapse";
      for (const float* dy : {(const float*)f.data(), (const float*)nullptr}) {
        std::vector<float> u(dout.begin(), dout.begin() + K), u_ref(u);
        hc_dx_update_avx512(n, d, post.data(), 0.37f, dy, x.data(), u.data());
        for (int j = 0; j < n; ++j)
          for (int64_t i = 0; i < d; ++i) {
            if (dy) u_ref[j * d + i] += post[j] * dy[i] - 0.37f * x[j * d + i];
            else u_ref[j * d + i] -= 0.37f * x[j * d + i];
          }
        EXPECT_TRUE(same(u, u_ref)) << "hc_dx_update" << (dy ? "" : " (no dy)");
      }
      const float s = hc_dot_avx512(x.data(), x.data(), K), s_ref = dot(x.data(), x.data(), K);
      EXPECT_EQ(0, std::memcmp(&s, &s_ref, sizeof s)) << "hc_dot";
    }
}

}  // namespace
