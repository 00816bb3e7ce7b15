// Op cases for AdamW and sum_squares: fast vs reference over several steps (p, m, v, the bf16
// copy bitwise equal to rounding the fast p), NaN/Inf gradients, both branches of torch's lerp,
// odd sizes; sum_squares against the double reference and bitwise across thread counts;
// bandwidth. (AdamW has no backward, so no grad cases; values against torch are in
// tests/unit/test_adamw_torch.cpp.)
#include <omp.h>
#include <cmath>
#include <limits>
#include <string>
#include <vector>
#include "core/parallel.h"
#include "kernels/adamw.h"
#include "kernels/ref/adamw.h"
#include "tests/ops/harness.h"

namespace {
using namespace trex;
using namespace trex::ops;

bool adamw_test(int64_t n, double beta1, float grad_scale, bool specials) {
  std::string name = "adamw n=" + std::to_string(n) + " b1=" + std::to_string(beta1).substr(0, 4) +
                     " gs=" + std::to_string(grad_scale).substr(0, 4) + (specials ? " nan/inf" : "");
  kern::AdamWParams hp{1e-3, beta1, 0.95, 1e-8, 0.1, 1, grad_scale};
  Rng r(17 + n);
  Guarded<float> p(n), m(n), v(n);
  Guarded<bf16> pb(n);
  fill_normal(p.data(), n, r);
  std::vector<float> p_ref(p.data(), p.data() + n), m_ref(n, 0.f), v_ref(n, 0.f), g(n);
  std::vector<bf16> pb_ref(n);
  bool ok = true;
  for (int step = 1; step <= 5; ++step) {
    hp.step = step;
    fill_normal(g.data(), n, r, 0.01);
    if (specials && n > 3 && step == 3) {
      g[1] = std::numeric_limits<float>::quiet_NaN();
      g[n - 1] = std::numeric_limits<float>::infinity();
    }
    kern::adamw_step(hp, p.data(), g.data(), m.data(), v.data(), n, pb.data());
    kern::ref::adamw_step<float>(hp, p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, pb_ref.data());
  }
  bool m1, m2, m3;  // nmse evaluated first: argument order is unspecified
  const double e1 = nmse(p.data(), p_ref.data(), n, &m1), e2 = nmse(m.data(), m_ref.data(), n, &m2),
               e3 = nmse(v.data(), v_ref.data(), n, &m3);
  size_t bad_bf16 = 0;  // the bf16 copy must be exactly the rounding of the fast p
  for (int64_t i = 0; i < n; ++i) bad_bf16 += pb[i].bits != f32_to_bf16(p[i]).bits;
  ok &= report(name, "p", e1, 1e-12, !m1 && p.guard_ok(), "nan/guard");
  ok &= report(name, "m", e2, 1e-12, !m2 && m.guard_ok(), "nan/guard");
  ok &= report(name, "v", e3, 1e-12, !m3 && v.guard_ok(), "nan/guard");
  ok &= report(name, "p_bf16", static_cast<double>(bad_bf16), 0, pb.guard_ok(), "guard");
  return ok;
}

// lr = 0, wd = 0: p keeps its bits, so crafted values reach the bf16 rounding: ties to even,
// carries into the exponent, overflow to inf, NaNs whose payload would carry, denormals.
bool adamw_bf16_test() {
  const uint32_t pats[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f7fffffu, 0x7f7fffffu, 0x7fffffffu,
                           0xffffffffu, 0x7fc00000u, 0x7f800000u, 0xff800000u, 0x00008000u, 0x00018000u,
                           0x80000000u, 0x00000000u, 0xbf808000u, 0xbf818001u, 0x3f800000u};
  const int64_t n = sizeof(pats) / sizeof(pats[0]);
  Guarded<float> p(n), m(n), v(n);
  Guarded<bf16> pb(n);
  std::vector<float> g(n, 0.5f);
  for (int64_t i = 0; i < n; ++i) std::memcpy(&p[i], &pats[i], 4);
  kern::AdamWParams hp{0.0, 0.9, 0.95, 1e-8, 0.0, 1};
  kern::adamw_step(hp, p.data(), g.data(), m.data(), v.data(), n, pb.data());
  size_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &p[i], 4);
    bool is_nan = (pats[i] & 0x7fffffffu) > 0x7f800000u;
    if (!is_nan && u != pats[i] && (u | pats[i]) != 0x80000000u) ++bad;  // p unchanged (up to the sign of 0)
    if (pb[i].bits != f32_to_bf16(p[i]).bits) ++bad;
  }
  return report("adamw bf16 rounding", "bad", static_cast<double>(bad), 0, pb.guard_ok() && p.guard_ok(), "guard");
}

bool sumsq_test(int64_t n) {
  std::string name = "sum_squares n=" + std::to_string(n);
  Rng r(3 + n);
  std::vector<float> x(n);
  fill_normal(x.data(), n, r, 3.0);
  const double ref = kern::ref::sum_squares<float>(x.data(), n);
  const int nt = num_threads();
  omp_set_num_threads(1);
  const double s1 = kern::sum_squares(x.data(), n);
  omp_set_num_threads(3);
  const double s3 = kern::sum_squares(x.data(), n);
  omp_set_num_threads(nt);
  const double rel = ref != 0 ? std::abs(s1 - ref) / ref : std::abs(s1);
  return report(name, "rel", rel, 1e-11, std::memcmp(&s1, &s3, sizeof(double)) == 0, "threads 1 vs 3 differ");
}

void adamw_perf(int64_t n) {
  kern::AdamWParams hp{1e-3, 0.9, 0.95, 1e-8, 0.1, 10};
  std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.f), v(n, 0.f);
  std::vector<bf16> pb(n);
  double t = time_ms([&] { kern::adamw_step(hp, p.data(), g.data(), m.data(), v.data(), n); });
  double tb = time_ms([&] { kern::adamw_step(hp, p.data(), g.data(), m.data(), v.data(), n, pb.data()); });
  double ts = time_ms([&] { (void)kern::sum_squares(g.data(), n); });
  std::printf("perf adamw n=%ld  step %.3f ms %.1f GB/s   +bf16 %.3f ms %.1f GB/s   sum_squares %.3f ms %.1f GB/s\n",
              (long)n, t, 28.0 * n / t * 1e-6, tb, 30.0 * n / tb * 1e-6, ts, 4.0 * n / ts * 1e-6);
}

}  // namespace

TREX_OP_CASES(adamw_cases) {
  for (int64_t n : {1, 15, 16, 17, 1000, 100003})
    cases.push_back({"adamw", [=] { return adamw_test(n, 0.9, 1.0f, false); }, nullptr, nullptr});
  cases.push_back({"adamw", [] { return adamw_test(4099, 0.9, 0.37f, false); }, nullptr, nullptr});
  cases.push_back({"adamw", [] { return adamw_test(333, 0.3, 0.5f, false); }, nullptr, nullptr});  // lerp w >= 0.5
  cases.push_back({"adamw", [] { return adamw_test(77, 0.9, 1.0f, true); }, nullptr, nullptr});
  cases.push_back({"adamw bf16", [] { return adamw_bf16_test(); }, nullptr, nullptr});
  for (int64_t n : {1, 7, 8192, 8193, 1000003, 3 * 8192 * 256 + 5})
    cases.push_back({"sum_squares", [=] { return sumsq_test(n); }, nullptr, nullptr});
  cases.push_back({"adamw", nullptr, nullptr, [] { adamw_perf(8 << 20); }});
}
