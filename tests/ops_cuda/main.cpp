// trex_cuda_ops MODE [FILTER]: the op harness on the CUDA backend. Every case runs a CUDA kernel
// on device copies of its inputs and compares the result with the CPU reference (kernels/ref)
// under the same bounds as trex_ops. Without a CUDA device it prints "skipped: no CUDA device"
// and exits 77, which CTest reports as skipped.
#include <cstdio>
#include <memory>
#include <string>
#include "core/error.h"
#include "core/timer.h"
#include "tests/ops_cuda/device.h"

namespace trex::ops {

namespace {
std::unique_ptr<kern::Backend>& backend_slot() {
  static std::unique_ptr<kern::Backend> b;
  return b;
}
}  // namespace

kern::Backend& dev() { return *backend_slot(); }

double dev_time_ms(const std::function<void()>& fn, int reps) {
  fn();
  dev().synchronize();
  const double t0 = now_ms();
  for (int i = 0; i < reps; ++i) fn();
  dev().synchronize();
  return (now_ms() - t0) / reps;
}

}  // namespace trex::ops

int main(int argc, char** argv) {
  using namespace trex::ops;
  const std::string mode = argc > 1 ? argv[1] : "test";
  const std::string filter = argc > 2 ? argv[2] : "";
  if (mode != "test" && mode != "perf") {
    std::fprintf(stderr, "usage: trex_cuda_ops test|perf [filter]\n");
    return 2;
  }
  std::string why;
  if (!trex::kern::cuda_available(&why)) {
    std::printf("skipped: %s\n", why.c_str());
    return 77;
  }
  try {
    backend_slot() = trex::kern::make_cuda_backend(0);
    std::printf("# trex_cuda_ops %s  device=%s\n", mode.c_str(), dev().describe().c_str());
    int fails = 0, runs = 0;
    for (auto& c : registry()) {
      if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
      // A case that throws (a CUDA error, say) fails alone; the others still run.
      try {
        if (mode == "test" && c.test) { ++runs; fails += !c.test(); }
        if (mode == "perf" && c.perf) { ++runs; c.perf(); }
      } catch (const std::exception& e) {
        ++fails;
        std::printf("FAIL %-48s threw: %s\n", c.name.c_str(), e.what());
      }
    }
    std::printf("# %d cases, %d failed\n", runs, fails);
    backend_slot().reset();
    return fails ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
