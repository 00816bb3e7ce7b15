// Inputs and comparisons shared by the hyper-connection op cases of the CPU harness
// (tests/ops/hyper_conn_ops.cpp) and the CUDA harness (tests/ops_cuda/v4_hc_ops.cpp), so that both
// draw the same data for a shape and seed and judge it the same way.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>
#include "kernels/hyper_conn.h"
#include "tests/ops/harness.h"

namespace trex::ops {

// Random inputs for one shape (T = float for the kernels, double for gradient checks).
template <class T>
struct HcData {
  kern::HcShape s;
  int R;
  int64_t K;
  std::vector<T> x, fn, base, scale, dy, dpost, dcomb, f, dout, hfn, hbase, hscale;
  HcData(const kern::HcShape& s_, uint64_t seed) : s(s_), R((2 + s_.n) * s_.n), K(s_.n * s_.d) {
    Rng r(seed);
    const size_t N = static_cast<size_t>(s.N), n = static_cast<size_t>(s.n), d = static_cast<size_t>(s.d);
    auto normal = [&](size_t cnt, double sc, double mean = 0.0) {
      std::vector<T> v(cnt);
      for (auto& e : v) e = static_cast<T>(mean + sc * r.normal());
      return v;
    };
    x = normal(N * K, 1.5);
    fn = normal(static_cast<size_t>(R) * K, 1.0 / std::sqrt(static_cast<double>(K)));  // mix ~ N(0, 1)
    base = normal(R, 0.7);
    scale = normal(3, 0.3, 1.0);
    dy = normal(N * d, 1.0);
    dpost = normal(N * n, 1.0);
    dcomb = normal(N * n * n, 1.0);
    f = normal(N * d, 1.0);
    dout = normal(N * K, 1.0);
    hfn = normal(n * K, 1.0 / std::sqrt(static_cast<double>(K)));
    hbase = normal(n, 0.7);
    hscale = normal(1, 0.3, 1.0);
  }
};

// a against the reference b: normalized error within tol, no NaN, guards intact.
inline bool cmp(const std::string& name, const char* what, const Guarded<float>& a, const std::vector<float>& b,
                double tol) {
  bool m;
  const double e = nmse(a.data(), b.data(), a.n, &m);
  return report(name, what, e, tol, !m && a.guard_ok(), "nan/guard");
}

template <class T>
Guarded<T> guarded(const std::vector<T>& v) {
  Guarded<T> g(v.size());
  for (size_t i = 0; i < v.size(); ++i) g[i] = v[i];
  return g;
}

}  // namespace trex::ops
