// "Fenced": the CPU backend with every allocation in its own mapping that is readable and writable
// only while a backend call runs (PROT_NONE between calls), so any host read or write of its
// memory outside the backend faults. A model on it takes the device path of the CUDA backend with
// the CPU's kernels (tests/unit/test_device_model.cpp; the data-parallel device path in
// tests/mpi/test_dp_device.cpp).
#pragma once
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include "core/error.h"
#include "tests/unit/forwarding_backend.h"

namespace trex::testing {

class Fenced final : public ForwardingBackend {
 public:
  const char* name() const override { return "fenced"; }
  std::string describe() const override { return "cpu kernels, memory fenced between calls"; }
  ~Fenced() override {
    for (auto& [p, n] : live_) munmap(p, n);
  }

  void* alloc(size_t bytes) override {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), n = std::max<size_t>((bytes + page - 1) / page * page, page);
    void* p = mmap(nullptr, n, open_ ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error("fenced backend: mmap of " + std::to_string(n) + " bytes failed");
    live_[p] = n;
    return p;
  }
  void release(void* p) override {
    auto it = live_.find(p);
    ASSERT_NE(it, live_.end()) << "release of memory the backend did not allocate";
    munmap(p, it->second);
    live_.erase(it);
  }

 private:
  // Every allocation readable and writable for the lifetime of one backend call.
  void enter() override { protect(PROT_READ | PROT_WRITE), open_ = true; }
  void leave() override { protect(PROT_NONE), open_ = false; }
  void protect(int prot) {
    for (auto& [p, n] : live_) ASSERT_EQ(0, mprotect(p, n, prot));
  }
  std::map<void*, size_t> live_;
  bool open_ = false;
};

}  // namespace trex::testing
