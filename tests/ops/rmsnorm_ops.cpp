// Op cases for RMSNorm: fast vs reference (forward y, rstd; backward dx, dw with accumulation),
// NaN propagation, all outputs (dw included) bitwise independent of the thread count, for the
// dispatched kernel and the AVX2 kernel called directly ("rmsnorm[avx2]",
// kernels/cpu/rmsnorm_avx2.h; skipped on a CPU without AVX2 + FMA, so it also runs on AVX-512
// machines); gradients in double against finite differences; bandwidth (dispatched and AVX2).
#include <omp.h>
#include <cstring>
#include <limits>
#include <string>
#include <vector>
#include "core/parallel.h"
#include "kernels/cpu/rmsnorm_avx2.h"
#include "kernels/ref/rmsnorm.h"
#include "kernels/rmsnorm.h"
#include "tests/ops/harness.h"
#include "tests/ops/rmsnorm_cases.h"

namespace {
using namespace trex;
using namespace trex::ops;

// The implementation under test: the dispatched one, or the AVX2 kernel called directly.
struct RmsImpl {
  const char* tag;
  void (*fwd)(const float*, int64_t, int64_t, const float*, float, float*, float*);
  void (*bwd)(const float*, const float*, int64_t, int64_t, const float*, const float*, float*, float*);
  bool (*usable)();
};
bool rms_always() { return true; }
bool rms_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
const RmsImpl kRmsImpls[] = {{"rmsnorm", kern::rmsnorm_fwd, kern::rmsnorm_bwd, rms_always},
                             {"rmsnorm[avx2]", kern::cpu::rmsnorm_fwd_avx2, kern::cpu::rmsnorm_bwd_avx2,
                              rms_has_avx2_fma}};
// A case of an implementation the CPU cannot run passes with a note.
bool rms_skipped(const RmsImpl& im, const std::string& name) {
  if (im.usable()) return false;
  std::printf("skip %-48s (CPU lacks AVX2 + FMA)\n", name.c_str());
  return true;
}

// Forward and backward of an implementation against the float reference. nan_row >= 0 puts
// a NaN into that row of x.
bool rms_test(const RmsImpl& im, int64_t N, int64_t d, int64_t nan_row, double scale = 2.0) {
  const std::string name = rms_case_name(im.tag, N, d, nan_row, scale);
  if (rms_skipped(im, name)) return true;
  const RmsInputs in = rms_inputs(N, d, nan_row, scale);
  const std::vector<float>&x = in.x, &w = in.w, &dy = in.dy, &dw0 = in.dw0;
  const size_t nd = static_cast<size_t>(N * d);
  const float eps = 1e-6f;

  Guarded<float> y(nd), rs(N), dx(nd), dw(d);
  std::vector<float> y_ref(nd), rs_ref(N), dx_ref(nd), dw_ref(dw0);
  for (int64_t j = 0; j < d; ++j) dw[j] = dw0[j];
  im.fwd(x.data(), N, d, w.data(), eps, y.data(), rs.data());
  im.bwd(dy.data(), x.data(), N, d, w.data(), rs.data(), dx.data(), dw.data());
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

// y, rstd, dx and dw (+= onto the same start) must be bitwise the same for 1, 2 and 3 threads.
bool rms_determinism(const RmsImpl& im, int64_t N, int64_t d) {
  std::string name = std::string(im.tag) + " determinism N=" + std::to_string(N) + " d=" + std::to_string(d);
  if (rms_skipped(im, name)) return true;
  Rng r(77);
  const size_t nd = static_cast<size_t>(N * d);
  std::vector<float> x(nd), w(d), dy(nd);
  fill_normal(x.data(), nd, r);
  fill_normal(w.data(), d, r);
  fill_normal(dy.data(), nd, r);
  struct Out {
    std::vector<float> y, rs, dx, dw;
  };
  auto run = [&](int threads) {
    Out o{std::vector<float>(nd), std::vector<float>(N), std::vector<float>(nd), std::vector<float>(d, 0.5f)};
    omp_set_num_threads(threads);
    im.fwd(x.data(), N, d, w.data(), 1e-6f, o.y.data(), o.rs.data());
    im.bwd(dy.data(), x.data(), N, d, w.data(), o.rs.data(), o.dx.data(), o.dw.data());
    return o;
  };
  const int nt = num_threads();
  const Out o1 = run(1), o2 = run(2), o3 = run(3);
  omp_set_num_threads(nt);
  auto diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    size_t bad = 0;
    for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], 4) != 0;
    return bad;
  };
  size_t bad = 0;
  for (const Out* o : {&o2, &o3})
    bad += diff(o1.y, o->y) + diff(o1.rs, o->rs) + diff(o1.dx, o->dx) + diff(o1.dw, o->dw);
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

void rms_perf(const RmsImpl& im, int64_t N, int64_t d) {
  if (rms_skipped(im, std::string(im.tag) + " perf")) return;
  const size_t nd = static_cast<size_t>(N * d);
  Rng r(3);
  std::vector<float> x(nd), w(d, 1.0f), y(nd), rs(N), dy(nd), dx(nd), dw(d, 0.0f);
  fill_normal(x.data(), nd, r);
  fill_normal(dy.data(), nd, r);
  double tf = time_ms([&] { im.fwd(x.data(), N, d, w.data(), 1e-6f, y.data(), rs.data()); });
  double tb = time_ms([&] { im.bwd(dy.data(), x.data(), N, d, w.data(), rs.data(), dx.data(), dw.data()); });
  std::printf("perf %s N=%ld d=%ld  fwd %.3f ms %.1f GB/s   bwd %.3f ms %.1f GB/s\n", im.tag, (long)N, (long)d, tf,
              8.0 * nd / tf * 1e-6, tb, 12.0 * nd / tb * 1e-6);
}

}  // namespace

TREX_OP_CASES(rmsnorm_cases) {
  for (const RmsImpl& im : kRmsImpls) {
    for (auto& s : kRmsShapes) {
      int64_t N = s[0], d = s[1];
      cases.push_back({im.tag, [=, &im] { return rms_test(im, N, d, -1); }, nullptr, nullptr});
    }
    cases.push_back({im.tag, [&im] { return rms_test(im, 9, 100, 4); }, nullptr, nullptr});
    cases.push_back({im.tag, [&im] { return rms_test(im, 17, 300, -1, 1e-3); }, nullptr, nullptr});
    cases.push_back({im.tag, [&im] { return rms_determinism(im, 301, 1000); }, nullptr, nullptr});
    cases.push_back({im.tag, [&im] { return rms_determinism(im, 1000, 37); }, nullptr, nullptr});
  }
  const int64_t gshapes[][2] = {{1, 7}, {3, 37}, {4, 16}};
  for (auto& s : gshapes) {
    int64_t N = s[0], d = s[1];
    cases.push_back({"rmsnorm", nullptr, [=] { return rms_grad(N, d); }, nullptr});
  }
  for (const RmsImpl& im : kRmsImpls) {
    cases.push_back({im.tag, nullptr, nullptr, [&im] { rms_perf(im, 1024, 7168); }});
    cases.push_back({im.tag, nullptr, nullptr, [&im] { rms_perf(im, 4096, 1000); }});
    cases.push_back({im.tag, nullptr, nullptr, [&im] { rms_perf(im, 2048, 1024); }});  // bench-v3 hidden norms
  }
}
