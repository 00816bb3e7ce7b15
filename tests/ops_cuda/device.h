// The CUDA op harness's view of the device (tests/ops_cuda/): the backend under test and device
// copies of host buffers with guard elements past the end, so that a kernel writing past its
// output is caught as on the CPU (tests/ops/harness.h: Guarded).
#pragma once
#include <vector>
#include "kernels/backend.h"
#include "tests/ops/harness.h"

namespace trex::ops {

// The backend under test (set by tests/ops_cuda/main.cpp before any case runs).
kern::Backend& dev();

// A device copy of a Guarded host buffer (its guard elements included).
template <class T>
struct DevCopy {
  Guarded<T>& host;
  kern::DeviceBuffer<T> buf;
  explicit DevCopy(Guarded<T>& h) : host(h), buf(dev(), h.buf.size()) { buf.upload(h.buf.data()); }
  T* get() { return buf.get(); }
  void fetch() { buf.download(host.buf.data()); }  // device -> host, guards included
};

// A device copy of plain input data.
template <class T>
kern::DeviceBuffer<T> upload(const std::vector<T>& h) {
  kern::DeviceBuffer<T> b(dev(), h.size());
  b.upload(h.data());
  return b;
}

// Milliseconds per call of fn (device work): one warm-up call, then `reps` calls between two
// synchronizations.
double dev_time_ms(const std::function<void()>& fn, int reps = 10);

}  // namespace trex::ops
