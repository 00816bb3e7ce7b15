// Op cases for LayerNorm (the DeepSeek-V3.2 indexer's key norm): the f32 kernel (forward y;
// backward dx, dw and db with accumulation) against the scalar reference run in double, dw / db
// bitwise independent of the thread count; the reference backward (double) against finite
// differences of the reference forward.
#include <omp.h>
#include <string>
#include <vector>
#include "core/parallel.h"
#include "kernels/layernorm.h"
#include "kernels/ref/layernorm.h"
#include "tests/ops/harness.h"

namespace {
using namespace trex;
using namespace trex::ops;

std::string ln_name(int64_t N, int64_t d) { return "layernorm N=" + std::to_string(N) + " d=" + std::to_string(d); }

bool ln_test(int64_t N, int64_t d) {
  const std::string name = ln_name(N, d);
  Rng r(11 + N + d);
  const size_t nd = static_cast<size_t>(N * d);
  std::vector<float> x(nd), w(d), b(d), dy(nd), dw0(d), db0(d);
  fill_normal(x.data(), nd, r, 2.0);
  for (int64_t i = 0; i < N; ++i) x[i * d] += 3.f;  // a row mean away from 0
  for (auto& v : w) v = (float)(1.0 + 0.5 * r.normal());
  fill_normal(b.data(), d, r);
  fill_normal(dy.data(), nd, r);
  fill_normal(dw0.data(), d, r);
  fill_normal(db0.data(), d, r);
  const float eps = 1e-6f;
  Guarded<float> y(nd), dx(nd), dw(d), db(d);
  for (int64_t j = 0; j < d; ++j) dw[j] = dw0[j], db[j] = db0[j];
  kern::layernorm_fwd(x.data(), N, d, w.data(), b.data(), eps, y.data());
  kern::layernorm_bwd(dy.data(), x.data(), N, d, w.data(), eps, dx.data(), dw.data(), db.data());
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(b.begin(), b.end()), dyd(dy.begin(), dy.end());
  std::vector<double> yr(nd), dxr(nd), dwr(dw0.begin(), dw0.end()), dbr(db0.begin(), db0.end());
  kern::ref::layernorm_fwd<double>(xd.data(), N, d, wd.data(), bd.data(), eps, yr.data());
  kern::ref::layernorm_bwd<double>(dyd.data(), xd.data(), N, d, wd.data(), eps, dxr.data(), dwr.data(), dbr.data());
  const bool guards = y.guard_ok() && dx.guard_ok() && dw.guard_ok() && db.guard_ok();
  bool ok = report(name, "y", nmse(y.data(), yr.data(), nd), 1e-12, guards, "guard");
  ok &= report(name, "dx", nmse(dx.data(), dxr.data(), nd), 1e-12);
  ok &= report(name, "dw", nmse(dw.data(), dwr.data(), d), 1e-12);
  ok &= report(name, "db", nmse(db.data(), dbr.data(), d), 1e-12);
  // Thread count: dw, db (column sums over rows in order) and dx bitwise the same with 1 thread.
  std::vector<float> dx1(nd), dw1(dw0), db1(db0);
  const int nt = num_threads();
  omp_set_num_threads(1);
  kern::layernorm_bwd(dy.data(), x.data(), N, d, w.data(), eps, dx1.data(), dw1.data(), db1.data());
  omp_set_num_threads(nt);
  size_t bad = 0;
  for (size_t i = 0; i < nd; ++i) bad += dx1[i] != dx[i];
  for (int64_t j = 0; j < d; ++j) bad += dw1[j] != dw[j] || db1[j] != db[j];
  ok &= report(name, "threads bitwise", (double)bad, 0);
  return ok;
}

// Reference backward (double) against finite differences of L = sum(p * y) w.r.t. x, w and b.
bool ln_grad(int64_t N, int64_t d) {
  const std::string name = ln_name(N, d);
  Rng r(7 + N + d);
  const size_t nd = static_cast<size_t>(N * d);
  std::vector<double> x(nd), w(d), b(d), p(nd), y(nd), dx(nd), dw(d, 0.0), db(d, 0.0);
  fill_normal(x.data(), nd, r);
  for (auto& v : w) v = 1.0 + 0.5 * r.normal();
  fill_normal(b.data(), d, r);
  fill_normal(p.data(), nd, r);
  const double eps = 1e-6;
  auto loss = [&]() {
    kern::ref::layernorm_fwd<double>(x.data(), N, d, w.data(), b.data(), eps, y.data());
    double s = 0;
    for (size_t i = 0; i < nd; ++i) s += p[i] * y[i];
    return s;
  };
  kern::ref::layernorm_bwd<double>(p.data(), x.data(), N, d, w.data(), eps, dx.data(), dw.data(), db.data());
  bool ok = report(name, "dx", fd_check(x, loss, dx), 1e-6);
  ok &= report(name, "dw", fd_check(w, loss, dw), 1e-6);
  ok &= report(name, "db", fd_check(b, loss, db), 1e-6);
  return ok;
}

}  // namespace

TREX_OP_CASES(layernorm_cases) {
  const int64_t shapes[][2] = {{1, 7}, {5, 9}, {37, 16}, {301, 45}, {64, 128}};
  for (auto& s : shapes) {
    const int64_t N = s[0], d = s[1];
    cases.push_back({"layernorm", [=] { return ln_test(N, d); }, nullptr, nullptr});
  }
  const int64_t gshapes[][2] = {{1, 7}, {3, 9}, {4, 16}};
  for (auto& s : gshapes) {
    const int64_t N = s[0], d = s[1];
    cases.push_back({"layernorm", nullptr, [=] { return ln_grad(N, d); }, nullptr});
  }
}
