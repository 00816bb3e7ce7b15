// Op harness in the style of ggml's test-backend-ops. Each kernel registers one OpCase per
// shape with up to three modes:
//   test: the dispatched (fast) kernel against the scalar reference in kernels/ref:
//         NMSE below a bound, NaN/Inf in the same places, guard bytes past every output intact.
//   grad: the reference backward (run in double) against central finite differences of the
//         reference forward (in double), on a random projection of the output.
//   perf: time of the dispatched kernel; prints GFLOP/s or GB/s.
// Register with TREX_OP_CASE(name) { ... } in any tests/ops/*.cpp file; `trex_ops MODE [filter]`.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>
#include "core/rng.h"
#include "core/timer.h"

namespace trex::ops {

enum class Mode { Test, Grad, Perf };

struct OpCase {
  std::string name;
  std::function<bool()> test;   // returns pass
  std::function<bool()> grad;   // returns pass
  std::function<void()> perf;   // prints a line
};

std::vector<OpCase>& registry();
struct Registrar {
  explicit Registrar(std::function<void(std::vector<OpCase>&)> f) { f(registry()); }
};

// A buffer with guard values after the end; check_guard() says whether a kernel wrote past n.
template <class T>
struct Guarded {
  static constexpr size_t kGuard = 64;
  std::vector<T> buf;
  size_t n;
  explicit Guarded(size_t n_, T fill = T(0)) : buf(n_ + kGuard, T(0)), n(n_) {
    for (size_t i = 0; i < n; ++i) buf[i] = fill;
    for (size_t i = 0; i < kGuard; ++i) std::memset(static_cast<void*>(&buf[n + i]), 0xA5, sizeof(T));
  }
  T* data() { return buf.data(); }
  const T* data() const { return buf.data(); }
  T& operator[](size_t i) { return buf[i]; }
  bool guard_ok() const {
    unsigned char pat[sizeof(T)];
    std::memset(pat, 0xA5, sizeof(T));
    for (size_t i = 0; i < kGuard; ++i)
      if (std::memcmp(&buf[n + i], pat, sizeof(T))) return false;
    return true;
  }
};

template <class T>
void fill_normal(T* p, size_t n, Rng& r, double scale = 1.0) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(r.normal() * scale);
}

// Normalized mean squared error sum((a-b)^2) / sum(b^2); NaN/Inf positions must agree.
template <class A, class B>
double nmse(const A* a, const B* b, size_t n, bool* nan_mismatch = nullptr) {
  double num = 0, den = 0;
  bool mism = false;
  for (size_t i = 0; i < n; ++i) {
    double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    bool fx = std::isfinite(x), fy = std::isfinite(y);
    if (fx != fy || (!fx && !fy && std::isnan(x) != std::isnan(y))) mism = true;
    if (!fx || !fy) continue;
    num += (x - y) * (x - y);
    den += y * y;
  }
  if (nan_mismatch) *nan_mismatch = mism;
  return den > 0 ? num / den : num;
}

// Prints a result line and returns ok.
bool report(const std::string& name, const char* what, double err, double tol, bool extra_ok = true,
            const char* extra = "");

// Central finite difference of a scalar function f(x) w.r.t. every element of x (double).
// Returns the max relative error between analytic `g` and the numeric gradient, where the
// relative error of the whole vector is ||g - n|| / max(||n||, 1e-12).
double fd_check(std::vector<double>& x, const std::function<double()>& f, const std::vector<double>& g,
                double eps = 1e-6);

// Times fn: warm-up once, then the median of `reps` runs, in milliseconds.
double time_ms(const std::function<void()>& fn, int reps = 5);

}  // namespace trex::ops

#define TREX_OP_CONCAT2(a, b) a##b
#define TREX_OP_CONCAT(a, b) TREX_OP_CONCAT2(a, b)
#define TREX_OP_CASES(fn)                                                 \
  static void fn(std::vector<::trex::ops::OpCase>&);                      \
  static ::trex::ops::Registrar TREX_OP_CONCAT(fn, _registrar)(fn);       \
  static void fn(std::vector<::trex::ops::OpCase>& cases)
