// Threading overhead of trex's own parallel regions (core/parallel.h), for `trex bench step
// --profile`. A ParStatsScope installs a ParStats for the calling thread; while it is installed,
// every parallel region that thread opens (parallel_for, parallel_dynamic) adds its wall time,
// its team size and the sum of its threads' busy time inside fn. The wall time lost to fork/join,
// imbalance and idle workers is, per region, sum over threads of (wall - busy) / threads, i.e.
// wall - mean busy. With no scope installed (the default) a region costs one thread_local load.
// GEMMs that oneDNN runs on all threads open their own OpenMP regions and are not seen here;
// a GEMM called inside a trex region (grouped_gemm's small experts, one per thread) is its work.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>

namespace trex {

inline int64_t par_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct ParStats {
  std::atomic<int64_t> regions{0};      // parallel regions opened (inline runs are not regions)
  std::atomic<int64_t> wall_ns{0};      // their wall time, fork to join, seen by the caller
  std::atomic<int64_t> overhead_ns{0};  // sum over regions of wall - (sum of busy) / threads

  // One region: wall time, the threads in its team and their summed busy time inside fn.
  void add_region(int64_t wall, int threads, int64_t busy_sum) {
    int64_t lost = wall - (threads > 0 ? busy_sum / threads : 0);
    regions.fetch_add(1, std::memory_order_relaxed);
    wall_ns.fetch_add(wall, std::memory_order_relaxed);
    overhead_ns.fetch_add(lost > 0 ? lost : 0, std::memory_order_relaxed);
  }
  void clear() {
    regions = 0;
    wall_ns = 0;
    overhead_ns = 0;
  }
};

// The calling thread's stats (null: off). Workers never read it: a region reads it once on the
// calling thread and hands the pointer to its threads.
inline ParStats*& par_stats_slot() noexcept {
  static thread_local ParStats* s = nullptr;
  return s;
}
inline ParStats* par_stats() noexcept { return par_stats_slot(); }

// Installs `s` (may be null) for the calling thread for the scope's lifetime.
class ParStatsScope {
 public:
  explicit ParStatsScope(ParStats* s) : prev_(par_stats_slot()) { par_stats_slot() = s; }
  ~ParStatsScope() { par_stats_slot() = prev_; }
  ParStatsScope(const ParStatsScope&) = delete;
  ParStatsScope& operator=(const ParStatsScope&) = delete;

 private:
  ParStats* prev_;
};

}  // namespace trex
