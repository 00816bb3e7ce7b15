// A per-run profiler: named regions accumulate wall time and call counts. Owned by the caller
// and passed down explicitly (null = off, zero cost beyond a pointer test). Nested regions are
// reported under their own dotted names, so parents include their children. With a TraceLog
// attached (`trace`), every region is also recorded on the trace's compute track.
#pragma once
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include "core/timer.h"
#include "core/trace.h"

namespace trex {

class Profiler {
 public:
  void add(const char* name, double ms) {
    auto& e = regions_[name];
    e.ms += ms;
    e.calls += 1;
  }
  // A region that ran from t0 to t1 (now_ms() values): timed, and traced when a trace is set.
  void add_span(const char* name, double t0_ms, double t1_ms) {
    add(name, t1_ms - t0_ms);
    if (trace) trace->add(name, TraceTrack::Compute, t0_ms, t1_ms);
  }
  void clear() { regions_.clear(); }
  TraceLog* trace = nullptr;  // optional timeline (core/trace.h), owned by the caller
  // Prints regions sorted by name (so children follow parents), with per-step averages.
  void print(FILE* f, int steps, double step_ms) const {
    std::fprintf(f, "%-36s %10s %8s %7s\n", "region", "ms/step", "calls", "share");
    for (const auto& [name, e] : regions_)
      std::fprintf(f, "%-36s %10.1f %8.1f %6.1f%%\n", name.c_str(), e.ms / steps, (double)e.calls / steps,
                   100.0 * e.ms / steps / step_ms);
  }

 private:
  struct Entry {
    double ms = 0;
    long calls = 0;
  };
  std::map<std::string, Entry> regions_;
};

class ProfScope {
 public:
  ProfScope(Profiler* p, const char* name) : p_(p), name_(name), t0_(p ? now_ms() : 0) {}
  ~ProfScope() {
    if (p_) p_->add_span(name_, t0_, now_ms());
  }
  ProfScope(const ProfScope&) = delete;
  ProfScope& operator=(const ProfScope&) = delete;

 private:
  Profiler* p_;
  const char* name_;
  double t0_;
};

}  // namespace trex
