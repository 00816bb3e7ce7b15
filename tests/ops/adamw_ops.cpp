// Op cases for AdamW and sum_squares: fast vs reference over several steps (p, m, v, the bf16
// copy bitwise equal to rounding the fast p), NaN/Inf gradients, both branches of torch's lerp,
// odd sizes; sum_squares against the double reference and bitwise across thread counts;
// bandwidth. (AdamW has no backward, so no grad cases; values against torch are in
// tests/unit/test_adamw_torch.cpp.)
// The AVX2 kernels, called directly ("adamw[avx2]", "sum_squares[avx2]", kernels/cpu/adamw_avx2.h;
// skipped on a CPU without AVX2, so they also run on AVX-512 machines), must give the reference
// fallback's bits: p, m, v and the bf16 copy equal to ref::adamw_step<float> (special values
// included), the sum of squares equal to the fallback's blocked sum; both at any thread count.
#include <omp.h>
#include <cmath>
#include <limits>
#include <string>
#include <vector>
#include "core/parallel.h"
#include "kernels/adamw.h"
#include "kernels/cpu/adamw_avx2.h"
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

// ---- The AVX2 kernels called directly: bitwise against the reference ----

bool avx2_skipped(const std::string& name) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) return false;
  std::printf("skip %-48s (CPU lacks AVX2)\n", name.c_str());
  return true;
}

// The AVX2 step with the scalars formed here, in baseline code, as kernels/adamw.cpp forms them.
void avx2_step(const kern::AdamWParams& hp, float* p, const float* g, float* m, float* v, int64_t n, bf16* pb) {
  kern::cpu::adamw_step_avx2(kern::ref::AdamWScalars<float>(hp), p, g, m, v, n, pb);
}

// Elements whose bits differ (NaNs compared by their bits too).
template <class T>
size_t bit_diff(const T* a, const T* b, int64_t n) {
  size_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return bad;
}

// Special values: every element starts from one (p, m, v) pattern, chosen from p in {normal,
// huge, NaN, +-inf, denormal, 0, -0}, m in {0, normal, huge, -inf, NaN}, v in {0, normal, huge,
// inf, NaN, denormal}, with g cycling through {normal, NaN, +-inf, +-3e38 (g*g overflows),
// denormal, 0, -1e-20 (g*g underflows), 65504} over the steps. NaN bits are compared too: a NaN p
// meets the default NaN of -inf/inf here, and which one survives is the compiler's choice of
// operand order in the reference and in the kernel (see kernels/cpu/adamw_avx2.cpp).
void fill_specials(float* p, float* m, float* v, float* g, int64_t n, int step) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float ps[] = {0.7f, -3.4e38f, nan, inf, -inf, 1e-40f, 0.f, -0.f, 3.3e38f};
  const float ms[] = {0.f, -0.02f, 3e38f, -inf, nan};
  const float vs[] = {0.f, 4e-4f, 3e38f, inf, nan, 1e-44f};
  const float gs[] = {0.01f, nan, inf, -inf, 3e38f, -3e38f, 1e-45f, 0.f, -1e-20f, -0.5f, 65504.f};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = i + step;  // a different gradient pattern each step
    if (step == 1) {
      p[i] = ps[i % 9];
      m[i] = ms[(i / 9) % 5];
      v[i] = vs[(i / 45) % 6];
    }
    g[i] = gs[k % 11];
  }
}

// n elements, 5 steps (specials: crafted values), bitwise against the reference.
bool adamw_avx2_test(int64_t n, double beta1, float grad_scale, bool specials) {
  std::string name = "adamw[avx2] n=" + std::to_string(n) + " b1=" + std::to_string(beta1).substr(0, 4) +
                     " gs=" + std::to_string(grad_scale).substr(0, 4) + (specials ? " specials" : "");
  if (avx2_skipped(name)) return true;
  kern::AdamWParams hp{1e-3, beta1, 0.95, 1e-8, 0.1, 1, grad_scale};
  Rng r(29 + n);
  Guarded<float> p(n), m(n), v(n);
  Guarded<bf16> pb(n);
  std::vector<float> g(n);
  fill_normal(p.data(), n, r);
  std::vector<float> p_ref(n), m_ref(n), v_ref(n);
  std::vector<bf16> pb_ref(n);
  for (int step = 1; step <= 5; ++step) {
    hp.step = step;
    if (specials) {
      fill_specials(p.data(), m.data(), v.data(), g.data(), n, step);
      if (step == 1) {
        p_ref.assign(p.data(), p.data() + n);
        m_ref.assign(m.data(), m.data() + n);
        v_ref.assign(v.data(), v.data() + n);
      }
    } else {
      fill_normal(g.data(), n, r, 0.01);
      if (step == 1) p_ref.assign(p.data(), p.data() + n);
    }
    avx2_step(hp, p.data(), g.data(), m.data(), v.data(), n, pb.data());
    kern::ref::adamw_step<float>(hp, p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, pb_ref.data());
  }
  bool ok = report(name, "p bits", (double)bit_diff(p.data(), p_ref.data(), n), 0, p.guard_ok(), "guard");
  ok &= report(name, "m bits", (double)bit_diff(m.data(), m_ref.data(), n), 0, m.guard_ok(), "guard");
  ok &= report(name, "v bits", (double)bit_diff(v.data(), v_ref.data(), n), 0, v.guard_ok(), "guard");
  ok &= report(name, "bf16 bits", (double)bit_diff(pb.data(), pb_ref.data(), n), 0, pb.guard_ok(), "guard");
  return ok;
}

// The crafted bf16 rounding cases of adamw_bf16_test through the AVX2 kernel, against the
// reference's copy (lr = 0, wd = 0: p keeps its bits).
bool adamw_avx2_bf16_test() {
  const std::string name = "adamw[avx2] bf16 rounding";
  if (avx2_skipped(name)) return true;
  const uint32_t pats[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f7fffffu, 0x7f7fffffu, 0x7fffffffu,
                           0xffffffffu, 0x7fc00000u, 0x7f800000u, 0xff800000u, 0x00008000u, 0x00018000u,
                           0x80000000u, 0x00000000u, 0xbf808000u, 0xbf818001u, 0x3f800000u, 0x7f808000u,
                           0xff80ffffu, 0x7f7f8000u, 0xff7f8000u, 0x0000ffffu, 0x807fffffu};
  const int64_t n = sizeof(pats) / sizeof(pats[0]);
  Guarded<float> p(n), m(n), v(n);
  Guarded<bf16> pb(n);
  std::vector<float> g(n, 0.5f), p_ref(n), m_ref(n, 0.f), v_ref(n, 0.f);
  std::vector<bf16> pb_ref(n);
  for (int64_t i = 0; i < n; ++i) std::memcpy(&p[i], &pats[i], 4), std::memcpy(&p_ref[i], &pats[i], 4);
  kern::AdamWParams hp{0.0, 0.9, 0.95, 1e-8, 0.0, 1};
  avx2_step(hp, p.data(), g.data(), m.data(), v.data(), n, pb.data());
  kern::ref::adamw_step<float>(hp, p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, pb_ref.data());
  const double bad = (double)(bit_diff(p.data(), p_ref.data(), n) + bit_diff(pb.data(), pb_ref.data(), n));
  return report(name, "bits", bad, 0, pb.guard_ok() && p.guard_ok(), "guard");
}

// p, m, v, the bf16 copy and the sum of squares bitwise the same for 1, 2 and 3 threads.
bool avx2_threads_test(int64_t n) {
  const std::string name = "adamw[avx2] threads 1/2/3 n=" + std::to_string(n);
  if (avx2_skipped(name)) return true;
  Rng r(11);
  std::vector<float> p0(n), g(n);
  fill_normal(p0.data(), n, r);
  fill_normal(g.data(), n, r, 0.01);
  struct Out {
    std::vector<float> p, m, v;
    std::vector<bf16> pb;
    double ss;
  };
  auto run = [&](int threads) {
    Out o{p0, std::vector<float>(n, 0.f), std::vector<float>(n, 0.f), std::vector<bf16>(n), 0.0};
    omp_set_num_threads(threads);
    kern::AdamWParams hp{1e-3, 0.9, 0.95, 1e-8, 0.1, 1, 0.7f};
    for (hp.step = 1; hp.step <= 3; ++hp.step)
      avx2_step(hp, o.p.data(), g.data(), o.m.data(), o.v.data(), n, o.pb.data());
    o.ss = kern::cpu::sum_squares_avx2(o.p.data(), n);
    return o;
  };
  const int nt = num_threads();
  const Out o1 = run(1), o2 = run(2), o3 = run(3);
  omp_set_num_threads(nt);
  size_t bad = 0;
  for (const Out* o : {&o2, &o3})
    bad += bit_diff(o1.p.data(), o->p.data(), n) + bit_diff(o1.m.data(), o->m.data(), n) +
           bit_diff(o1.v.data(), o->v.data(), n) + bit_diff(o1.pb.data(), o->pb.data(), n) +
           bit_diff(&o1.ss, &o->ss, 1);
  return report(name, "bits", (double)bad, 0);
}

// The fallback's definition of the value: blocks of kSumSquaresBlock summed in element order in
// double, the block sums added in block order.
double blocked_sum_squares(const float* x, int64_t n) {
  double s = 0;
  for (int64_t b = 0; b < n; b += kern::cpu::kSumSquaresBlock)
    s += kern::ref::sum_squares<float>(x + b, std::min(kern::cpu::kSumSquaresBlock, n - b));
  return s;
}

// sum_squares_avx2 bitwise equal to the blocked reference, at 1 and 2 threads; values over a few
// octaves, so that the order of the adds shows in the bits (every x^2 is exact in double).
bool sumsq_avx2_test(int64_t n) {
  const std::string name = "sum_squares[avx2] n=" + std::to_string(n);
  if (avx2_skipped(name)) return true;
  Rng r(5 + n);
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = (float)(r.normal() * std::exp2(6.0 * r.uniform() - 3.0));
  const double ref = blocked_sum_squares(x.data(), n);
  const int nt = num_threads();
  omp_set_num_threads(1);
  const double s1 = kern::cpu::sum_squares_avx2(x.data(), n);
  omp_set_num_threads(2);
  const double s2 = kern::cpu::sum_squares_avx2(x.data(), n);
  omp_set_num_threads(nt);
  size_t bad = bit_diff(&s1, &ref, 1) + bit_diff(&s2, &ref, 1);
  // Each block on its own (the others zero), so that a last-bit error of one block's sum cannot
  // vanish in the total.
  const int64_t B = kern::cpu::kSumSquaresBlock;
  if (n > B) {
    std::vector<float> y(n, 0.f);
    for (int64_t b = 0; b < n; b += B) {
      const int64_t len = std::min(B, n - b);
      std::copy(x.begin() + b, x.begin() + b + len, y.begin() + b);
      const double sb = kern::cpu::sum_squares_avx2(y.data(), n);
      const double rb = kern::ref::sum_squares<float>(x.data() + b, len);
      bad += bit_diff(&sb, &rb, 1);
      std::fill(y.begin() + b, y.begin() + b + len, 0.f);
    }
  }
  return report(name, "bits", (double)bad, 0);
}

void adamw_avx2_perf(int64_t n) {
  if (avx2_skipped("adamw[avx2] perf")) return;
  kern::AdamWParams hp{1e-3, 0.9, 0.95, 1e-8, 0.1, 10};
  std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.f), v(n, 0.f);
  std::vector<bf16> pb(n);
  double t = time_ms([&] { avx2_step(hp, p.data(), g.data(), m.data(), v.data(), n, nullptr); });
  double tb = time_ms([&] { avx2_step(hp, p.data(), g.data(), m.data(), v.data(), n, pb.data()); });
  double ts = time_ms([&] { (void)kern::cpu::sum_squares_avx2(g.data(), n); });
  std::printf("perf adamw[avx2] n=%ld  step %.3f ms %.1f GB/s   +bf16 %.3f ms %.1f GB/s   "
              "sum_squares %.3f ms %.1f GB/s\n",
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

  const int64_t odd = kern::cpu::kSumSquaresBlock + 1 + 13;  // 65537 + 13
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{37}, int64_t{1000}, odd})
    cases.push_back({"adamw[avx2]", [=] { return adamw_avx2_test(n, 0.9, 1.0f, false); }, nullptr, nullptr});
  cases.push_back({"adamw[avx2]", [] { return adamw_avx2_test(4099, 0.9, 0.37f, false); }, nullptr, nullptr});
  cases.push_back({"adamw[avx2]", [] { return adamw_avx2_test(333, 0.3, 0.5f, false); }, nullptr, nullptr});
  for (int64_t n : {int64_t{7}, int64_t{1000}, odd}) {
    cases.push_back({"adamw[avx2]", [=] { return adamw_avx2_test(n, 0.9, 1.0f, true); }, nullptr, nullptr});
    cases.push_back({"adamw[avx2]", [=] { return adamw_avx2_test(n, 0.3, 1.0f, true); }, nullptr, nullptr});
  }
  cases.push_back({"adamw[avx2] bf16", [] { return adamw_avx2_bf16_test(); }, nullptr, nullptr});
  cases.push_back({"adamw[avx2]", [] { return avx2_threads_test(100003); }, nullptr, nullptr});
  cases.push_back({"adamw[avx2]", [] { return avx2_threads_test(13 * kern::cpu::kSumSquaresBlock + 5); }, nullptr,
                   nullptr});
  // 1 block, partial; 3 and 8 full blocks (one and two chains); 13 blocks + 5 (a run of 8, a run
  // of 5 with spare lanes, the partial block).
  const int64_t B = kern::cpu::kSumSquaresBlock;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{37}, int64_t{1000}, B, odd, 3 * B, 8 * B, 13 * B + 5})
    cases.push_back({"sum_squares[avx2]", [=] { return sumsq_avx2_test(n); }, nullptr, nullptr});
  cases.push_back({"adamw[avx2]", nullptr, nullptr, [] { adamw_avx2_perf(8 << 20); }});
  // The parameter count order of configs/bench-v3.toml (about 0.9 GB of buffers per case).
  cases.push_back({"adamw n=50M", nullptr, nullptr, [] { adamw_perf(50'000'000); }});
  cases.push_back({"adamw[avx2] n=50M", nullptr, nullptr, [] { adamw_avx2_perf(50'000'000); }});
}
