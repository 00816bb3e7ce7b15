// trex_ops MODE [FILTER]: runs every registered op case in MODE (test | grad | perf) whose name
// contains FILTER; exits non-zero when any case fails.
#include <algorithm>
#include <cstdio>
#include <string>
#include "core/cpu.h"
#include "core/parallel.h"
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

int main(int argc, char** argv) {
  using namespace trex::ops;
  std::string mode = argc > 1 ? argv[1] : "test";
  std::string filter = argc > 2 ? argv[2] : "";
  if (mode != "test" && mode != "grad" && mode != "perf") {
    std::fprintf(stderr, "usage: trex_ops test|grad|perf [filter]\n");
    return 2;
  }
  trex::init_threads();
  std::printf("# trex_ops %s  isa=%s threads=%d\n", mode.c_str(), trex::isa_name(trex::cpu_isa()),
              trex::num_threads());
  int fails = 0, runs = 0;
  for (auto& c : registry()) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    if (mode == "test" && c.test) { ++runs; fails += !c.test(); }
    if (mode == "grad" && c.grad) { ++runs; fails += !c.grad(); }
    if (mode == "perf" && c.perf) { ++runs; c.perf(); }
  }
  std::printf("# %d cases, %d failed\n", runs, fails);
  return fails ? 1 : 0;
}
