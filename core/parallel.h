// Threads. trex uses the OpenMP runtime (libgomp) as its thread pool: oneDNN is built against
// the same runtime, so GEMMs and our own kernels share one set of pinned worker threads and
// never oversubscribe the cores. The count comes from the config or TREX_THREADS.
// Under a ParStatsScope (core/par_stats.h: `trex bench step --profile`) each region also records
// its wall time and its threads' busy time; without one a region costs one thread_local load more.
#pragma once
#include <omp.h>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include "core/error.h"
#include "core/par_stats.h"

namespace trex {

// Sets the worker count: n > 0 explicit, else TREX_THREADS, else all hardware threads.
inline int init_threads(int n = 0) {
  if (n <= 0) {
    if (const char* e = std::getenv("TREX_THREADS")) n = std::atoi(e);
  }
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
  omp_set_dynamic(0);
  return n;
}

inline int num_threads() { return omp_get_max_threads(); }

// While alive (and `on`), the regions this thread opens run on it alone. For host code that is
// small next to the work around it: on a device backend the host only routes tokens, and waking
// a team of threads for that cost more than the work (`trex bench step --profile` on a 16-core
// GPU host: 1.7 ms of fork / join and idle workers per region, 90% of the regions' time).
class SerialScope {
 public:
  explicit SerialScope(bool on) : saved_(on ? omp_get_max_threads() : 0) {
    if (on) omp_set_num_threads(1);
  }
  ~SerialScope() {
    if (saved_ > 0) omp_set_num_threads(saved_);
  }
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  int saved_;
};

namespace detail {
// The timed forms of the regions below (only under a ParStatsScope): the caller times fork to
// join, each thread its time inside fn; `st` is captured, workers never read the thread_local.
template <class F>
void parallel_for_timed(ParStats& st, int64_t n, int nt, F& fn) {
  std::atomic<int64_t> busy{0};
  int team = 1;
  const int64_t t0 = par_now_ns();
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), T = omp_get_num_threads();
    if (t == 0) team = T;
    int64_t chunk = (n + T - 1) / T;
    int64_t b = t * chunk, e = b + chunk < n ? b + chunk : n;
    if (b < e) {
      const int64_t b0 = par_now_ns();
      fn(b, e);
      busy.fetch_add(par_now_ns() - b0, std::memory_order_relaxed);
    }
  }
  st.add_region(par_now_ns() - t0, team, busy.load());
}

template <class F>
void parallel_dynamic_timed(ParStats& st, int64_t n, F& fn) {
  std::atomic<int64_t> busy{0};
  int team = 1;
  const int64_t t0 = par_now_ns();
#pragma omp parallel
  {
    if (omp_get_thread_num() == 0) team = omp_get_num_threads();
    int64_t mine = 0;
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b0 = par_now_ns();
      fn(i);
      mine += par_now_ns() - b0;
    }
    busy.fetch_add(mine, std::memory_order_relaxed);
  }
  st.add_region(par_now_ns() - t0, team, busy.load());
}
}  // namespace detail

// fn(begin, end) over [0, n) split into contiguous chunks, one per thread; runs inline when
// n is below `grain` or we are already inside a parallel region.
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  int nt = omp_in_parallel() ? 1 : num_threads();
  if (nt <= 1 || n <= grain) {
    fn(int64_t{0}, n);
    return;
  }
  if (ParStats* st = par_stats()) return detail::parallel_for_timed(*st, n, nt, fn);
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), T = omp_get_num_threads();
    int64_t chunk = (n + T - 1) / T;
    int64_t b = t * chunk, e = b + chunk < n ? b + chunk : n;
    if (b < e) fn(b, e);
  }
}

// fn(i) for each i in [0, n) with dynamic scheduling (uneven work: attention rows, experts).
template <class F>
void parallel_dynamic(int64_t n, F&& fn) {
  if (n <= 0) return;
  if (omp_in_parallel() || num_threads() <= 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  if (ParStats* st = par_stats()) return detail::parallel_dynamic_timed(*st, n, fn);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace trex
