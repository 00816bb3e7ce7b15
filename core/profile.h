// A per-run profiler: named regions accumulate wall time and call counts. Owned by the caller
// and passed down explicitly (null = off, zero cost beyond a pointer test). Nested regions are
// reported under their own dotted names, so parents include their children. With a TraceLog
// attached (`trace`), every region is also recorded on the trace's compute track. Adding to a
// region that exists allocates nothing, so the profiler does not inflate the heap counts below.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include "core/timer.h"
#include "core/trace.h"

namespace trex {

// Costs spread across the step's regions, measured by the caller over the profiled steps
// (totals, not per step) and shown by print_breakdown as "of which" rows: they are parts of the
// rows above them, never added to the total again.
struct StepOverheads {
  // trex's own parallel regions (core/par_stats.h): how many, their wall time, and the wall time
  // lost in them to fork/join, imbalance and idle workers. GEMMs that oneDNN runs on all threads
  // open their own regions and are not among them; those run one per thread inside a trex region
  // (grouped_gemm's small experts) are inside it.
  bool threads = false;
  double regions = 0, region_ms = 0, thread_overhead_ms = 0;
  // Global operator new / delete (core/heap_count.h): calls, bytes, time in them.
  bool heap = false;
  double heap_allocs = 0, heap_frees = 0, heap_mb = 0, heap_ms = 0;
  // Growth of the activation arena (core/stack_arena.h): times it took memory from the system.
  bool arena = false;
  double arena_grows = 0, arena_mb = 0;
};

class Profiler {
 public:
  void add(std::string_view name, double ms) {
    auto it = regions_.find(name);
    if (it == regions_.end()) it = regions_.emplace(std::string(name), Entry{}).first;
    it->second.ms += ms;
    it->second.calls += 1;
  }
  // A region that ran from t0 to t1 (now_ms() values): timed, and traced when a trace is set.
  void add_span(std::string_view name, double t0_ms, double t1_ms) {
    add(name, t1_ms - t0_ms);
    if (trace) trace->add(std::string(name), TraceTrack::Compute, t0_ms, t1_ms);
  }
  void clear() {
    regions_.clear();
    overheads = {};
  }
  TraceLog* trace = nullptr;  // optional timeline (core/trace.h), owned by the caller
  // Called at both edges of every region when set: on an asynchronous device, a synchronize,
  // so that each region's time is its device work's (at the cost of the waits it adds).
  std::function<void()> fence;
  StepOverheads overheads;    // filled by the caller (`trex bench step --profile`)
  // Prints regions sorted by name (so children follow parents), with per-step averages.
  void print(FILE* f, int steps, double step_ms) const {
    std::fprintf(f, "%-36s %10s %8s %7s\n", "region", "ms/step", "calls", "share");
    for (const auto& [name, e] : regions_)
      std::fprintf(f, "%-36s %10.1f %8.1f %6.1f%%\n", name.c_str(), e.ms / steps, (double)e.calls / steps,
                   100.0 * e.ms / steps / step_ms);
  }

  // The step in parts that add up to it (per-step averages over `steps` steps of step_ms):
  //  - the trainer's regions (step.*: zero_grads, forward_backward, optimizer) and the rest of
  //    the step outside them (batch sums, the router-bias update, the step's bookkeeping);
  //  - inside step.forward_backward: the model's top-level regions (names with one dot and no
  //    "step." / "layer." prefix: fwd.moe, bwd.mla, head_ce.fwd+bwd, bwd.recompute, ...) and the
  //    time between them (norms, residual adds, the embedding, V4's hyper-connections);
  //  - per decoder layer (layer.NN.fwd / layer.NN.bwd; the backward includes its recompute);
  //  - when set, the overheads (StepOverheads) as "of which:" rows after the total.
  // Sub-regions (fwd.moe.experts, ...) are in print(), not here: they are inside their parents.
  void print_breakdown(FILE* f, int steps, double step_ms) const {
    auto ms = [&](const std::string& n) {
      auto it = regions_.find(n);
      return it == regions_.end() ? 0.0 : it->second.ms / steps;
    };
    auto row = [&](const char* indent, const std::string& name, double v) {
      std::fprintf(f, "%s%-*s %10.1f %6.1f%%\n", indent, (int)(40 - std::strlen(indent)), name.c_str(), v,
                   100.0 * v / step_ms);
    };
    std::fprintf(f, "%-40s %10s %7s\n", "step breakdown (adds up to the step)", "ms/step", "share");
    double trainer = 0;
    for (const char* n : {"step.zero_grads", "step.forward_backward", "step.optimizer"}) {
      row("", n, ms(n));
      trainer += ms(n);
      if (std::string(n) != "step.forward_backward") continue;
      double inner = 0;
      for (const auto& [name, e] : regions_) {
        if (name.rfind("step.", 0) == 0 || name.rfind("layer.", 0) == 0) continue;
        if (std::count(name.begin(), name.end(), '.') != 1) continue;
        row("  ", name, e.ms / steps);
        inner += e.ms / steps;
      }
      row("  ", "between regions (norms, residuals, embedding, hc)", ms(n) - inner);
    }
    row("", "outside the trainer's regions", step_ms - trainer);
    row("", "total", step_ms);
    print_overheads(f, steps, row);
    bool header = false;
    for (const auto& [name, e] : regions_) {
      if (name.rfind("layer.", 0) != 0) continue;
      if (!header) std::fprintf(f, "%-40s %10s %7s\n", "per decoder layer (MTP block k: layer L+k)", "ms/step", "share");
      header = true;
      row("  ", name, e.ms / steps);
    }
  }

 private:
  // "of which:" rows, each with a note line under it (no '%' in the notes: rows end in one).
  template <class Row>
  void print_overheads(FILE* f, int steps, Row& row) const {
    const StepOverheads& o = overheads;
    if (o.threads) {
      row("", "of which: threading overhead in trex parallel regions", o.thread_overhead_ms / steps);
      std::fprintf(f, "    (in %.1f trex parallel regions/step taking %.1f ms/step: fork/join, imbalance, idle\n"
                      "     workers; oneDNN GEMMs on all threads run their own OpenMP regions, not covered)\n",
                   o.regions / steps, o.region_ms / steps);
    }
    if (o.heap) {
      row("", "of which: heap allocations (operator new/delete)", o.heap_ms / steps);
      std::fprintf(f, "    (heap allocations: %.1f calls/step, %.2f ms/step, %.2f MB/step, %.1f deletes/step;\n"
                      "     global operator new/delete only, not malloc in C libraries or oneDNN)\n",
                   o.heap_allocs / steps, o.heap_ms / steps, o.heap_mb / steps, o.heap_frees / steps);
    }
    if (o.arena)
      std::fprintf(f, "    (activation arena growth: %.1f grows/step, %.1f MB/step from the system)\n",
                   o.arena_grows / steps, o.arena_mb / steps);
  }

  struct Entry {
    double ms = 0;
    long calls = 0;
  };
  std::map<std::string, Entry, std::less<>> regions_;  // transparent: find by string_view
};

// A region whose name is made at run time (only when profiling: no string otherwise).
class ProfSpan {
 public:
  template <class MakeName>
  ProfSpan(Profiler* p, MakeName&& make) : p_(p), t0_(p ? now_ms() : 0) {
    if (p_) name_ = make();
  }
  ~ProfSpan() {
    if (p_) p_->add_span(name_, t0_, now_ms());
  }
  ProfSpan(const ProfSpan&) = delete;
  ProfSpan& operator=(const ProfSpan&) = delete;

 private:
  Profiler* p_;
  std::string name_;
  double t0_;
};

// "layer.07.fwd" (decoder layer l, "fwd" or "bwd").
inline std::string layer_region(int64_t l, const char* what) {
  char b[48];
  std::snprintf(b, sizeof b, "layer.%02lld.%s", (long long)l, what);
  return b;
}

class ProfScope {
 public:
  ProfScope(Profiler* p, const char* name) : p_(p), name_(name), t0_(p ? fenced_now(p) : 0) {}
  ~ProfScope() {
    if (p_) p_->add_span(name_, t0_, fenced_now(p_));
  }
  ProfScope(const ProfScope&) = delete;
  ProfScope& operator=(const ProfScope&) = delete;

 private:
  static double fenced_now(Profiler* p) {
    if (p->fence) p->fence();
    return now_ms();
  }
  Profiler* p_;
  const char* name_;
  double t0_;
};

}  // namespace trex
