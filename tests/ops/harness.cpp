// The op harness's shared pieces (tests/ops/harness.h): the case registry, result lines,
// finite differences and timing. Linked into trex_ops and trex_cuda_ops.
#include <algorithm>
#include <cstdio>
#include <string>
#include "tests/ops/harness.h"

namespace trex::ops {

std::vector<OpCase>& registry() {
  static std::vector<OpCase> r;
  return r;
}

bool report(const std::string& name, const char* what, double err, double tol, bool extra_ok,
            const char* extra) {
  bool ok = err <= tol && extra_ok && std::isfinite(err);
  std::printf("%-4s %-48s %-6s err=%.3e tol=%.1e %s\n", ok ? "ok" : "FAIL", name.c_str(), what, err,
              tol, extra_ok ? "" : extra);
  return ok;
}

double fd_check(std::vector<double>& x, const std::function<double()>& f, const std::vector<double>& g,
                double eps) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double s = x[i];
    x[i] = s + eps;
    double fp = f();
    x[i] = s - eps;
    double fm = f();
    x[i] = s;
    double n = (fp - fm) / (2 * eps);
    num += (g[i] - n) * (g[i] - n);
    den += n * n;
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-12);
}

double time_ms(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    double t0 = now_ms();
    fn();
    t.push_back(now_ms() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace trex::ops
