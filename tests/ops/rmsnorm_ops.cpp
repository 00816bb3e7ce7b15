// Op cases for RMSNorm: fast vs reference (forward y, rstd; backward dx, dw with accumulation),
// NaN propagation, dw bitwise independent of the thread count, gradients in double against
// finite differences, and bandwidth.
#include <omp.h>
#include <limits>
#include <string>
#include <vector>
#include "core/parallel.h"
#include "kernels/ref/rmsnorm.h"
#include "kernels/rmsnorm.h"
#include "tests/ops/harness.h"

namespace {
using namespace trex;
using namespace trex::ops;

// Forward and backward of the dispatched kernel against the float reference. nan_row >= 0 puts
// a NaN into that row of x.
bool rms_test(int64_t N, int64_t d, int64_t nan_row, double scale = 2.0) {
  std::string name = "rmsnorm N=" + std::to_string(N) + " d=" + std::to_string(d) +
                     (nan_row >= 0 ? " nan" : "") + (scale < 0.1 ? " small x" : "");
  Rng r(1000 + N * 7 + d);
  const size_t nd = static_cast<size_t>(N * d);
  std::vector<float> x(nd), w(d), dy(nd), dw0(d);
  fill_normal(x.data(), nd, r, scale);  // small scale: mean(x^2) ~ eps, eps matters
  for (auto& v : w) v = static_cast<float>(1.0 + 0.3 * r.normal());
  fill_normal(dy.data(), nd, r);
  fill_normal(dw0.data(), d, r);
  if (nan_row >= 0) x[nan_row * d + d / 2] = std::numeric_limits<float>::quiet_NaN();
  const float eps = 1e-6f;

  Guarded<float> y(nd), rs(N), dx(nd), dw(d);
  std::vector<float> y_ref(nd), rs_ref(N), dx_ref(nd), dw_ref(dw0);
  for (int64_t j = 0; j < d; ++j) dw[j] = dw0[j];
  kern::rmsnorm_fwd(x.data(), N, d, w.data(), eps, y.data(), rs.data());
  kern::rmsnorm_bwd(dy.data(), x.data(), N, d, w.data(), rs.data(), dx.data(), dw.data());
  kern::ref::rmsnorm_fwd<float>(x.data(), N, d, w.data(), eps, y_ref.data(), rs_ref.data());
  kern::ref::rmsnorm_bwd<float>(dy.data(), x.data(), N, d, w.data(), rs_ref.data(), dx_ref.data(), dw_ref.data());

  bool ok = true, m1, m2, m3, m4;  // nmse evaluated first: argument order is unspecified
  const double e1 = nmse(y.data(), y_ref.data(), nd, &m1), e2 = nmse(rs.data(), rs_ref.data(), N, &m2);
  const double e3 = nmse(dx.data(), dx_ref.data(), nd, &m3), e4 = nmse(dw.data(), dw_ref.data(), d, &m4);
  ok &= report(name, "y", e1, 1e-10, !m1 && y.guard_ok(), "nan/guard");
  ok &= report(name, "rstd", e2, 1e-10, !m2 && rs.guard_ok(), "nan/guard");
  ok &= report(name, "dx", e3, 1e-10, !m3 && dx.guard_ok(), "nan/guard");
  ok &= report(name, "dw", e4, 1e-10, !m4 && dw.guard_ok(), "nan/guard");
  return ok;
}

// dw and dx must be bitwise the same for 1 and 3 threads.
bool rms_determinism(int64_t N, int64_t d) {
  std::string name = "rmsnorm determinism N=" + std::to_string(N) + " d=" + std::to_string(d);
  Rng r(77);
  const size_t nd = static_cast<size_t>(N * d);
  std::vector<float> x(nd), w(d), dy(nd), rs(N), y(nd), dx1(nd), dx3(nd), dw1(d, 0.5f), dw3(d, 0.5f);
  fill_normal(x.data(), nd, r);
  fill_normal(w.data(), d, r);
  fill_normal(dy.data(), nd, r);
  kern::rmsnorm_fwd(x.data(), N, d, w.data(), 1e-6f, y.data(), rs.data());
  const int nt = num_threads();
  omp_set_num_threads(1);
  kern::rmsnorm_bwd(dy.data(), x.data(), N, d, w.data(), rs.data(), dx1.data(), dw1.data());
  omp_set_num_threads(3);
  kern::rmsnorm_bwd(dy.data(), x.data(), N, d, w.data(), rs.data(), dx3.data(), dw3.data());
  omp_set_num_threads(nt);
  size_t bad = 0;
  for (int64_t j = 0; j < d; ++j) bad += std::memcmp(&dw1[j], &dw3[j], 4) != 0;
  for (size_t i = 0; i < nd; ++i) bad += std::memcmp(&dx1[i], &dx3[i], 4) != 0;
  return report(name, "bitwise", static_cast<double>(bad), 0);
}

// Reference backward (double) against finite differences of the reference forward (double) of
// L = sum(p * y) for a random projection p, w.r.t. x and w.
bool rms_grad(int64_t N, int64_t d) {
  std::string name = "rmsnorm N=" + std::to_string(N) + " d=" + std::to_string(d);
  Rng r(5 + N + d);
  const size_t nd = static_cast<size_t>(N * d);
  std::vector<double> x(nd), w(d), p(nd), y(nd), rs(N), dx(nd), dw(d, 0.0);
  fill_normal(x.data(), nd, r);
  for (auto& v : w) v = 1.0 + 0.5 * r.normal();
  fill_normal(p.data(), nd, r);
  const double eps = 1e-5;
  auto loss = [&]() {
    kern::ref::rmsnorm_fwd<double>(x.data(), N, d, w.data(), eps, y.data(), nullptr);
    double s = 0;
    for (size_t i = 0; i < nd; ++i) s += p[i] * y[i];
    return s;
  };
  kern::ref::rmsnorm_fwd<double>(x.data(), N, d, w.data(), eps, y.data(), rs.data());
  kern::ref::rmsnorm_bwd<double>(p.data(), x.data(), N, d, w.data(), rs.data(), dx.data(), dw.data());
  bool ok = report(name, "dx", fd_check(x, loss, dx), 1e-6);
  ok &= report(name, "dw", fd_check(w, loss, dw), 1e-6);
  return ok;
}

void rms_perf(int64_t N, int64_t d) {
  const size_t nd = static_cast<size_t>(N * d);
  Rng r(3);
  std::vector<float> x(nd), w(d, 1.0f), y(nd), rs(N), dy(nd), dx(nd), dw(d, 0.0f);
  fill_normal(x.data(), nd, r);
  fill_normal(dy.data(), nd, r);
  double tf = time_ms([&] { kern::rmsnorm_fwd(x.data(), N, d, w.data(), 1e-6f, y.data(), rs.data()); });
  double tb = time_ms([&] { kern::rmsnorm_bwd(dy.data(), x.data(), N, d, w.data(), rs.data(), dx.data(), dw.data()); });
  std::printf("perf rmsnorm N=%ld d=%ld  fwd %.3f ms %.1f GB/s   bwd %.3f ms %.1f GB/s\n", (long)N, (long)d, tf,
              8.0 * nd / tf * 1e-6, tb, 12.0 * nd / tb * 1e-6);
}

}  // namespace

TREX_OP_CASES(rmsnorm_cases) {
  const int64_t shapes[][2] = {{1, 37}, {5, 16}, {3, 129}, {37, 1000}, {200, 64}, {129, 7168}};
  for (auto& s : shapes) {
    int64_t N = s[0], d = s[1];
    cases.push_back({"rmsnorm", [=] { return rms_test(N, d, -1); }, nullptr, nullptr});
  }
  cases.push_back({"rmsnorm nan", [] { return rms_test(9, 100, 4); }, nullptr, nullptr});
  cases.push_back({"rmsnorm small", [] { return rms_test(17, 300, -1, 1e-3); }, nullptr, nullptr});
  cases.push_back({"rmsnorm determinism", [] { return rms_determinism(301, 1000); }, nullptr, nullptr});
  const int64_t gshapes[][2] = {{1, 7}, {3, 37}, {4, 16}};
  for (auto& s : gshapes) {
    int64_t N = s[0], d = s[1];
    cases.push_back({"rmsnorm", nullptr, [=] { return rms_grad(N, d); }, nullptr});
  }
  cases.push_back({"rmsnorm", nullptr, nullptr, [] { rms_perf(1024, 7168); }});
  cases.push_back({"rmsnorm", nullptr, nullptr, [] { rms_perf(4096, 1000); }});
}
