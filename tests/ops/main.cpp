// trex_ops MODE [FILTER]: runs every registered op case in MODE (test | grad | perf) whose name
// contains FILTER; exits non-zero when any case fails.
#include <cstdio>
#include <string>
#include "core/cpu.h"
#include "core/parallel.h"
#include "tests/ops/harness.h"

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
