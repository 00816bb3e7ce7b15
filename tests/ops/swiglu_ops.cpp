// Op cases for SwiGLU (with and without the clamp): fast vs reference incl. odd widths, clamped
// values, NaN/Inf inputs; gradients in double against finite differences; bandwidth.
#include <limits>
#include <string>
#include <vector>
#include "kernels/ref/swiglu.h"
#include "kernels/swiglu.h"
#include "tests/ops/harness.h"

namespace {
using namespace trex;
using namespace trex::ops;

bool swiglu_test(int64_t N, int64_t F, float limit, bool specials) {
  std::string name = "swiglu N=" + std::to_string(N) + " F=" + std::to_string(F) +
                     " limit=" + std::to_string(limit).substr(0, 4) + (specials ? " nan/inf" : "");
  Rng r(31 + N * 5 + F);
  const size_t n2 = static_cast<size_t>(N * 2 * F), n1 = static_cast<size_t>(N * F);
  // Scale so that about a third of the values fall outside [-limit, limit] when clamping.
  std::vector<float> gu(n2), dh(n1);
  fill_normal(gu.data(), n2, r, limit > 0 ? limit : 4.0);
  fill_normal(dh.data(), n1, r);
  if (limit > 0 && F > 2) {  // exact boundary values: gradient must pass (inclusive bounds)
    gu[0] = limit;
    gu[F] = limit;
    gu[F + 1] = -limit;
  }
  if (specials) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const float sv[] = {nan, inf, -inf, 200.0f, -200.0f, 89.0f, -89.0f, 0.0f};
    for (size_t i = 0; i < n2; i += 7) gu[i] = sv[(i / 7) % 8];
  }
  Guarded<float> h(n1), dgu(n2);
  std::vector<float> h_ref(n1), dgu_ref(n2);
  kern::swiglu_fwd(gu.data(), N, F, limit, h.data());
  kern::swiglu_bwd(dh.data(), gu.data(), N, F, limit, dgu.data());
  kern::ref::swiglu_fwd<float>(gu.data(), N, F, limit, h_ref.data());
  kern::ref::swiglu_bwd<float>(dh.data(), gu.data(), N, F, limit, dgu_ref.data());
  bool m1, m2;  // (nmse is evaluated first: argument order is unspecified)
  const double e1 = nmse(h.data(), h_ref.data(), n1, &m1), e2 = nmse(dgu.data(), dgu_ref.data(), n2, &m2);
  bool ok = report(name, "h", e1, 1e-12, !m1 && h.guard_ok(), "nan/guard");
  ok &= report(name, "dgu", e2, 1e-12, !m2 && dgu.guard_ok(), "nan/guard");
  // Clamped gradients must be exactly zero where the reference says so.
  size_t zero_mism = 0;
  for (size_t i = 0; i < n2; ++i) zero_mism += (dgu_ref[i] == 0.0f) != (dgu[i] == 0.0f);
  ok &= report(name, "dgu==0", static_cast<double>(zero_mism), 0);
  return ok;
}

bool swiglu_grad(int64_t N, int64_t F, double limit) {
  std::string name = "swiglu N=" + std::to_string(N) + " F=" + std::to_string(F) +
                     " limit=" + std::to_string(limit).substr(0, 4);
  Rng r(7 + F);
  const size_t n2 = static_cast<size_t>(N * 2 * F), n1 = static_cast<size_t>(N * F);
  std::vector<double> gu(n2), p(n1), h(n1), dgu(n2);
  fill_normal(gu.data(), n2, r, 2.0);
  fill_normal(p.data(), n1, r);
  auto loss = [&]() {
    kern::ref::swiglu_fwd<double>(gu.data(), N, F, limit, h.data());
    double s = 0;
    for (size_t i = 0; i < n1; ++i) s += p[i] * h[i];
    return s;
  };
  kern::ref::swiglu_bwd<double>(p.data(), gu.data(), N, F, limit, dgu.data());
  size_t zeros = 0;
  for (double v : dgu) zeros += v == 0.0;
  bool ok = report(name, "dgu", fd_check(gu, loss, dgu), 1e-7);
  if (limit > 0) ok &= report(name, "clamped", zeros > 0 ? 0.0 : 1.0, 0, true);  // the clamp was exercised
  return ok;
}

void swiglu_perf(int64_t N, int64_t F, float limit) {
  const size_t n2 = static_cast<size_t>(N * 2 * F), n1 = static_cast<size_t>(N * F);
  Rng r(1);
  std::vector<float> gu(n2), dh(n1), h(n1), dgu(n2);
  fill_normal(gu.data(), n2, r, 3.0);
  fill_normal(dh.data(), n1, r);
  double tf = time_ms([&] { kern::swiglu_fwd(gu.data(), N, F, limit, h.data()); });
  double tb = time_ms([&] { kern::swiglu_bwd(dh.data(), gu.data(), N, F, limit, dgu.data()); });
  std::printf("perf swiglu N=%ld F=%ld limit=%g  fwd %.3f ms %.1f GB/s   bwd %.3f ms %.1f GB/s\n", (long)N, (long)F,
              limit, tf, 12.0 * n1 / tf * 1e-6, tb, 20.0 * n1 / tb * 1e-6);
}

}  // namespace

TREX_OP_CASES(swiglu_cases) {
  const int64_t shapes[][2] = {{1, 37}, {3, 16}, {7, 1000}, {64, 2048}, {5, 1}, {33, 129}};
  for (auto& s : shapes)
    for (float limit : {0.0f, 7.0f}) {
      int64_t N = s[0], F = s[1];
      cases.push_back({"swiglu", [=] { return swiglu_test(N, F, limit, false); }, nullptr, nullptr});
    }
  for (float limit : {0.0f, 10.0f})
    cases.push_back({"swiglu", [=] { return swiglu_test(9, 100, limit, true); }, nullptr, nullptr});
  for (double limit : {0.0, 1.5}) {
    cases.push_back({"swiglu", nullptr, [=] { return swiglu_grad(3, 17, limit); }, nullptr});
    cases.push_back({"swiglu", nullptr, [=] { return swiglu_grad(1, 40, limit); }, nullptr});
  }
  cases.push_back({"swiglu", nullptr, nullptr, [] { swiglu_perf(2048, 2048, 0.0f); }});
  cases.push_back({"swiglu", nullptr, nullptr, [] { swiglu_perf(2048, 2048, 10.0f); }});
}
