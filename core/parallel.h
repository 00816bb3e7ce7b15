// Threads. trex uses the OpenMP runtime (libgomp) as its thread pool: oneDNN is built against
// the same runtime, so GEMMs and our own kernels share one set of pinned worker threads and
// never oversubscribe the cores. The count comes from the config or TREX_THREADS.
#pragma once
#include <omp.h>
#include <cstdint>
#include <cstdlib>
#include "core/error.h"

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
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace trex
